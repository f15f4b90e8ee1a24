"""``spotopt.agent.torch``: the PyTorch example, alone and as 2 DDP processes (gloo), interrupted at
seeded random points (``tests/interruptions.py``) ends bit-identical to an uninterrupted run:
parameters, optimizer state, losses and every step's loss; plus what the examples do not reach
(a grad scaler, extras with ``state_dict``, the sampler's positions, a stop on rank 1 only).
Every job start is a fork of the module's zygote (``tests/zygote.py``); the uninterrupted runs
compared with are new interpreters.

Skips without torch; CI installs ``torch==2.13.0`` (the CPU wheel) so these run there.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.utils.data import DistributedSampler, RandomSampler, SequentialSampler  # noqa: E402

import spotopt.agent  # noqa: E402
from spotopt.agent import torch as agent  # noqa: E402
from spotopt.agent.torch.state import from_bytes, rng_state, set_rng_state, to_bytes, unwrap  # noqa: E402
from spotopt.db.engine import Database  # noqa: E402
from spotopt.mover import jobs as jobstore  # noqa: E402
from tests import mover_world  # noqa: E402
from tests.interruptions import (  # noqa: E402
    MODES,
    TIMEOUT_S,
    ForkingProvider,
    Interrupt,
    interrupted,
    log_lines,
    provider,
    rank_pid,
    uninterrupted,
)
from tests.stores import moto_s3  # noqa: E402
from tests.zygote import Zygote, exit_code  # noqa: E402

__all__ = ["interrupted", "moto_s3", "provider"]

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"
SCRIPTS = {"single": EXAMPLES / "train_torch.py", "ddp": EXAMPLES / "launch_ddp.py"}
STEPS = 120
STEP_DELAY_S = 0.01


@pytest.fixture(scope="module")
def zygote_preload() -> tuple[Path | str, ...]:
    """The jobs here start as forks of one process that has imported what the examples import."""
    return (*SCRIPTS.values(), "torch._inductor")


def _cases(
    seed: int, variant: str, stores: dict[str, tuple[str, ...]]
) -> list[tuple[str, str, tuple, tuple]]:
    """One job per store, interrupted in each of its modes in a random order at random steps (a
    process start per interruption: fewer starts than a job per mode, every mode still covered)."""
    rng = random.Random(seed)
    cases = []
    for store, modes in stores.items():
        order = rng.sample(modes, len(modes))
        steps = sorted(rng.sample(range(5, STEPS - 30, 3), len(order)))
        cases.append((variant, store, tuple(order), tuple(steps)))
    return cases


CASES = _cases(23, "single", {"file": MODES, "s3": ("sigterm", "control")}) + _cases(
    32, "ddp", {"file": ("sigkill", "sigterm", "control"), "s3": ("gcp",)}
)


def _command(variant: str, out: Path, log: Path, *extra: str) -> list[str]:
    launcher = [sys.executable, str(SCRIPTS[variant])]
    if variant == "ddp":
        launcher += ["--nproc", "2", str(SCRIPTS["single"]), "--"]
    return [*launcher, "--steps", str(STEPS), "--out", str(out), "--log", str(log), *extra]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}


Result = tuple[dict[str, Any], dict[str, Any], Any, dict[int, str]]


def _result(out: Path, log: Path) -> Result:
    return (
        torch.load(out / "model.pt"),
        torch.load(out / "optimizer.pt"),
        torch.load(out / "losses.pt"),
        dict(log_lines(log)),
    )


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Result]]:
    """The uninterrupted runs (``interruptions.uninterrupted``), made on first use."""
    made: dict[str, Result] = {}

    def reference(variant: str) -> Result:
        if variant not in made:
            work = uninterrupted(
                tmp_path_factory, f"torch-{variant}", lambda w: _command(variant, w / "out", w / "log")
            )
            made[variant] = _result(work / "out", work / "log")
        return made[variant]

    yield reference  # type: ignore[misc]


def assert_same_weights(got: tuple[Any, Any], want: tuple[Any, Any]) -> None:
    """Model and optimizer state dicts equal bit for bit (the trainer callbacks' tests use it too)."""
    (model, optimizer), (want_model, want_optimizer) = got, want
    assert model.keys() == want_model.keys()
    assert all(torch.equal(model[k], want_model[k]) for k in model)
    assert optimizer["param_groups"] == want_optimizer["param_groups"]
    assert optimizer["state"].keys() == want_optimizer["state"].keys()
    for index, state in optimizer["state"].items():
        assert all(torch.equal(state[k], want_optimizer["state"][index][k]) for k in state)


def _assert_identical(got: Result, want: Result) -> None:
    model, optimizer, losses, trajectory = got
    assert_same_weights((model, optimizer), want[:2])
    assert torch.equal(losses, want[2])
    mismatched = [(s, h) for s, h in trajectory.items() if want[3][s] != h]
    assert not mismatched, f"steps whose loss differs from the uninterrupted run: {mismatched[:5]}"


@pytest.mark.parametrize(("variant", "store_kind", "modes", "kill_steps"), CASES)
def test_an_interrupted_torch_job_resumes_bit_identical(
    interrupted: Interrupt,
    references: Any,
    variant: str,
    store_kind: str,
    modes: tuple[str, ...],
    kill_steps: tuple[int, ...],
) -> None:
    out, log = interrupted(
        store_kind, modes, kill_steps, lambda o, g: _command(variant, o, g, "--step-delay", str(STEP_DELAY_S))
    )
    _assert_identical(_result(out, log), references(variant))


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="finds rank 1's pid through /proc")
def test_a_sigterm_on_rank_1_alone_stops_every_rank_at_the_same_step(
    tmp_path: Path, zygote: Zygote, references: Any
) -> None:
    """Standalone (no spotopt environment): rank 1 alone gets SIGTERM, every rank stops at one
    step, rank 0 saved it, and the next run ends as the uninterrupted one."""
    out, log = tmp_path / "out", tmp_path / "log"
    command = _command("ddp", out, log, "--step-delay", str(STEP_DELAY_S))
    for run in ("stopped", "resumed"):
        home = tmp_path / run
        home.mkdir()
        with zygote.running(command, env=_clean_env(), cwd=tmp_path, home=home) as runner:
            if run == "stopped":
                deadline = time.monotonic() + TIMEOUT_S
                while not any(s >= 30 for s, _ in log_lines(log)):
                    assert time.monotonic() < deadline, "the job never reached step 30"
                    time.sleep(0.02)
                os.kill(rank_pid(runner, 1), signal.SIGTERM)
            code = exit_code(home, TIMEOUT_S)
        output = (home / "output").read_text()
        assert code == 0, output
        if run == "stopped":
            assert "(SIGTERM on rank 1)" in output
            stopped = max(s for s, _ in log_lines(log))
            assert f"newest verified checkpoint: {stopped:012d}-" in output  # rank 0 saved where all stopped
    _assert_identical(_result(out, log), references("ddp"))


