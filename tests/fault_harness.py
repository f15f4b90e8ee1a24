"""Fault injection for the mover: one scenario through every journaled step, played by driver
processes (``tests.fault_driver``) that are SIGKILLed and restarted, and the issue's invariants.

The scenario: the example NumPy job starts on the only spot market (move 1: grant, launch), is
held at step ``HOLD_AT``; the test adds a cheaper market, the daemon moves the job
make-before-break (move 2: launch, stop-old, grant, terminate-old); the job runs to its end and
is stopped (move 3: terminate-old). The test edits the world from what the database says
(``steer``), never from timing, so the same edits happen whatever run was killed where.

Invariants (``check``), the issue's: the job is ``done`` with weights and every logged loss
bit-identical to an uninterrupted run and every resume starting at or after the newest verified
checkpoint (no lost progress); no live process of any instance (orphans); the epochs in the
shared step log never go back (two placements never trained at once); spend within the budget;
the ledger has one closed interval per instance the provider launched, each covering its
process's end; a training fault was resumed by a retry, a store outage waited out.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import select

from spotopt.clouds.local.provider import LocalProvider, group_members
from spotopt.db.engine import Database
from spotopt.db.models import JobMove, JournalEntry
from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history
from spotopt.mover import jobs as jobstore
from spotopt.mover.ledger import intervals, spent_usd, total_usd
from tests.mover_world import STEPS, TRAIN, a_day_ago, job_yaml, on_demand, spot
from tests.read_only import allow_writes, refuse_writes

ROOT = Path(__file__).resolve().parents[1]
JOB = "mlp"
HOLD_AT = 150
"""The first placement waits here until the cheaper market appeared and the job moved."""
HOLD_AFTER_MOVE = 300
BUDGET_USD = 1.0
PHASES = ("before", "after")
FAULTS = ("trainer-kill", "exit-137", "store-errors")
"""What can happen at ``HOLD_AT``: ``trainer-kill`` SIGKILLs the training process (what the
kernel's OOM killer does: the agent sees a signal), ``exit-137`` runs it under a shell that then
exits with status 137 (what a container runtime or wrapper reports for an OOM kill). Both are
retryable: the job must resume and end ``done`` with the uninterrupted run's weights.
``store-errors``: the job's store refuses writes for a while, in two phases (``_store_outage``),
each lifted once the refusal it is for has happened: the checkpoint the move asks of the old
placement, then the daemon's lease grant. The move must wait both out and the job end ``done``."""
STORE_PHASES = ("checkpoints", "lease")
"""``store-errors``' phases: the directory that refuses writes in each (below the job's store)."""
RUN_LIMIT_S = 240.0
"""A whole scenario (all driver runs) gives up after this: only a broken build reaches it."""


@dataclass(frozen=True)
class Reference:
    """The uninterrupted run's result: final weights and the loss of every step."""

    weights: np.ndarray
    losses: np.ndarray


def reference_run(tmp: Path) -> Reference:
    """The example job run start to end with no agent (the same BLAS environment, no SPOTOPT_*)."""
    out = tmp / "reference"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    env["SPOTOPT_CHECKPOINT_URI"] = f"file://{tmp / 'reference-store'}"
    cmd = [sys.executable, str(TRAIN), "--steps", str(STEPS), "--out", str(out)]
    subprocess.run(cmd, check=True, env=env, cwd=tmp, capture_output=True)
    return Reference(np.load(out / "weights.npy"), np.load(out / "losses.npy"))


@dataclass
class FaultWorld:
    """One scenario's directory and database: the job, its step log, the drivers' event lines."""

    db_url: str
    tmp: Path
    fault: str | None = None
    """One of ``FAULTS`` injected into the training process at ``HOLD_AT`` (None: none)."""

    @property
    def log(self) -> Path:
        return self.tmp / "steps.log"

    @property
    def events(self) -> Path:
        return self.tmp / "events.log"

    @property
    def provider(self) -> LocalProvider:
        return LocalProvider(self.tmp / "local", grace_s=5.0)

    def hold(self, step: int | None) -> None:
        until = self.tmp / f"{JOB}.until"
        if step is None:
            until.unlink(missing_ok=True)
        else:
            until.write_text(str(step), encoding="utf-8")

    def held_at(self) -> int | None:
        until = self.tmp / f"{JOB}.until"
        return int(until.read_text(encoding="utf-8")) if until.exists() else None

    def stop_all(self) -> None:
        """Teardown: end every instance this world's provider started (by its recorded pid), and
        give the store back its writes (a read-only directory could not even be deleted)."""
        provider = self.provider
        for instance in provider.list_instances():
            provider.terminate(instance.instance_id, grace_s=0)
        for phase in STORE_PHASES:
            allow_writes(self.store_dir(phase))

    def store_dir(self, phase: str) -> Path:
        """The directory of the job's store that refuses writes in ``phase`` of ``store-errors``."""
        job = self.tmp / "store" / JOB
        return job / "checkpoints" if phase == "checkpoints" else job


def new_world(db_url: str, tmp: Path, fault: str | None = None) -> FaultWorld:
    """A fresh scenario: one spot market and on-demand priced a day ago, the job submitted and
    held at ``HOLD_AT``; with ``fault`` (one of ``FAULTS``) that fault is played there."""
    if fault is not None and fault not in FAULTS:
        raise ValueError(f"fault: {fault!r} is none of {', '.join(FAULTS)}")
    tmp.mkdir(parents=True, exist_ok=True)
    world = FaultWorld(db_url, tmp, fault)
    db = open_history(db_url)
    try:
        run_ingest(db, "test", "test", [spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago())])
        spec = job_yaml(tmp, budget=BUDGET_USD, log=world.log)
        if fault == "exit-137":
            _under_a_shell(spec)
        jobstore.submit(db, spec)
    finally:
        db.dispose()
    world.hold(HOLD_AT)
    return world


