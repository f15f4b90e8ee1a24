"""The ``local`` provider: each instance is a real process group on this machine (Linux).

State lives under ``state_dir/instances/<instance id>/``: ``record.json`` (job, epoch, market,
key, pid and the process's start time in clock ticks since boot, so a reused pid is never
mistaken for ours), ``log`` (the job's stdout and stderr), ``exit_code`` (written by
``RUNNER``) and ``notice`` (written by ``notify``). A restarted daemon builds a new
``LocalProvider`` on the same directory and finds every instance again.

A ``capacity`` callable stands in for a cloud's spot capacity (the daemon's replay hands it the
recorded availability): a new launch on a market it says is out raises
``CapacityUnavailableError``, as a cloud's capacity error does.

The instance id is derived from the idempotency key, and launches are serialised by a file
lock, so the same key launches one process even from two processes at once. The record is
written before the process starts and completed with its pid right after. A crash in between
leaves a record without a pid and perhaps a process already running: the next launch with that
key must adopt it, never start a second trainer beside it. So the launching process takes an
``flock`` on the instance's ``alive.lock`` before it forks and hands that open file to the
child, which keeps it locked for as long as any process of the instance lives (a lock held by a
dead launcher is released by the kernel); the runner's first act writes its pid to ``pid``. The
next launch finds the lock free (nothing started: it starts the process) or held (it waits for
``pid`` and adopts that process).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock

from spotopt.clouds.common.base import (
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    agent_environment,
    market_label,
    matches,
    sorted_instances,
)
from spotopt.errors import CapacityUnavailableError, ProviderError
from spotopt.types import MarketKey, MarketKind

RUNNER = (
    'echo $$ > "$0/pid.tmp" && mv "$0/pid.tmp" "$0/pid"; trap : TERM INT; "$@"; code=$?; '
    'echo "$code" > "$0/exit_code.tmp" && mv "$0/exit_code.tmp" "$0/exit_code"; exit "$code"'
)
"""``sh -c RUNNER INSTANCE_DIR COMMAND…``: the process-group leader that says its pid at once (a
launcher killed before recording it is succeeded by one that adopts it) and records the
command's status.

A restarted daemon is not the job's parent and cannot ``wait`` for it, so this shell waits and
writes the status (``128 + signal`` when a signal ended it, 127 when the program is missing)
where any later process can read it. Its ``:`` trap lets it outlive the group's SIGTERM (POSIX
runs the trap only after the foreground command ends) while, unlike an ignored signal, leaving
the command's own SIGTERM handling at the default. SIGKILL ends both and leaves no file.
"""
LOCAL_MARKET = MarketKey("local", "local", None, "process", MarketKind.ON_DEMAND)
"""The one market of this machine: processes are never taken back unless ``preempt`` says so."""
WAIT_STEP_S = 0.02
KILL_WAIT_S = 10.0
ADOPT_WAIT_S = 10.0
"""How long a launch waits for the pid of a process a killed launcher started (it is written
by the runner's first command, so only a machine under heavy load takes more than moments)."""


def group_members(pgid: int) -> list[int]:
    """Pids of the processes of process group ``pgid`` that have not ended (zombies excluded),
    read from /proc."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text(encoding="utf-8").rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            live.append(int(stat.parent.name))
    return live


def _proc_start_ticks(pid: int) -> tuple[str, int] | None:
    """(state letter, start time in ticks since boot) from /proc, or None if there is no such pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])