@pytest.fixture
def fresh_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A standalone agent of this process on a store in ``tmp_path``; SIGTERM handling put back."""
    for name in [k for k in os.environ if k.startswith("SPOTOPT_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SPOTOPT_CHECKPOINT_URI", f"file://{tmp_path / 'store'}")
    monkeypatch.setenv("SPOTOPT_SCRATCH_DIR", str(tmp_path / "scratch"))
    monkeypatch.setattr(spotopt.agent, "_agent", None)
    before = signal.getsignal(signal.SIGTERM)
    yield tmp_path
    signal.signal(signal.SIGTERM, before)


class Counter:
    """User state restored in place through ``load_state_dict``."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seen = state["seen"]


def _parts() -> dict[str, Any]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": torch.optim.lr_scheduler.ExponentialLR(optimizer, 0.9),
        "scaler": torch.amp.GradScaler("cpu", init_scale=1024.0),
        "extra": {"counter": Counter(), "note": "fresh"},
    }


def _train(parts: dict[str, Any], steps: int) -> None:
    for _ in range(steps):
        x = torch.randn(8, 4) + float(np.random.normal()) + random.random()
        loss = parts["model"](x).square().mean()
        parts["optimizer"].zero_grad()
        parts["scaler"].scale(loss).backward()
        parts["scaler"].step(parts["optimizer"])
        parts["scaler"].update()
        parts["scheduler"].step()
        parts["extra"]["counter"].seen += 1