def _under_a_shell(spec: Path) -> None:
    """``spec``'s ``run:`` inside ``/bin/sh -c '...; exit $?'``: the shell outlives the trainer
    and exits with its status, 137 after a SIGKILL."""
    lines = spec.read_text(encoding="utf-8").splitlines()
    lines = [
        f"    run: /bin/sh -c '{line.removeprefix('    run: ')}; exit $?'"
        if line.startswith("    run: ")
        else line
        for line in lines
    ]
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _trainer_pids(world: FaultWorld) -> list[int]:
    """The live training processes (Python running the example script) of the world's instances."""
    found = []
    provider = world.provider
    for instance in provider.list_instances(job=JOB):
        record = json.loads(
            (world.tmp / "local" / "instances" / instance.instance_id / "record.json").read_text()
        )
        for pid in group_members(int(record["pid"])) if record.get("pid") is not None else []:
            try:
                argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if len(argv) > 1 and argv[1] == str(TRAIN).encode():
                found.append(pid)
    return found


def _inject(world: FaultWorld) -> bool:
    """Play the world's fault once the first placement is held at ``HOLD_AT`` (the file
    ``fault-injected`` holds the epoch it hit); True once it has been played."""
    marker = world.tmp / "fault-injected"
    if world.fault is None or marker.exists():
        return True
    lines = log_lines(world.log)
    if not lines or lines[-1][0] < HOLD_AT:
        return False
    if world.fault == "store-errors":
        world.store_dir("checkpoints").mkdir(parents=True, exist_ok=True)  # none written yet
        refuse_writes(world.store_dir("checkpoints"))
        marker.write_text(str(lines[-1][2]), encoding="utf-8")
        return True
    (pid,) = _trainer_pids(world)
    marker.write_text(str(lines[-1][2]), encoding="utf-8")
    os.kill(pid, signal.SIGKILL)
    return True


def _store_outage(world: FaultWorld, db: Database) -> None:
    """Move ``store-errors`` on, from what happened (never from timing): the checkpoint
    directory refuses writes until the old placement's agent said the store refused its
    checkpoint (the move's checkpoint-and-stop); then the job's own directory refuses them (the
    lease is written there) until the daemon's journal shows the grant failed; then all is
    writable again (the file ``store-restored``)."""
    if world.fault != "store-errors" or not (world.tmp / "fault-injected").exists():
        return
    restored = world.tmp / "store-restored"
    if restored.exists():
        return
    lease_phase = world.tmp / "store-refuses-lease"
    if not lease_phase.exists():
        if not any("not saved (PermissionError" in text for text in _agent_logs(world)):
            return
        allow_writes(world.store_dir("checkpoints"))
        refuse_writes(world.store_dir("lease"))
        lease_phase.touch()
        return
    with db.session() as session:
        grants = list(session.scalars(select(JournalEntry).where(JournalEntry.action == "grant")))
    if any("PermissionError" in (g.detail or "") for g in grants):
        allow_writes(world.store_dir("lease"))
        restored.touch()


def _agent_logs(world: FaultWorld) -> list[str]:
    """The output of every placement's process (the agent writes its warnings there)."""
    provider = world.provider
    logs = [provider.log_path(i.instance_id) for i in provider.list_instances(job=JOB)]
    return [p.read_text(encoding="utf-8", errors="replace") for p in logs if p.exists()]