class LocalProvider:
    """Runs jobs as local subprocesses; see the module docstring for the state directory."""

    name = "local"
    runs_on_market = False

    def __init__(
        self,
        state_dir: str | Path,
        grace_s: float = 30.0,
        capacity: Callable[[MarketKey], bool] | None = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.grace_s = grace_s
        self.capacity = capacity
        (self.state_dir / "instances").mkdir(parents=True, exist_ok=True)
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # -- Provider ---------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        """Start ``spec.command`` in its own process group; the same key returns the same instance."""
        if not spec.command:
            raise ProviderError(f"job {spec.job}: the launch spec has no command")
        instance_id = "local-" + hashlib.sha256(idempotency_key.encode()).hexdigest()[:16]
        with FileLock(str(self.state_dir / "launch.lock")):
            record = self._read(instance_id)
            if record is not None and record.get("pid") is None:
                record = self._adopt(record)
            if record is not None and record.get("pid") is not None:
                return self._instance(record)
            if self.capacity is not None and not self.capacity(market):
                raise CapacityUnavailableError(f"{market_label(market)}: no capacity (replayed)")
            home = self._dir(instance_id)
            home.mkdir(parents=True, exist_ok=True)
            record = {
                "instance_id": instance_id,
                "provider": self.name,
                "job": spec.job,
                "epoch": spec.epoch,
                "market": market_label(market),
                "idempotency_key": idempotency_key,
                "launched_at": datetime.now(UTC).isoformat(),
                "tags": dict(spec.tags),
                "command": list(spec.command),
                "pid": None,
            }
            self._write(record)
            # Notices of a local instance are files, whatever cloud its market stands for.
            env = {
                **os.environ,
                **agent_environment(spec, market),
                "SPOTOPT_NOTICE_FILE": str(home / "notice"),
                "SPOTOPT_CLOUD": spec.env.get("SPOTOPT_CLOUD", "local"),
            }
            try:
                with (home / "log").open("ab") as log, (home / "alive.lock").open("ab") as alive:
                    fcntl.flock(alive, fcntl.LOCK_EX)  # the child inherits the lock with the file
                    pid = self._start(home, spec, env, log, alive)
            except OSError as exc:
                raise ProviderError(f"job {spec.job}: cannot start {spec.command[0]!r}: {exc}") from exc
            proc = _proc_start_ticks(pid)
            record["pid"] = pid
            record["start_ticks"] = proc[1] if proc else None
            self._write(record)
            return self._instance(record)

    def status(self, instance_id: str) -> InstanceStatus:
        record = self._read(instance_id)
        if record is None:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="no such local instance")
        instance = self._instance(record)
        if record.get("pid") is None:
            return InstanceStatus(instance, instance_id, InstanceState.PENDING)
        if self._alive(record):
            return InstanceStatus(instance, instance_id, InstanceState.RUNNING)
        exit_file = self._dir(instance_id) / "exit_code"
        code = int(exit_file.read_text(encoding="utf-8")) if exit_file.exists() else None
        detail = "" if code is not None else "killed (no exit status recorded)"
        if record.get("preempted_at"):
            return InstanceStatus(instance, instance_id, InstanceState.PREEMPTED, code, detail)
        if record.get("terminate_requested_at"):
            return InstanceStatus(instance, instance_id, InstanceState.TERMINATED, code, detail)
        return InstanceStatus(instance, instance_id, InstanceState.EXITED, code, detail)

    def terminate(self, instance_id: str, grace_s: float | None = None) -> InstanceStatus:
        """SIGTERM the process group, wait up to the grace period, then SIGKILL. Idempotent."""
        record = self._read(instance_id)
        if record is not None and self._alive(record):
            record["terminate_requested_at"] = datetime.now(UTC).isoformat()
            self._write(record)
            self._signal(record, signal.SIGTERM)
            if not self._wait_dead(record, self.grace_s if grace_s is None else grace_s):
                self._signal(record, signal.SIGKILL)
                self._wait_dead(record, KILL_WAIT_S)
            self._end_group(int(record["pid"]))
        return self.status(instance_id)

    def list_instances(self, job: str | None = None, tags: Mapping[str, str] | None = None) -> list[Instance]:
        found = []
        for home in (self.state_dir / "instances").iterdir():
            record = self._read(home.name)
            instance = None if record is None else self._instance(record)
            if instance is not None and matches(instance, job, tags):
                found.append(instance)
        return sorted_instances(found)

    # -- what a cloud does to spot instances -------------------------------------------------

    def preempt(self, instance_id: str, notice_s: float) -> InstanceStatus:
        """Deliver a preemption notice, then reclaim the instance ``notice_s`` seconds later.
        Returns once the process is gone (early if the job stops by itself: then it is the
        job's own exit, not a reclaim)."""
        record = self._read(instance_id)
        if record is None or not self._alive(record):
            return self.status(instance_id)
        self.notify(instance_id, notice_s)
        if not self._wait_dead(record, notice_s):
            self.reclaim(instance_id)
        return self.status(instance_id)

    def notify(self, instance_id: str, notice_s: float) -> None:
        """Deliver a preemption notice: the file ``SPOTOPT_NOTICE_FILE``, which the agent's
        ``local`` poller sees. Returns at once (a replay reclaims at its own simulated time)."""
        notice = self._dir(instance_id) / "notice"
        notice.write_text(f"local preemption: reclaimed in {notice_s:g} s\n", encoding="utf-8")

    def reclaim(self, instance_id: str) -> InstanceStatus:
        """What a cloud does at the end of a notice: kill the instance whatever it is doing. Only
        an instance still alive then counts as reclaimed (``PREEMPTED``)."""
        record = self._read(instance_id)
        if record is not None and self._alive(record):
            record["preempted_at"] = datetime.now(UTC).isoformat()
            self._write(record)
            self._signal(record, signal.SIGKILL)
            self._wait_dead(record, KILL_WAIT_S)
            self._end_group(int(record["pid"]))
        return self.status(instance_id)

    def log_path(self, instance_id: str) -> Path:
        return self._dir(instance_id) / "log"

    # -- internals -----------------------------------------------------------------------------

    def _start(
        self, home: Path, spec: LaunchSpec, env: Mapping[str, str], log: BinaryIO, alive: BinaryIO
    ) -> int:
        """Start ``RUNNER`` on ``spec.command`` as the leader of a new session (so of a new process
        group), output to ``log``, holding the locked ``alive``; its pid. The one place an
        instance's process starts: the trainer tests override it to fork a runner that does what
        ``RUNNER`` does from a process that has imported torch once (``tests/zygote.py``)."""
        child = subprocess.Popen(
            ["/bin/sh", "-c", RUNNER, str(home), *spec.command],
            env=env,
            cwd=spec.workdir,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            pass_fds=(alive.fileno(),),
        )
        self._children[home.name] = child
        return child.pid

    def _dir(self, instance_id: str) -> Path:
        return self.state_dir / "instances" / instance_id

    def _adopt(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """A record without a pid: its launcher died around the start. The process it may have
        started, adopted (the record completed and returned), or None when none lives (then
        the launch starts it). Called under the launch lock."""
        home = self._dir(record["instance_id"])
        with (home / "alive.lock").open("ab") as alive:
            try:
                fcntl.flock(alive, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # a process of this instance holds it: adopt that one
            else:
                return None
        deadline = time.monotonic() + ADOPT_WAIT_S
        while not (home / "pid").exists():
            if time.monotonic() >= deadline:
                raise ProviderError(
                    f"{record['instance_id']}: a process of this instance runs but never said its pid; "
                    f"end it (fuser {home / 'alive.lock'}) and launch again"
                )
            time.sleep(WAIT_STEP_S)
        pid = int((home / "pid").read_text(encoding="utf-8"))
        proc = _proc_start_ticks(pid)
        record["pid"], record["start_ticks"] = pid, proc[1] if proc else None
        self._write(record)
        return record

    def _read(self, instance_id: str) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads(
                (self._dir(instance_id) / "record.json").read_text(encoding="utf-8")
            )
        except FileNotFoundError:
            return None
        return data

    def _write(self, record: dict[str, Any]) -> None:
        path = self._dir(record["instance_id"]) / "record.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=1), encoding="utf-8")
        os.replace(tmp, path)

    @staticmethod
    def _instance(record: Mapping[str, Any]) -> Instance:
        return Instance(
            instance_id=record["instance_id"],
            provider=record["provider"],
            job=record["job"],
            epoch=int(record["epoch"]),
            market=record["market"],
            idempotency_key=record["idempotency_key"],
            launched_at=datetime.fromisoformat(record["launched_at"]),
            tags=dict(record.get("tags", {})),
        )

    def _alive(self, record: Mapping[str, Any]) -> bool:
        """Is the recorded process still running? A reused pid (other start time) is not ours."""
        child = self._children.get(record["instance_id"])
        if child is not None and child.poll() is not None:
            return False  # reaped: our own child has exited
        proc = _proc_start_ticks(int(record["pid"]))
        if proc is None or proc[0] == "Z":
            return False
        return record.get("start_ticks") is None or proc[1] == record["start_ticks"]

    def _signal(self, record: Mapping[str, Any], sig: signal.Signals) -> None:
        if not self._alive(record):
            return
        with contextlib.suppress(ProcessLookupError):  # it ended between the check and the signal
            os.killpg(int(record["pid"]), sig)

    @staticmethod
    def _end_group(pgid: int) -> None:
        """Kill what is left of an instance's process group once its leader is gone, and wait
        until nothing runs in it: a job's own children are part of the instance, and a
        terminate returns only when the instance is gone. Called only right after the leader
        was alive, so the group id is still ours."""
        deadline = time.monotonic() + KILL_WAIT_S
        while group_members(pgid) and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
            time.sleep(WAIT_STEP_S)

    def _wait_dead(self, record: Mapping[str, Any], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._alive(record):
            if time.monotonic() >= deadline:
                return False
            time.sleep(WAIT_STEP_S)
        return True
