"""Run a training command as a local job, interrupting it at given steps, until it finishes.

Shared by the NumPy example's interruption tests and the PyTorch ones. Interruptions: SIGKILL
(the process group, no warning), SIGTERM (``terminate``), a cloud preemption notice served by the
fake metadata endpoint (AWS, GCP, Azure), the daemon's checkpoint-and-stop request, and the local
provider's ``preempt``. The command must append ``<step> <loss hex> <epoch>`` per step to a log;
the driver waits for the log to reach a kill step, then interrupts. Where exactly an
interruption lands depends on timing, but what the tests assert holds wherever it lands. One run
may mix modes, one per kill step: a job interrupted in several ways in turn.

A test module that overrides the ``zygote_preload`` fixture (``tests/conftest.py``) gets a
``provider`` whose instances are forks of its zygote (``tests/zygote.py``) instead of new
interpreters: the PyTorch modules, whose every start would otherwise import torch for seconds.
The result each job must match (``uninterrupted``) is always run in a new interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

import pytest
from filelock import FileLock

from spotopt.checkpoints import RequestKind, grant_lease, read_acknowledgement, send_request
from spotopt.clouds.common.base import InstanceState, LaunchSpec
from spotopt.clouds.local.provider import LocalProvider
from spotopt.types import MarketKey, MarketKind
from tests.fake_metadata import FakeMetadata
from tests.stores import StoreUnderTest, store_for
from tests.zygote import Zygote, exit_code

MARKET = MarketKey("local", "local", None, "process", MarketKind.SPOT)
MODES = ("sigkill", "sigterm", "aws", "gcp", "azure", "control", "preempt")
CLOUDS = ("aws", "gcp", "azure")
RANK_1_SIGTERM = "sigterm-rank-1"
"""For a job of several processes: SIGTERM to rank 1 alone (the others learn of it from the agent)."""
GENTLE = {"sigterm", "aws", "gcp", "azure", "control", "preempt", RANK_1_SIGTERM}
"""Modes that let the agent checkpoint and stop: the process must exit 0."""
TIMEOUT_S = 60.0
TIMING = {
    "file": {"checkpoint_every_s": 0.05, "SPOTOPT_POLL_EVERY": "0.02s", "SPOTOPT_HEARTBEAT_EVERY": "0.1s"},
    "s3": {"checkpoint_every_s": 0.3, "SPOTOPT_POLL_EVERY": "0.05s", "SPOTOPT_HEARTBEAT_EVERY": "0.5s"},
    "az": {"checkpoint_every_s": 0.3, "SPOTOPT_POLL_EVERY": "0.05s", "SPOTOPT_HEARTBEAT_EVERY": "0.5s"},
}
"""Every HTTP round-trip to moto or Azurite costs milliseconds: poll them less."""


class ForkingProvider(LocalProvider):
    """The local provider whose instances are forks of a zygote (``tests/zygote.py``) rather than
    new interpreters: the same runner's part, the same script, a start without the imports."""

    def __init__(self, state_dir: Path, zygote: Zygote, grace_s: float) -> None:
        super().__init__(state_dir, grace_s=grace_s)
        self.zygote = zygote

    def _start(
        self, home: Path, spec: LaunchSpec, env: Mapping[str, str], log: BinaryIO, alive: BinaryIO
    ) -> int:
        return self.zygote.spawn(
            spec.command, env=env, cwd=spec.workdir, home=home, output=log.fileno(), keep=(alive.fileno(),)
        )


@pytest.fixture
def provider(tmp_path: Path, zygote: Zygote | None) -> Iterator[LocalProvider]:
    """The local provider; its instances forked from the module's ``zygote`` if it has one."""
    state = tmp_path / "state"
    made = (
        LocalProvider(state, grace_s=TIMEOUT_S)
        if zygote is None
        else ForkingProvider(state, zygote, TIMEOUT_S)
    )
    yield made
    for instance in made.list_instances():
        made.terminate(instance.instance_id, grace_s=0)


def uninterrupted(
    factory: pytest.TempPathFactory,
    name: str,
    command: Callable[[Path], Sequence[str]],
    zygote: Zygote | None = None,
) -> Path:
    """The folder of a run of ``command(folder)`` start to end with no spotopt environment
    (standalone: it checkpoints into the folder): what an interrupted job must end identical to.
    A new interpreter, or with ``zygote`` a fork of it (only where a new interpreter's result is
    already pinned to a fork's by another reference). Made once per test session, also across
    xdist workers (a lock in the folder they share), so each reference costs one start."""
    shared = factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:  # each worker's folder is in the session's
        shared = shared.parent
    work = shared / f"uninterrupted-{name}"
    with FileLock(f"{work}.lock"):
        if not (work / "done").exists():
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir()
            env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
            if zygote is None:
                subprocess.run(command(work), cwd=work, env=env, check=True, timeout=TIMEOUT_S)
            else:
                with zygote.running(command(work), env=env, cwd=work, home=work):
                    code = exit_code(work, TIMEOUT_S)
                assert code == 0, (work / "output").read_text()
            (work / "done").touch()
    return work