def _resumed_after_fault(world: FaultWorld) -> bool:
    """No fault, a store outage (the move is what meets it), or a newer placement than the one
    the fault hit has reached ``HOLD_AT``."""
    if world.fault in (None, "store-errors"):
        return True
    marker = world.tmp / "fault-injected"
    lines = log_lines(world.log)
    return (
        marker.exists() and bool(lines) and lines[-1][2] > int(marker.read_text()) and lines[-1][0] >= HOLD_AT
    )


def steer(world: FaultWorld, db: Database) -> None:
    """The test's edits, from what the database says (idempotent, so any run may do them):
    the training fault once the job runs at ``HOLD_AT``; a cheaper market once it runs there (again,
    after a fault); the store outage's phases; more steps once the move's lease moved; no limit
    once the move is done."""
    job = jobstore.get_job(db, JOB)
    cheaper = world.tmp / "cheaper-added"
    if not _inject(world):
        return
    _store_outage(world, db)
    if (
        not cheaper.exists()
        and job.state == "running"
        and job.steps >= HOLD_AT
        and _resumed_after_fault(world)
    ):
        run_ingest(db, "test", "test", [spot("us-east-1b", 0.3, datetime.now(UTC) - timedelta(seconds=1))])
        cheaper.touch()
    with db.session() as session:
        moves = list(session.scalars(select(JobMove).where(JobMove.kind == "move")))
    if any(m.step == "confirm" or m.outcome is not None for m in moves) and world.held_at() == HOLD_AT:
        world.hold(HOLD_AFTER_MOVE)
    if any(m.outcome == "done" for m in moves):
        world.hold(None)


@dataclass
class DriverRun:
    """One driver process: how it ended and whether the crash we asked for landed."""

    returncode: int
    killed_by_test: bool
    seconds: float


@dataclass
class Processes:
    """The driver processes a test started, so that teardown kills exactly those (by pid)."""

    running: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, world: FaultWorld, *args: str) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "tests.fault_driver", "--db", world.db_url, "--dir", str(world.tmp)]
        cmd += ["--events", str(world.events), *args]
        with (world.tmp / "drivers.out").open("ab") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
        self.running[proc.pid] = proc
        return proc

    def kill_all(self) -> None:
        for proc in self.running.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.running.clear()


@contextmanager
def processes() -> Iterator[Processes]:
    owned = Processes()
    try:
        yield owned
    finally:
        owned.kill_all()


def steer_until(world: FaultWorld, done: Callable[[], bool], deadline: float) -> None:
    """Steer the world until ``done()`` (a broken build reaches ``deadline``)."""
    db = open_history(world.db_url)
    try:
        while not done():
            steer(world, db)
            if time.monotonic() > deadline:
                raise AssertionError(f"the scenario did not end in time; see {world.tmp / 'drivers.out'}")
            time.sleep(0.05)
        steer(world, db)
    finally:
        db.dispose()


def drive(
    world: FaultWorld,
    procs: Processes,
    *args: str,
    kill_after_s: float | None = None,
    deadline: float,
) -> DriverRun:
    """Run one driver to its end (or SIGKILL it after ``kill_after_s``), steering meanwhile."""
    started = time.monotonic()
    proc = procs.start(world, *args)
    killed = False

    def ended() -> bool:
        nonlocal killed
        if kill_after_s is not None and proc.poll() is None and time.monotonic() - started >= kill_after_s:
            proc.kill()
            proc.wait()
            killed = True
        return proc.poll() is not None

    steer_until(world, ended, deadline)
    return DriverRun(proc.returncode, killed, time.monotonic() - started)


@dataclass
class Outcome:
    """A played scenario: its driver runs and the invariants found after it."""

    runs: list[DriverRun]
    findings: Findings

    @property
    def crashed(self) -> bool:
        """The first driver died of SIGKILL (its failpoint, or the test's kill) before the end."""
        return self.runs[0].returncode == -9


def play(
    world: FaultWorld,
    reference: Reference,
    *,
    crash: tuple[str, str] | None = None,
    kill_after_s: float | None = None,
) -> Outcome:
    """The scenario: a first driver (with the crash point or the timed kill), then restarted
    drivers until one ends the job; then the invariants."""
    deadline = time.monotonic() + RUN_LIMIT_S
    runs = []
    with processes() as procs:
        first = ("--crash", f"{crash[0]}:{crash[1]}") if crash else ()
        runs.append(drive(world, procs, *first, kill_after_s=kill_after_s, deadline=deadline))
        while runs[-1].returncode != 0:
            if runs[-1].returncode != -9 or len(runs) > 4:
                raise AssertionError(f"driver exited {runs[-1].returncode}; see {world.tmp / 'drivers.out'}")
            runs.append(drive(world, procs, deadline=deadline))
    return Outcome(runs, check(world, reference))


