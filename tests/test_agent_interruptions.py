"""The example job interrupted at seeded random points and resumed through the local provider.

Every case must end with bit-identical weights and the same loss trajectory as an uninterrupted
run. Interruptions: SIGKILL (the process group, no warning), SIGTERM (``terminate``), a cloud
preemption notice served by a fake metadata endpoint (AWS, GCP, Azure), the daemon's
checkpoint-and-stop request, and the local provider's ``preempt``. Kill points are steps drawn
from a seeded RNG; the test waits for the job's log to reach the step, then interrupts. Where
exactly the interruption lands depends on timing, but the assertions hold wherever it lands,
so no outcome depends on timing.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotopt.checkpoints import RequestKind, grant_lease, read_acknowledgement, send_request
from spotopt.providers.base import InstanceState, LaunchSpec
from spotopt.providers.local import LocalProvider
from spotopt.types import MarketKey, MarketKind
from tests.fake_metadata import FakeMetadata
from tests.stores import azurite, moto_s3, store_for

__all__ = ["azurite", "moto_s3"]

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "examples" / "train_numpy.py"
STEPS = 60
STEP_DELAY_S = 0.003
JOB = "train"
MARKET = MarketKey("local", "local", None, "process", MarketKind.SPOT)
MODES = ("sigkill", "sigterm", "aws", "gcp", "azure", "control", "preempt")
GENTLE = {"sigterm", "aws", "gcp", "azure", "control", "preempt"}
"""Modes that let the agent checkpoint and stop: the process must exit 0."""
TIMEOUT_S = 60.0
TIMING = {
    "file": {"checkpoint_every_s": 0.05, "SPOTOPT_POLL_EVERY": "0.02s", "SPOTOPT_HEARTBEAT_EVERY": "0.1s"},
    "s3": {"checkpoint_every_s": 0.3, "SPOTOPT_POLL_EVERY": "0.05s", "SPOTOPT_HEARTBEAT_EVERY": "0.5s"},
    "az": {"checkpoint_every_s": 0.3, "SPOTOPT_POLL_EVERY": "0.05s", "SPOTOPT_HEARTBEAT_EVERY": "0.5s"},
}
"""Every HTTP round-trip to moto or Azurite costs milliseconds: poll them less."""


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
    import subprocess

    subprocess.run(
        [*_command(work / "out", work / "log")[:-2]], cwd=work, env=env, check=True, timeout=TIMEOUT_S
    )
    return _result(work / "out", work / "log")


def _result(out: Path, log: Path) -> tuple[str, bytes, dict[int, str]]:
    weights = hashlib.sha256((out / "weights.npy").read_bytes()).hexdigest()
    losses = (out / "losses.npy").read_bytes()
    return weights, losses, dict(_log_lines(log))


def _log_lines(log: Path) -> list[tuple[int, str]]:
    if not log.exists():
        return []
    lines = [line.split() for line in log.read_text().splitlines()]
    return [(int(s), h) for s, h, _epoch in lines]


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[LocalProvider]:
    made = LocalProvider(tmp_path / "state", grace_s=TIMEOUT_S)
    yield made
    for instance in made.list_instances():
        made.terminate(instance.instance_id, grace_s=0)


def _wait(
    provider: LocalProvider, iid: str, what: str, log: Path | None = None, step: int = 0, seen: int = 0
) -> None:
    """Until the instance ends, or (with ``log``) until it logs ``step`` after line ``seen``."""
    deadline = time.monotonic() + TIMEOUT_S
    while provider.status(iid).state.is_live:
        if log is not None and any(s >= step for s, _ in _log_lines(log)[seen:]):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; job log:\n{provider.log_path(iid).read_text()}")
        time.sleep(0.02)


@pytest.mark.parametrize(("store_kind", "mode", "kill_steps"), CASES)
def test_an_interrupted_job_resumes_to_bit_identical_weights(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    provider: LocalProvider,
    reference: tuple[str, bytes, dict[int, str]],
    store_kind: str,
    mode: str,
    kill_steps: tuple[int, ...],
) -> None:
    store = store_for(store_kind, request, tmp_path)
    loc = store.location()
    out, log = tmp_path / "out", tmp_path / "steps.log"
    metadata = FakeMetadata() if mode in ("aws", "gcp", "azure") else None
    if metadata is not None:
        metadata._thread.start()
        request.addfinalizer(metadata.server.shutdown)
    for kill_step in (*kill_steps, None):
        lease = grant_lease(loc, JOB, datetime.now(UTC))
        timing = dict(TIMING[store_kind])
        every = float(timing.pop("checkpoint_every_s"))
        env = {k: str(v) for k, v in timing.items()}
        if metadata is not None:
            env |= {"SPOTOPT_CLOUD": mode, f"SPOTOPT_{mode.upper()}_METADATA_URL": metadata.url}
        spec = LaunchSpec(
            JOB,
            lease.epoch,
            _command(out, log),
            store.url,
            store.storage_options,
            checkpoint_every_s=every,
            env=env,
        )
        instance = provider.launch(spec, MARKET, f"{JOB}-{lease.epoch}")
        iid = instance.instance_id
        if kill_step is None:
            _wait(provider, iid, "the last run to end")
            assert provider.status(iid).exit_code == 0, provider.log_path(iid).read_text()
            break
        seen = len(_log_lines(log))
        _wait(provider, iid, f"step {kill_step}", log, kill_step, seen)
        if mode == "sigkill":
            pid = json.loads((provider.state_dir / "instances" / iid / "record.json").read_text())["pid"]
            os.killpg(pid, signal.SIGKILL)
        elif mode == "sigterm":
            provider.terminate(iid)
        elif mode == "preempt":
            provider.preempt(iid, notice_s=TIMEOUT_S)
        elif mode == "control":
            sent = send_request(loc, JOB, lease.epoch, RequestKind.CHECKPOINT_AND_STOP, datetime.now(UTC))
        else:
            assert metadata is not None
            metadata.notify(mode)
        _wait(provider, iid, f"the {mode} interruption to end the run")
        status = provider.status(iid)
        if mode in GENTLE:
            assert status.exit_code == 0, provider.log_path(iid).read_text()
        if mode == "control" and "stopped at step" in provider.log_path(iid).read_text():
            assert read_acknowledgement(loc, JOB, sent.id) is not None
        if metadata is not None:  # the next placement is a new instance: no notice pending there
            metadata.aws_action, metadata.gcp_preempted, metadata.azure_events = None, False, []
        assert status.state in (InstanceState.EXITED, InstanceState.TERMINATED, InstanceState.PREEMPTED)
    weights, losses, _ = reference
    got_weights, got_losses, _ = _result(out, log)
    assert got_weights == weights
    assert got_losses == losses
    trajectory = reference[2]
    mismatched = [(s, h) for s, h in _log_lines(log) if trajectory[s] != h]
    assert not mismatched, f"steps whose loss differs from the uninterrupted run: {mismatched[:5]}"
    assert len(provider.list_instances(job=JOB)) == len(kill_steps) + 1


def test_there_are_at_least_100_interruption_runs() -> None:
    assert len(CASES) >= 100 and {m for _, m, _ in CASES} == set(MODES)