def rank_pid(leader: int, rank: int) -> int:
    """The pid of ``rank`` of a job of several processes whose launcher (``launch_ddp.py``) the
    process-group leader ``leader`` started: the runner's one child, whose children are the
    ranks in rank order (read from /proc)."""
    (launcher,) = _children(leader)
    return _children(launcher)[rank]


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def log_lines(log: Path) -> list[tuple[int, str]]:
    """(step, loss hex) of every line the job logged, in order, repeats after a resume included."""
    if not log.exists():
        return []
    lines = [line.split() for line in log.read_text().splitlines()]
    return [(int(s), h) for s, h, _epoch in lines]


def wait(
    provider: LocalProvider, iid: str, what: str, log: Path | None = None, step: int = 0, seen: int = 0
) -> None:
    """Until the instance ends, or (with ``log``) until it logs ``step`` after line ``seen``."""
    deadline = time.monotonic() + TIMEOUT_S
    while provider.status(iid).state.is_live:
        if log is not None and any(s >= step for s, _ in log_lines(log)[seen:]):
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}; job log:\n{provider.log_path(iid).read_text()}")
        time.sleep(0.02)


Interrupt = Callable[
    [str, str | Sequence[str], Sequence[int], Callable[[Path, Path], Sequence[str]]], tuple[Path, Path]
]


@pytest.fixture
def interrupted(request: pytest.FixtureRequest, tmp_path: Path, provider: LocalProvider) -> Interrupt:
    """``interrupted(store_kind, mode, kill_steps, command_for) -> (out, log)``: a fresh store of
    ``store_kind``, the job ``command_for(out, log)`` run through ``run_interrupted``."""

    def run(
        store_kind: str,
        mode: str | Sequence[str],
        kill_steps: Sequence[int],
        command_for: Callable[[Path, Path], Sequence[str]],
    ) -> tuple[Path, Path]:
        store = store_for(store_kind, request, tmp_path)
        out, log = tmp_path / "out", tmp_path / "steps.log"
        run_interrupted(
            request, provider, store, store_kind, "train", command_for(out, log), log, mode, kill_steps
        )
        return out, log

    return run


def run_interrupted(
    request: pytest.FixtureRequest,
    provider: LocalProvider,
    store: StoreUnderTest,
    store_kind: str,
    job: str,
    command: Sequence[str],
    log: Path,
    mode: str | Sequence[str],
    kill_steps: Sequence[int],
) -> None:
    """Launch ``command`` as ``job``, interrupt it in ``mode`` (one for all, or one per step) at
    each of ``kill_steps``, relaunch it each time under a new lease, and let the last run finish
    (it must exit 0)."""
    loc = store.location()
    modes = [mode] * len(kill_steps) if isinstance(mode, str) else list(mode)
    assert len(modes) == len(kill_steps), "one mode per kill step"
    metadata = FakeMetadata() if set(modes) & set(CLOUDS) else None
    if metadata is not None:
        metadata._thread.start()
        request.addfinalizer(metadata.server.shutdown)
    for kill_step, mode in zip((*kill_steps, None), (*modes, None), strict=True):
        lease = grant_lease(loc, job, datetime.now(UTC))
        timing = dict(TIMING[store_kind])
        every = float(timing.pop("checkpoint_every_s"))
        env = {k: str(v) for k, v in timing.items()}
        if metadata is not None and mode in CLOUDS:
            env |= {"SPOTOPT_CLOUD": mode, f"SPOTOPT_{mode.upper()}_METADATA_URL": metadata.url}
        spec = LaunchSpec(
            job,
            lease.epoch,
            tuple(command),
            store.url,
            store.storage_options,
            checkpoint_every_s=every,
            env=env,
        )
        iid = provider.launch(spec, MARKET, f"{job}-{lease.epoch}").instance_id
        if kill_step is None:
            wait(provider, iid, "the last run to end")
            assert provider.status(iid).exit_code == 0, provider.log_path(iid).read_text()
            break
        wait(provider, iid, f"step {kill_step}", log, kill_step, len(log_lines(log)))
        if mode == "sigkill":
            pid = json.loads((provider.state_dir / "instances" / iid / "record.json").read_text())["pid"]
            os.killpg(pid, signal.SIGKILL)
        elif mode == "sigterm":
            provider.terminate(iid)
        elif mode == RANK_1_SIGTERM:
            leader = json.loads((provider.state_dir / "instances" / iid / "record.json").read_text())["pid"]
            os.kill(rank_pid(leader, 1), signal.SIGTERM)
        elif mode == "preempt":
            provider.preempt(iid, notice_s=TIMEOUT_S)
        elif mode == "control":
            sent = send_request(loc, job, lease.epoch, RequestKind.CHECKPOINT_AND_STOP, datetime.now(UTC))
        else:
            assert metadata is not None
            metadata.notify(mode)
        wait(provider, iid, f"the {mode} interruption to end the run")
        status = provider.status(iid)
        if mode in GENTLE:
            assert status.exit_code == 0, provider.log_path(iid).read_text()
        if mode == "control" and "stopped at step" in provider.log_path(iid).read_text():
            assert read_acknowledgement(loc, job, sent.id) is not None
        if metadata is not None:  # the next placement is a new instance: no notice pending there
            metadata.clear()
        assert status.state in (InstanceState.EXITED, InstanceState.TERMINATED, InstanceState.PREEMPTED)
    assert len(provider.list_instances(job=job)) == len(kill_steps) + 1