def journal_keys(db_url: str) -> list[str]:
    """The journal's keys in the order they were first written."""
    db = open_history(db_url)
    try:
        with db.session() as session:
            return list(session.scalars(select(JournalEntry.key).order_by(JournalEntry.id)))
    finally:
        db.dispose()


def crash_points(keys: list[str]) -> list[tuple[str, str]]:
    """Every journaled side effect of a clean run, killed before and after its call."""
    return [(key, phase) for key in keys for phase in PHASES]


def kill_delays(seed: int, n: int, longest_s: float) -> list[float]:
    """``n`` seeded kill delays in ``[0.5, longest_s]``: what is attempted is reproducible, where
    each kill lands (which step the driver is in) may vary, and the invariants must hold anyway."""
    rng = random.Random(seed)
    return [round(rng.uniform(0.5, longest_s), 3) for _ in range(n)]


# -- invariants ----------------------------------------------------------------------------------


@dataclass
class Findings:
    """Violations of the issue's invariants after a scenario (all must be empty or zero)."""

    wrong_result: list[str] = field(default_factory=list)
    lost_progress: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    overlaps: list[str] = field(default_factory=list)
    budget_overruns: list[str] = field(default_factory=list)
    ledger_mismatches: list[str] = field(default_factory=list)
    journal: list[str] = field(default_factory=list)
    """Journal steps left unfinished after the job ended (a crash's intent nobody closed)."""
    unresumed: list[str] = field(default_factory=list)
    """A fault the job did not get over: a training fault no retry resumed, a store outage that
    never ran its course."""
    epochs: list[int] = field(default_factory=list)
    """The epochs that trained, in the order they did (for reports)."""

    def problems(self) -> dict[str, list[str]]:
        return {name: value for name, value in vars(self).items() if name != "epochs" and value}


