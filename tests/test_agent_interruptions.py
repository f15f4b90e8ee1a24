"""The NumPy example job interrupted at seeded random points and resumed through the local provider.

Every case must end with bit-identical weights and the same loss trajectory as an uninterrupted
run. The interruptions and how they are driven: ``tests/interruptions.py``. Kill points are
steps drawn from a seeded RNG.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.interruptions import MODES, TIMEOUT_S, Interrupt, interrupted, log_lines, provider
from tests.stores import azurite, moto_s3

__all__ = ["azurite", "interrupted", "moto_s3", "provider"]

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "examples" / "train_numpy.py"
STEPS = 60
STEP_DELAY_S = 0.003


def _cases(seed: int, count: int, store: str) -> list[tuple[str, str, tuple[int, ...]]]:
    rng = random.Random(seed)
    cases = []
    for i in range(count):
        kills = 1 if rng.random() < 0.85 else 2
        cases.append((store, MODES[i % len(MODES)], tuple(sorted(rng.sample(range(5, STEPS - 25), kills)))))
    return cases


CASES = _cases(2026, 98, "file") + _cases(7, 7, "s3") + _cases(11, 7, "az")


def _command(out: Path, log: Path) -> tuple[str, ...]:
    return (
        sys.executable,
        str(SCRIPT),
        "--steps",
        str(STEPS),
        "--out",
        str(out),
        "--log",
        str(log),
        "--step-delay",
        str(STEP_DELAY_S),
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes, dict[int, str]]:
    """The uninterrupted run (standalone: no provider, no environment)."""
    work = tmp_path_factory.mktemp("reference")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    subprocess.run(
        [*_command(work / "out", work / "log")[:-2]], cwd=work, env=env, check=True, timeout=TIMEOUT_S
    )
    return _result(work / "out", work / "log")


def _result(out: Path, log: Path) -> tuple[str, bytes, dict[int, str]]:
    weights = hashlib.sha256((out / "weights.npy").read_bytes()).hexdigest()
    losses = (out / "losses.npy").read_bytes()
    return weights, losses, dict(log_lines(log))


@pytest.mark.parametrize(("store_kind", "mode", "kill_steps"), CASES)
def test_an_interrupted_job_resumes_to_bit_identical_weights(
    interrupted: Interrupt,
    reference: tuple[str, bytes, dict[int, str]],
    store_kind: str,
    mode: str,
    kill_steps: tuple[int, ...],
) -> None:
    out, log = interrupted(store_kind, mode, kill_steps, _command)
    weights, losses, trajectory = reference
    got_weights, got_losses, _ = _result(out, log)
    assert got_weights == weights
    assert got_losses == losses
    mismatched = [(s, h) for s, h in log_lines(log) if trajectory[s] != h]
    assert not mismatched, f"steps whose loss differs from the uninterrupted run: {mismatched[:5]}"


def test_there_are_at_least_100_interruption_runs() -> None:
    assert len(CASES) >= 100 and {m for _, m, _ in CASES} == set(MODES)