def _assert_same_tensors(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            _assert_same_tensors(a[key], b[key])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_tensors(x, y)
    else:
        assert a == b


def test_resume_restores_every_part_and_every_generator(fresh_agent: Path) -> None:
    torch.manual_seed(1)
    first = _parts()
    assert agent.resume(**first) == 0
    _train(first, 3)
    first["extra"]["note"] = "after 3"
    assert agent.step(3, **first) is False  # no checkpoint due yet (standalone: Young/Daly, hours)
    agent.finish(**first)  # writes step 3: newer than any checkpoint
    expected_draws = (torch.rand(3), np.random.random(), random.random())

    spotopt.agent._agent = None  # a new process, as far as the agent knows
    torch.manual_seed(2)
    second = _parts()
    assert agent.resume(**second) == 3
    for name in ("model", "optimizer"):
        _assert_same_tensors(first[name].state_dict(), second[name].state_dict())
    assert second["scheduler"].last_epoch == 3 and second["scaler"].get_scale() == first["scaler"].get_scale()
    assert second["extra"]["counter"].seen == 3 and second["extra"]["note"] == "after 3"
    assert torch.equal(torch.rand(3), expected_draws[0])
    assert (np.random.random(), random.random()) == expected_draws[1:]


def test_a_checkpoint_without_a_scheduler_is_not_silently_resumed_with_one(fresh_agent: Path) -> None:
    parts = _parts()
    del parts["scheduler"]
    agent.resume(**parts)
    agent.step(1, **parts)
    agent.finish(**parts)
    spotopt.agent._agent = None
    with pytest.raises(RuntimeError, match="without a scheduler; pass scheduler=None"):
        agent.resume(**_parts())


def test_generators_round_trip_through_the_checkpoint_file() -> None:
    state = from_bytes(to_bytes({"format": 1, "rng": rng_state()}))["rng"]  # weights_only load
    draws = (torch.randn(4), np.random.standard_normal(3), random.random())
    set_rng_state(state, pytest.fail)
    assert torch.equal(torch.randn(4), draws[0])
    assert np.array_equal(np.random.standard_normal(3), draws[1]) and random.random() == draws[2]


def test_a_wrapped_model_saves_the_bare_module_s_keys() -> None:
    model = torch.nn.Linear(2, 2)
    assert unwrap(torch.nn.DataParallel(model)) is model
    assert set(unwrap(torch.nn.DataParallel(model)).state_dict()) == {"weight", "bias"}


def test_the_sampler_position_follows_the_step() -> None:
    data = list(range(10))
    inner = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=5)
    sampler = agent.ResumableSampler(inner, batch_size=3)
    assert sampler.batches_per_epoch == 4
    uninterrupted = []
    for epoch in range(3):
        assert sampler.at(epoch * 4) == epoch
        uninterrupted.append(list(sampler))
    assert uninterrupted[0] != uninterrupted[1]  # shuffled per epoch
    assert sampler.at(6) == 1 and list(sampler) == uninterrupted[1][6:]  # 2 batches of epoch 1 done
    assert list(sampler) == uninterrupted[2]  # the next iteration: the next epoch, whole
    assert list(agent.ResumableSampler(SequentialSampler(data), 3, drop_last=True)) == data
    with pytest.raises(ValueError, match="sampler: a RandomSampler"):
        agent.ResumableSampler(RandomSampler(data), 3)


def test_the_cases_cover_every_mode_both_variants_and_s3() -> None:
    single_file = [m for v, s, modes, _ in CASES if (v, s) == ("single", "file") for m in modes]
    assert sorted(single_file) == sorted(MODES)
    assert {(v, s) for v, s, _, _ in CASES} == {
        ("single", "file"),
        ("single", "s3"),
        ("ddp", "file"),
        ("ddp", "s3"),
    }


def test_the_daemon_moves_the_torch_job_and_it_ends_identical(
    sqlite_db: Database, tmp_path: Path, zygote: Zygote
) -> None:
    """A managed job through the daemon on the local provider: a cheaper market draws a
    make-before-break move (the old placement checkpoints on the daemon's request, the new one
    resumes from it), and the result equals the uninterrupted run's."""
    provider = ForkingProvider(tmp_path / "local", zygote, grace_s=5.0)
    world = mover_world.make_world(sqlite_db, tmp_path, provider=provider)
    try:
        world.prices(*world.markets.history())
        jobstore.submit(world.db, mover_world.job_yaml(tmp_path, script=SCRIPTS["single"]))
        world.hold("mlp", 150)
        world.daemon.tick()
        world.until("step 150", lambda: world.job().state == "running" and world.job().steps >= 150)
        world.prices(world.markets.drop())
        assert [d["kind"] for d in world.daemon.tick().decisions] == ["move"]
        world.until("the lease to move", lambda: world.moves()[-1].step == "confirm")
        world.hold("mlp", 300)
        world.until("the move to finish", lambda: world.moves()[-1].outcome is not None)
        assert world.moves()[-1].outcome == "done" and world.moves()[-1].checkpoint_step == 150
        world.release("mlp")
        world.until("the job to finish", lambda: world.job().state == "done")
    finally:
        world.stop_all()
    reference = tmp_path / "reference"
    command = [
        sys.executable,
        str(SCRIPTS["single"]),
        "--steps",
        str(mover_world.STEPS),
        "--out",
        str(reference),
    ]
    subprocess.run(command, cwd=tmp_path, env=_clean_env(), check=True, timeout=TIMEOUT_S)
    none = tmp_path / "no-log"
    _assert_identical(_result(tmp_path / "mlp-out", none), _result(reference, none))


def test_the_agents_own_work_leaves_every_generator_where_it_was() -> None:
    """Opening an S3 store imports libraries that draw from the global generators (httpx imports
    rich, whose styles draw an id): the agent's work must not move the training's streams."""
    from spotopt.agent.torch.state import rng_kept

    def draws() -> tuple[float, float, float]:
        return random.random(), float(np.random.random()), float(torch.rand(1))

    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    want = draws()
    random.seed(3), np.random.seed(3), torch.manual_seed(3)
    with rng_kept():
        draws()
        random.seed(99)
    assert draws() == want