def log_lines(log: Path) -> list[tuple[int, str, int]]:
    """``(step, loss hex, epoch)`` per line of the example job's ``--log``, in write order."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text(encoding="utf-8").splitlines():
        step, loss, epoch = line.split()
        out.append((int(step), loss, int(epoch)))
    return out


def verified_checkpoints(store: Path) -> list[tuple[int, int]]:
    """``(step, epoch)`` of every checkpoint in the store with a manifest (written last, after
    the upload was verified), including superseded ones still kept."""
    found = []
    for manifest in (store / JOB / "checkpoints").glob("*/manifest.json"):
        data = json.loads(manifest.read_text(encoding="utf-8"))
        found.append((int(data["step"]), int(data["epoch"])))
    return sorted(found)


def check(world: FaultWorld, reference: Reference) -> Findings:
    found = Findings()
    check_training(world, reference, found)
    check_processes(world, found)
    _check_money(world, found)
    _check_resumed(world, found)
    return found


def _check_resumed(world: FaultWorld, found: Findings) -> None:
    """A played training fault was followed by one of the retry policy's transitions: back to
    ``recovering`` from a running job, to ``pending`` when the fault came while its start (or
    a recovery) was still confirming it (``jobs.after_failure``). A store outage needs no retry:
    both its phases must have been played and lifted (the job's ending ``done`` is checked with
    the money)."""
    if world.fault is None:
        return
    if not (world.tmp / "fault-injected").exists():
        found.unresumed.append(f"{world.fault}: never played (the job did not reach step {HOLD_AT})")
        return
    if world.fault == "store-errors":
        if not (world.tmp / "store-restored").exists():
            found.unresumed.append("store-errors: the outage never reached the daemon's grant")
        return
    db = open_history(world.db_url)
    try:
        retries = [e for e in jobstore.events(db, JOB) if e.reason.startswith(jobstore.RETRY_REASON)]
    finally:
        db.dispose()
    if not any("status 137" in e.reason for e in retries):
        found.unresumed.append(
            f"{world.fault}: no retry of the exit status 137 ({[e.reason for e in retries]})"
        )


def check_training(world: FaultWorld, reference: Reference, found: Findings) -> None:
    weights = world.tmp / f"{JOB}-out" / "weights.npy"
    if not weights.exists() or not np.array_equal(np.load(weights), reference.weights):
        found.wrong_result.append("final weights differ from the uninterrupted run (or are missing)")
    lines = log_lines(world.log)
    for step, loss, epoch in lines:
        if float.fromhex(loss) != reference.losses[step - 1]:
            found.wrong_result.append(f"epoch {epoch} step {step}: loss differs from the uninterrupted run")
    checkpoints = verified_checkpoints(world.tmp / "store")
    newest_epoch = -1
    seen: set[tuple[int, int]] = set()
    for i, (step, _loss, epoch) in enumerate(lines):
        if (epoch, step) in seen:  # one placement trains each step once: two trainers of one epoch
            found.overlaps.append(f"line {i + 1}: epoch {epoch} trained step {step} twice")
            continue
        seen.add((epoch, step))
        if epoch < newest_epoch:
            found.overlaps.append(f"line {i + 1}: epoch {epoch} trained step {step} after {newest_epoch}")
            continue
        if epoch > newest_epoch:
            # A placement's first step: it resumed from step - 1, which must not be older than
            # the newest checkpoint verified by the placements before it.
            start = step - 1
            newest = max((s for s, e in checkpoints if e < epoch), default=0)
            if start < newest:
                found.lost_progress.append(
                    f"epoch {epoch} resumed at step {start}, older than the verified checkpoint {newest}"
                )
            newest_epoch = epoch
            found.epochs.append(epoch)
    trained = {step for step, _loss, _epoch in lines}
    if trained != set(range(1, STEPS + 1)):
        found.lost_progress.append(f"steps never trained: {sorted(set(range(1, STEPS + 1)) - trained)[:10]}")


def check_processes(world: FaultWorld, found: Findings) -> None:
    provider = world.provider
    for instance in provider.list_instances():
        if provider.status(instance.instance_id).state.is_live:
            found.orphans.append(f"{instance.instance_id}: the provider reports it live")
        home = world.tmp / "local" / "instances" / instance.instance_id
        record = json.loads((home / "record.json").read_text(encoding="utf-8"))
        if record.get("pid") is not None and group_members(int(record["pid"])):
            found.orphans.append(f"{instance.instance_id}: process group {record['pid']} still has processes")
    for pid in _processes_naming(world.log):  # a trainer no record knows (a launch done twice)
        found.orphans.append(f"pid {pid}: a training process of this world still runs")


def _processes_naming(path: Path) -> list[int]:
    """Live processes (zombies excluded) whose command line names ``path``."""
    named = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
            state = (cmdline.parent / "stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z" and any(str(path).encode() in arg for arg in argv):
            named.append(int(cmdline.parent.name))
    return named


def _check_money(world: FaultWorld, found: Findings) -> None:
    provider = world.provider
    launched = {i.instance_id: i for i in provider.list_instances(job=JOB)}
    db = open_history(world.db_url)
    try:
        now = datetime.now(UTC)
        job = jobstore.get_job(db, JOB)
        if job.state != "done":
            found.wrong_result.append(f"the job ended {job.state}, not done")
        with db.session() as session:
            rows = intervals(session, job.id, now)
            spent = spent_usd(session, job.id, now)
            entries = list(session.scalars(select(JournalEntry).order_by(JournalEntry.id)))
    finally:
        db.dispose()
    found.journal += [f"{e.key}: {e.status}" for e in entries if e.status != "done"]
    if spent > job.budget_usd:
        found.budget_overruns.append(f"spent ${spent:.6f} > budget ${job.budget_usd:.6f}")
    ids = [r.instance_id for r in rows]
    if sorted(i for i in ids if i) != sorted(launched) or len(set(ids)) != len(ids):
        found.ledger_mismatches.append(f"ledger intervals {ids} != instances launched {sorted(launched)}")
    if abs(total_usd(rows) - sum(r.billed_usd for r in rows)) > 1e-12:
        found.ledger_mismatches.append("the ledger total is not the sum of its intervals")
    for row in rows:
        if row.ended_at is None:
            found.ledger_mismatches.append(f"{row.instance_id}: interval still open after the job ended")
            continue
        exit_file = world.tmp / "local" / "instances" / str(row.instance_id) / "exit_code"
        if exit_file.exists():
            ended = datetime.fromtimestamp(exit_file.stat().st_mtime, UTC)
            if ended > row.ended_at + timedelta(seconds=0.5):
                found.ledger_mismatches.append(
                    f"{row.instance_id}: billed until {row.ended_at}, its process ran until {ended}"
                )
        instance = launched.get(str(row.instance_id))
        if instance is not None and instance.launched_at > row.started_at:
            found.ledger_mismatches.append(f"{row.instance_id}: billed from before its launch")


def copy_sqlite(template: Path, to: Path) -> str:
    """A fresh migrated SQLite database copied from the session's template."""
    to.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(template, to)
    return f"sqlite:///{to}"
