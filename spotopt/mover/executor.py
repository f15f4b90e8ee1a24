"""The executor: every side effect of the mover, journaled, one state machine per move.

A *move* (``JobMove``) is a start, a voluntary move, a recovery after a preemption, or a stop.
Each kind is a fixed sequence of steps (``STEPS``); the row remembers the step it stands at, so
a restarted daemon carries on from there. Steps that call out (``grant``, ``launch``,
``stop-old``, ``terminate-old``, ``terminate-new``) are *side effects*: a ``journal`` row with
status ``intent`` is committed before the call and ``done``/``failed`` after it, and the call
carries an idempotency key derived from the move and the step. Every call is idempotent (the
provider's launch key, the lease granted *to* an epoch, a control request id from the key,
terminate), so resuming after a crash is simply doing the current step again; nothing is
guessed from timing. Waiting steps (``await-up``, ``await-checkpoint``, ``confirm``) read the
store and the provider and move on, time out, or wait for the next round.

Make-before-break (``move``): launch the new placement with epoch e+1 (its agent waits for the
lease), once it is up ask the old one to checkpoint and stop, on its verified checkpoint grant
the lease to e+1 (which also fences the old one), terminate the old instance, and finish when
the new placement reports progress past the checkpoint. The job loses the checkpoint and restore
time, not the provisioning time. A launch refused for capacity marks the market unavailable for
a while (``Timeouts.unavailable_s``) and aborts the move, the job still running where it was.
A recovery (``recover``) is the same without waiting for the new placement before stopping the
old one (a preempted instance is already checkpointing on its notice, or gone).

Crash safety, by construction: the placement row and the journal intent are written in one
transaction before the launch call, so an instance the provider started is always findable by
its key (the sweep of every round, ``Executor.sweep``, ends whatever of this database's still
bills with no live placement owning it: ``spotopt.mover.sweep``); the lease epoch fences the
old placement the moment the new one may write, so two placements never train into the store
at once; and progress is lost only back to the newest verified checkpoint. A placement that
ends by itself (the job exited, the instance was preempted or vanished) has its instance
terminated as well: a VM the guest powered off is still billed on Azure until deleted, a
stopped GCP VM keeps its disk.
"""

from __future__ import annotations

import json
import shlex
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotopt.checkpoints import (
    AgentState,
    Heartbeat,
    Location,
    RequestKind,
    grant_lease,
    read_acknowledgement,
    read_finished,
    read_heartbeat,
    read_lease,
    send_request,
    store_url,
    trusted_checkpoints,
)
from spotopt.clouds.common.base import (
    DATABASE_TAG,
    Billing,
    InstanceState,
    LaunchSpec,
    Provider,
    market_label,
)
from spotopt.db.engine import Database
from spotopt.db.identity import database_id_of
from spotopt.db.models import InstanceType, JobMove, JournalEntry, ManagedJob, Market, Meta, Placement
from spotopt.errors import CapacityUnavailableError, ConfigError, SpotoptError, one_line
from spotopt.jobspec import Job
from spotopt.mover import jobs as jobstore
from spotopt.mover.billing import interval_cost_usd
from spotopt.mover.eventlog import log_event
from spotopt.mover.ledger import (
    fleet_usd_per_hour,
    market_key,
    price_entry_egress,
    record_entry_egress,
    spent_usd,
)
from spotopt.mover.observed import PREEMPTION_ENDS, record_capacity, record_lifetime, record_throughput
from spotopt.mover.progress import record_progress
from spotopt.mover.sweep import Leftover, find_leftovers
from spotopt.notify import outbox
from spotopt.price import SlotPrice, per_instance
from spotopt.render import usd
from spotopt.times import parse_duration
from spotopt.types import MarketKey

T = TypeVar("T")

STEPS: dict[str, tuple[str, ...]] = {
    "start": ("grant", "launch", "confirm"),
    "move": (
        "launch",
        "await-up",
        "stop-old",
        "await-checkpoint",
        "grant",
        "terminate-old",
        "confirm",
    ),
    "recover": ("launch", "stop-old", "await-checkpoint", "grant", "terminate-old", "confirm"),
    "stop": ("stop-old", "await-checkpoint", "terminate-old"),
    "halt": ("fence", "terminate-old"),
}
"""The steps of each kind of move, in order (docs/guides/daemon.md, "Moves")."""

JOB_STATE_DURING = {"start": "launching", "move": "moving", "recover": "recovering"}
UNAVAILABLE_KEY = "mover_unavailable"
DEADLINE_REASON = "deadline: "
"""How the reason of a move the decision core's deadline rule made begins (the daemon writes
``<reason>: <market>``): such a move tells of a deadline at risk (``deadline.at_risk``)."""
NO_CAPACITY = "no capacity: "
"""How the detail of a move whose launch was refused for capacity begins (the daemon decides
such a job again in the same round)."""
"""``meta`` row: market id → until when (ISO) a market that refused capacity is skipped."""


FAULTS_TO_FAIL = 3
"""Rounds in a row a job's own step must fail (its store unreachable), for at least
``Timeouts.store_s``, before the job is failed: a store outage heals within them, a bucket that
does not exist does not."""


class LostLeadership(SpotoptError):
    """This daemon is no longer the leader: it must stop before its next side effect."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """How long the waiting steps wait before giving up (seconds of the executor's clock)."""

    launch_s: float = 900.0
    """A new placement must show its agent (a heartbeat) within this, and progress within twice it."""
    stop_s: float = 600.0
    """The old placement must answer checkpoint-and-stop within this; after it the lease moves
    anyway (progress since the newest verified checkpoint is lost, nothing worse)."""
    unavailable_s: float = 3600.0
    """A market that refused capacity is left out of the options for this long."""
    silent_s: float = 180.0
    """An agent heard from within this (its heartbeat, every 30 s by default) is alive even where
    the provider has no record of its instance; silent longer, its placement is lost."""
    store_s: float = 300.0
    """A job's store may refuse the daemon this long (an object store's 503s, a permission
    change rolled back, a mount that comes back) before the job is failed: its steps are
    retried every round meanwhile, so an outage costs time, not the job."""


@dataclass(frozen=True, slots=True)
class Observation:
    """What one round learnt about a running job's placement (for the decision core)."""

    notice: bool = False
    lost: bool = False
    finished: bool = False
    failed: str | None = None
    """Why the training process failed (its exit status, where its log is), when it did."""
    exit_code: int | None = None
    log_path: str | None = None


def exit_meaning(code: int) -> str:
    """An exit status with what it usually means: ``137 (killed by SIGKILL, as an OOM kill
    is)``; the shell's 126/127 and 128 + a signal number."""
    if code == 127:
        return "127 (command not found)"
    if code == 126:
        return "126 (command not executable)"
    if 128 < code < 128 + 65:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            return str(code)
        oom = ", as an out-of-memory kill is" if name == "SIGKILL" else ""
        return f"{code} (killed by {name}{oom})"
    return str(code)


def utcnow() -> datetime:
    return datetime.now(UTC)


def job_location(job: ManagedJob) -> Location:
    """The job's checkpoint store: a URL, or a path relative to the job file's directory."""
    return Location(store_url(job.checkpoint_uri, Path(job.workdir) if job.workdir else Path.cwd()))


class Executor:
    """Runs moves for one database and one provider; ``clock`` is the only time source."""

    def __init__(
        self,
        db: Database,
        provider: Provider,
        *,
        clock: Callable[[], datetime] = utcnow,
        still_leader: Callable[[], bool] = lambda: True,
        agent_env: Mapping[str, str] | None = None,
        timeouts: Timeouts = Timeouts(),
        period_h: float = 1.0,
        max_usd_per_hour: float | None = None,
        failpoint: Callable[[str, str], None] | None = None,
    ) -> None:
        """``failpoint(key, phase)`` runs around every side effect, ``phase`` ``before`` (the intent
        is committed, the call not made) or ``after`` (the call returned, its result not yet
        committed): the fault-injection tests kill the process there."""
        self.db = db
        self.provider = provider
        self.clock = clock
        self.still_leader = still_leader
        self.agent_env = dict(agent_env or {})
        self.timeouts = timeouts
        self.period_h = period_h
        self.max_usd_per_hour = max_usd_per_hour
        self.failpoint = failpoint or (lambda _key, _phase: None)
        self._database_id: str | None = None
        self._faults: dict[str, tuple[int, datetime]] = {}
        """Per job: rounds in a row its step failed, and when the first of them failed."""

    @property
    def database_id(self) -> str:
        """This database's id (``spotopt.db.identity``), tagged on every instance launched."""
        if self._database_id is None:
            self._database_id = database_id_of(self.db)
        return self._database_id

    # -- opening moves -----------------------------------------------------------------------

    def open_move(
        self,
        job_name: str,
        kind: str,
        reason: str,
        *,
        market_id: int | None = None,
        gpus: int | None = None,
        price: SlotPrice | None = None,
        saving_usd: float = 0.0,
        cost_usd: float = 0.0,
        then_state: str | None = None,
    ) -> int | None:
        """Record a new move of ``job_name`` (the job must have none open); its id, or None when
        the job already has an open move (a second daemon round decided the same thing).
        ``price``: the target slot's, as the decision priced it (the launch records it as is)."""
        now = self.clock()
        with self.db.session() as session:
            job = jobstore.find_job(session, job_name, lock=True)
            if _open_move(session, job.id) is not None:
                return None
            current = session.get(Placement, job.placement_id) if job.placement_id else None
            move = JobMove(
                job_id=job.id,
                kind=kind,
                reason=reason,
                step=STEPS[kind][0],
                from_placement_id=current.id if current is not None else None,
                market_id=market_id,
                gpus=gpus,
                instances=None if price is None else price.instances,
                usd_per_hour=None if price is None else price.usd_per_hour,
                then_state=then_state,
                saving_usd=saving_usd,
                cost_usd=cost_usd,
                created_at=now,
                updated_at=now,
            )
            if kind != "stop":  # a halt takes an epoch too: its fence moves the lease past the old one
                job.epoch += 1
                move.epoch = job.epoch
            session.add(move)
            during = JOB_STATE_DURING.get(kind)
            if during is not None and job.state != during and job.state not in jobstore.TERMINAL:
                jobstore.record_transition(session, job, during, reason, now)
            session.flush()
            move_id = move.id
            market = market_label(market_key(session, market_id)) if market_id is not None else None
            if reason.startswith(DEADLINE_REASON):
                outbox.add(
                    session,
                    "deadline.at_risk",
                    now,
                    job=job,
                    payload={"reason": reason, **_move_facts(session, move)},
                )
        log_event(
            "move-open",
            job=job_name,
            move=move_id,
            kind=kind,
            reason=reason,
            to=market,
            usd_per_hour=None if price is None else price.usd_per_hour,
            saving_usd=saving_usd,
            cost_usd=cost_usd,
        )
        return move_id

    # -- running moves -----------------------------------------------------------------------

    def advance_all(self) -> int:
        """Advance every open move as far as it goes now; the number still open."""
        with self.db.session() as session:
            ids = list(
                session.scalars(select(JobMove.id).where(JobMove.outcome.is_(None)).order_by(JobMove.id))
            )
        still_open = 0
        for move_id in ids:
            try:
                ended = self.advance(move_id)
                if self._faults:
                    self.job_ok(self._job_name_of(move_id))
            except LostLeadership:
                raise
            except Exception as exc:  # one job's store or spec must not stop the other jobs' moves
                ended = self.job_fault(self._job_name_of(move_id), exc)
            if not ended:
                still_open += 1
        return still_open

    def _job_name_of(self, move_id: int) -> str:
        with self.db.session() as session:
            name = session.scalar(
                select(ManagedJob.name)
                .join(JobMove, JobMove.job_id == ManagedJob.id)
                .where(JobMove.id == move_id)
            )
        assert name is not None
        return name

    def job_fault(self, job_name: str, exc: Exception) -> bool:
        """Account for an error that one job's step or watch raised (its store unreachable, a
        back-end missing on the daemon's machine): logged in one line, and once it has failed
        ``FAULTS_TO_FAIL`` rounds in a row over at least ``Timeouts.store_s`` (at once for a
        ``ConfigError``, which never heals by itself) the job is failed with that line as its
        reason (``fail_job``). The other jobs go on either way. True once the job was failed."""
        line = one_line(exc)
        now = self.clock()
        count, since = self._faults.get(job_name, (0, now))
        count += 1
        self._faults[job_name] = (count, since)
        log_event("job-error", job=job_name, error=line, rounds=count)
        lasted = (now - since).total_seconds() >= self.timeouts.store_s
        if isinstance(exc, ConfigError) or (count >= FAULTS_TO_FAIL and lasted):
            self.fail_job(job_name, line)
            return True
        return False

    def job_ok(self, job_name: str) -> None:
        """A round of ``job_name`` went through: its run of errors (``job_fault``) is over."""
        self._faults.pop(job_name, None)

    def fail_job(self, job_name: str, reason: str) -> None:
        """End everything of ``job_name`` that is under way and mark it failed with ``reason``:
        its open move closed, its live placements ended and their instances terminated (a job
        the daemon cannot watch must not bill unwatched). A job already final keeps its state
        (a cancelled job whose store broke is still cancelled, its instance stopped)."""
        now = self.clock()
        with self.db.session() as session:
            job = jobstore.find_job(session, job_name, lock=True)
            move = _open_move(session, job.id)
            if move is not None:
                move.outcome, move.finished_at, move.updated_at, move.detail = "failed", now, now, reason
            live = list(
                session.scalars(
                    select(Placement).where(
                        Placement.job_id == job.id, Placement.state.in_(("launching", "running"))
                    )
                )
            )
            instances = [p.instance_id for p in live if p.instance_id is not None]
            for placement in live:
                placement.state, placement.end_reason, placement.ended_at = "ended", "failed", now
                record_lifetime(session, placement)
            if job.state not in jobstore.TERMINAL:
                jobstore.record_transition(session, job, "failed", reason, now)
        log_event("job-failed", job=job_name, reason=reason)
        self._faults.pop(job_name, None)
        for instance_id in instances:
            if not self.still_leader():
                raise LostLeadership("lost leadership before terminating a failed job's instance")
            try:
                self.provider.terminate(instance_id)
            except SpotoptError as exc:  # the next round's sweep tries again
                log_event("terminate-failed-job", job=job_name, instance=instance_id, error=str(exc))

    def advance(self, move_id: int) -> bool:
        """Run move ``move_id`` step by step until it waits or ends; True once it has ended."""
        while True:
            with self.db.session() as session:
                move = session.get(JobMove, move_id)
                assert move is not None
                if move.outcome is not None:
                    return True
                step = move.step
            handler = getattr(self, "_" + step.replace("-", "_"))
            if not handler(move_id):
                return False

    def abandon(self, move_id: int, why: str) -> None:
        """End an open move at once: its new placement, if launched, is terminated and the move
        aborted (the job of a cancelled move stays cancelled). What the old placement does is
        the caller's business (a cancelled job's is checkpointed and stopped by a stop move)."""
        move, _job = self._load(move_id)
        if move.to_placement_id is not None:
            self._terminate(move, move.to_placement_id, "terminate-new")
        self._finish(move_id, "aborted", why)

    def _next(self, move_id: int, session: Session | None = None) -> bool:
        """Move to the following step, or finish the move after the last one. True: go on."""
        with self.db.session() as s:
            move = s.get(JobMove, move_id)
            assert move is not None
            steps = STEPS[move.kind]
            i = steps.index(move.step)
            move.updated_at = self.clock()
            if i + 1 < len(steps):
                move.step = steps[i + 1]
                return True
        self._finish(move_id, "done", "")
        return False

    def _finish(
        self,
        move_id: int,
        outcome: str,
        detail: str,
        after: str | None = None,
        *,
        tried: bool = False,
        exit_code: int | None = None,
        log_path: str | None = None,
    ) -> None:
        """Close the move and put the job in the state its outcome leaves it in (``after``, when
        the caller knows better: a start the budget refuses leaves the job over budget; when
        ``tried``, the new placement was a failed try of the job, its training process's
        ``exit_code`` (None: none) and ``log_path`` known, and the job's retry policy decides,
        ``jobs.after_failure``)."""
        now = self.clock()
        with self.db.session() as session:
            move = session.get(JobMove, move_id)
            assert move is not None
            job = session.get(ManagedJob, move.job_id, with_for_update=True)
            assert job is not None
            move.outcome, move.finished_at, move.updated_at = outcome, now, now
            move.detail = detail or move.detail
            if tried:
                after = jobstore.after_failure(session, job, detail, exit_code, now, log_path)
                detail = f"{detail} → job {after}"
            after = after or _state_after(move, job, outcome)
            if after is not None and after != job.state and job.state not in jobstore.TERMINAL:
                why = move.reason if outcome == "done" else f"{move.kind} {outcome}: {detail}"
                jobstore.record_transition(
                    session,
                    job,
                    after,
                    why,
                    now,
                    # a voluntary move aborted leaves the job where it ran: no news
                    announce=not (move.kind == "move" and outcome == "aborted"),
                    payload=_move_facts(session, move),
                )
            name, kind = job.name, move.kind
        log_event("move-" + outcome, job=name, move=move_id, kind=kind, detail=detail or None)

    # -- side effects (journaled) ------------------------------------------------------------

    def _effect(self, move: JobMove, action: str, call: Callable[[str], T], **detail: Any) -> T:
        """Journal ``action`` of ``move`` (intent, then result) around ``call(key)``."""
        key = f"m{move.id}:{action}"
        if not self.still_leader():
            raise LostLeadership(f"lost leadership before {key}; another daemon acts now")
        now = self.clock()
        with self.db.session() as session:
            entry = session.scalar(select(JournalEntry).where(JournalEntry.key == key))
            if entry is None:
                session.add(
                    JournalEntry(
                        job_id=move.job_id,
                        move_id=move.id,
                        action=action,
                        key=key,
                        status="intent",
                        detail=json.dumps(detail, default=str),
                        started_at=now,
                    )
                )
        self.failpoint(key, "before")
        try:
            result = call(key)
            self.failpoint(key, "after")
        except Exception as exc:
            self._journal_result(key, "failed", f"{type(exc).__name__}: {exc}")
            log_event(action, move=move.id, key=key, outcome="failed", error=str(exc), **detail)
            raise
        self._journal_result(key, "done", "")
        log_event(action, move=move.id, key=key, outcome="done", **detail)
        return result

    def _settle(self, move: JobMove, action: str, why: str) -> None:
        """Mark a side effect that a resumed step did not need to repeat as done (no-op unless a
        crashed daemon left its intent), so that no finished move leaves an unfinished step."""
        key = f"m{move.id}:{action}"
        with self.db.session() as session:
            entry = session.scalar(
                select(JournalEntry).where(JournalEntry.key == key, JournalEntry.status == "intent")
            )
            if entry is not None:
                entry.status, entry.finished_at = "done", self.clock()
                entry.detail = json.dumps({**json.loads(entry.detail or "{}"), "resumed": why})

    def _journal_result(self, key: str, status: str, error: str) -> None:
        with self.db.session() as session:
            entry = session.scalar(select(JournalEntry).where(JournalEntry.key == key))
            assert entry is not None
            entry.status, entry.finished_at = status, self.clock()
            if error:
                entry.detail = json.dumps({**json.loads(entry.detail or "{}"), "error": error})

    # -- the steps ---------------------------------------------------------------------------

    def _lease_to_move(self, move: JobMove, job: ManagedJob, action: str) -> None:
        """The journaled side effect ``action``: the job's lease granted to the move's epoch."""
        assert move.epoch is not None
        loc, epoch = job_location(job), move.epoch
        self._effect(
            move,
            action,
            lambda _key: grant_lease(loc, job.name, self.clock(), epoch=epoch, database=self.database_id),
            job=job.name,
            epoch=epoch,
        )

    def _grant(self, move_id: int) -> bool:
        move, job = self._load(move_id)
        with self.db.session() as session:  # the egress of entering the new placement, billed once
            record_entry_egress(session, move_id, jobstore.job_spec(job), self.clock())
        self._lease_to_move(move, job, "grant")
        with self.db.session() as session:
            stored = session.get(ManagedJob, job.id)
            assert stored is not None
            if move.kind != "start":  # a start's placement becomes current when it launches
                stored.placement_id = move.to_placement_id
        return self._next(move_id)

    def _fence(self, move_id: int) -> bool:
        """A halt's first step: the lease moves to the halt's own epoch, which no placement
        holds, so the old placement's agent can write no checkpoint from now on (not even on
        the SIGTERM its instance's shutdown sends) and exits as superseded. A store that
        cannot be reached fails the step; after ``FAULTS_TO_FAIL`` rounds ``fail_job``
        terminates the instance all the same."""
        move, job = self._load(move_id)
        self._lease_to_move(move, job, "fence")
        return self._next(move_id)

    def _launch(self, move_id: int) -> bool:
        move, job = self._load(move_id)
        spec = jobstore.job_spec(job)
        assert move.market_id is not None and move.gpus is not None and move.epoch is not None
        key = launch_key(self.database_id, job, move.id)
        if move.to_placement_id is None:  # not re-done after a crash: the launch may have happened
            problem = self._over_budget_for(move, job, spec)
            if problem:
                if move.kind == "move":  # the job keeps running where it is
                    self._finish(move_id, "aborted", problem)
                else:
                    self._finish(move_id, "failed", problem, after="over-budget")
                return False
        now = self.clock()
        with self.db.session() as session:
            placement = session.scalar(select(Placement).where(Placement.key == key))
            if placement is None:
                placement = Placement(
                    job_id=job.id,
                    epoch=move.epoch,
                    key=key,
                    provider=self.provider.name,
                    market_id=move.market_id,
                    gpus=move.gpus,
                    instances=move.price.instances,
                    usd_per_hour=move.price.usd_per_hour,
                    state="launching",
                    created_at=now,
                )
                session.add(placement)
                session.flush()
            stored_move = session.get(JobMove, move.id)
            assert stored_move is not None
            stored_move.to_placement_id = placement.id
            if move.kind == "start":
                stored_job = session.get(ManagedJob, job.id)
                assert stored_job is not None
                stored_job.placement_id = placement.id
            placement_id = placement.id
            market = market_key(session, move.market_id)
        launch = self._launch_spec(job, spec, move, market)
        try:
            instance = self._effect(
                move,
                "launch",
                lambda _key: self.provider.launch(launch, market, key),
                job=job.name,
                epoch=move.epoch,
                market=market_label(market),
                usd_per_hour=move.usd_per_hour,
            )
        except CapacityUnavailableError as exc:
            with self.db.session() as session:
                record_capacity(session, move.market_id, self.clock(), available=False)
            self._end_placement(placement_id, "failed", "capacity")
            self._mark_unavailable(move.market_id)
            self._finish(move_id, "aborted" if move.kind == "move" else "failed", f"{NO_CAPACITY}{exc}")
            return False
        except LostLeadership:
            raise
        except SpotoptError as exc:  # a provider error, or credentials/settings gone since start-up
            # Such a refusal (a quota, an image or a subnet the region lacks, credentials gone)
            # would come again at the next round: the market sits out like a capacity refusal,
            # so the job is placed elsewhere meanwhile rather than failing round after round.
            self._end_placement(placement_id, "failed", "error")
            self._mark_unavailable(move.market_id)
            self._finish(move_id, "aborted" if move.kind == "move" else "failed", f"launch failed: {exc}")
            return False
        with self.db.session() as session:
            placement = session.get(Placement, placement_id)
            assert placement is not None
            if placement.state == "launching":
                placement.state, placement.instance_id = "running", instance.instance_id
                placement.started_at = self.clock()
                record_lifetime(session, placement)
                record_capacity(session, placement.market_id, placement.started_at, available=True)
        return self._next(move_id)

    def _await_up(self, move_id: int) -> bool:
        move, job = self._load(move_id)
        new = self._placement(move.to_placement_id)
        if self._beat(job, new.epoch) is not None:
            return self._next(move_id)
        return self._wait_or_abort(move, new, "the new placement's agent never started")

    def _stop_old(self, move_id: int) -> bool:
        move, job = self._load(move_id)
        old = self._placement(move.from_placement_id) if move.from_placement_id else None
        if old is not None and old.state == "running" and old.instance_id is not None:
            beat = self._beat(job, old.epoch)
            if beat is None or beat.state not in (AgentState.STOPPED, AgentState.FINISHED):
                loc = job_location(job)
                request_id = f"m{move.id}-stop"
                self._effect(
                    move,
                    "stop-old",
                    lambda _key: send_request(
                        loc, job.name, old.epoch, RequestKind.CHECKPOINT_AND_STOP, self.clock(), request_id
                    ),
                    job=job.name,
                    epoch=old.epoch,
                )
        # A daemon killed after sending the request but before journaling it left an intent; the
        # old agent has stopped since, so the step is not repeated: close that intent instead.
        self._settle(move, "stop-old", "not repeated: the old placement had stopped or ended")
        return self._next(move_id)

    def _await_checkpoint(self, move_id: int) -> bool:
        move, job = self._load(move_id)
        loc = job_location(job)
        old = self._placement(move.from_placement_id) if move.from_placement_id else None
        settled = old is None or old.state != "running" or old.instance_id is None
        if not settled:
            assert old is not None and old.instance_id is not None
            ack = read_acknowledgement(loc, job.name, f"m{move.id}-stop")
            beat = self._beat(job, old.epoch)
            stopped = beat is not None and beat.state in (AgentState.STOPPED, AgentState.FINISHED)
            gone = not self.provider.status(old.instance_id).state.is_live
            waited = (self.clock() - move.updated_at).total_seconds()
            settled = ack is not None or stopped or gone or waited >= self.timeouts.stop_s
            if not settled:
                return False
        newest = trusted_checkpoints(loc, job.name, read_lease(loc, job.name))
        with self.db.session() as session:
            stored = session.get(JobMove, move_id)
            assert stored is not None
            if newest:
                stored.checkpoint_name, stored.checkpoint_step = newest[0].name, newest[0].step
        return self._next(move_id)

    def _terminate_old(self, move_id: int) -> bool:
        move, _job = self._load(move_id)
        if move.from_placement_id is not None:
            # A recovery still finding its old instance up was opened on the cloud's notice (the
            # daemon acts at the next poll, before the reclaim): a preemption, ended by us.
            ended = "noticed" if move.kind == "recover" else "terminated"
            self._terminate(move, move.from_placement_id, "terminate-old", ended)
        return self._next(move_id)

    def _confirm(self, move_id: int) -> bool:
        move, job = self._load(move_id)
        new = self._placement(move.to_placement_id)
        beat = self._beat(job, new.epoch)
        past = move.checkpoint_step if move.checkpoint_step is not None else job.checkpoint_step
        if beat is not None and (
            beat.state is AgentState.FINISHED or (beat.state is AgentState.RUNNING and beat.step > past)
        ):
            self._record_beat(job.id, beat, new.id)
            return self._next(move_id)
        why = (
            "the new placement made no progress"
            if beat is not None
            else "the new placement's agent never reported (does `run` start a script using spotopt.agent?)"
        )
        return self._wait_or_abort(move, new, why, factor=2.0)

    def _wait_or_abort(self, move: JobMove, new: Placement, why: str, factor: float = 1.0) -> bool:
        """Wait while the new placement is alive and within its time; else end the move.

        Once the lease is the new placement's (a start, a recovery, a move past its grant), a
        placement that made no progress is a failed try of the job, which its retry policy
        counts (``jobs.after_failure``) as it counts a training process that fails while
        running: alive past its time (terminated here, so it stops billing) or exited by itself
        before its agent reported progress (whatever its status: ``/bin/true`` exits 0). Left
        to the next round instead, such a job was relaunched for ever, each try billed. A
        placement preempted or gone before it could progress is no fault of the job's: the next
        round places it again, as after a launch refused for capacity."""
        status = self.provider.status(new.instance_id) if new.instance_id is not None else None
        alive = status is not None and status.state.is_live
        waited = (self.clock() - (new.started_at or move.created_at)).total_seconds()
        limit_s = factor * self.timeouts.launch_s
        if alive and waited < limit_s:
            return False
        self._terminate(move, new.id, "terminate-new")
        moved_lease = move.kind != "move" or STEPS["move"].index(move.step) > STEPS["move"].index("grant")
        exited = status is not None and status.state is InstanceState.EXITED
        if not moved_lease or not (alive or exited):
            detail = why if alive else f"{why}: the instance is gone"
            self._finish(move.id, "failed" if moved_lease else "aborted", detail)
            return False
        assert status is not None and new.instance_id is not None
        code = status.exit_code if exited else None
        if code:
            detail = self.exit_reason(code)
        elif exited:
            status_text = "with status 0" if code == 0 else "without an exit status"
            detail = f"{why}: the training process exited {status_text}"
        else:
            detail = f"{why} within {limit_s:g} s ({factor:g} × the launch timeout); terminated"
        log = self.log_path(new.instance_id)
        self._finish(move.id, "failed", detail, tried=True, exit_code=code, log_path=log)
        return False

    def exit_reason(self, exit_code: int) -> str:
        """Why a training process failed, in one line."""
        return f"the training process exited with status {exit_meaning(exit_code)}"

    def log_path(self, instance_id: str) -> str | None:
        """Where the job's output is, when this machine can read it (the local provider's log)."""
        path = getattr(self.provider, "log_path", None)
        return None if path is None else str(path(instance_id))

    def _terminate(self, move: JobMove, placement_id: int, action: str, ended: str = "terminated") -> None:
        placement = self._placement(placement_id)
        if placement.instance_id is not None:
            instance_id = placement.instance_id
            status = self._effect(
                move, action, lambda _key: self.provider.terminate(instance_id), instance=instance_id
            )
            reason = "preempted" if status.state is InstanceState.PREEMPTED else ended
        else:
            reason = ended
        self._end_placement(placement_id, "ended", reason)

    # -- helpers -----------------------------------------------------------------------------

    def _load(self, move_id: int) -> tuple[JobMove, ManagedJob]:
        with self.db.session() as session:
            move = session.get(JobMove, move_id)
            assert move is not None
            job = session.get(ManagedJob, move.job_id)
            assert job is not None
            session.expunge_all()
        return move, job

    def _placement(self, placement_id: int | None) -> Placement:
        with self.db.session() as session:
            placement = session.get(Placement, placement_id)
            assert placement is not None
            session.expunge(placement)
        return placement

    def _end_placement(self, placement_id: int, state: str, reason: str) -> None:
        with self.db.session() as session:
            placement = session.get(Placement, placement_id)
            assert placement is not None
            if placement.state in ("launching", "running"):
                placement.state, placement.end_reason = state, reason
                placement.ended_at = self.clock()
                record_lifetime(session, placement)

    def _beat(self, job: ManagedJob, epoch: int) -> Heartbeat | None:
        return read_heartbeat(job_location(job), job.name, epoch)

    def _record_beat(self, job_id: int, beat: Heartbeat, placement_id: int) -> None:
        """Keep the newest heartbeat's progress on the job row (``jobs show``, the next decision)
        and in the job's progress history (``spotopt.mover.progress``, the dashboard's chart),
        and, from a provider whose instances are the market's machines, its measured steps/s."""
        with self.db.session() as session:
            job = session.get(ManagedJob, job_id)
            placement = session.get(Placement, placement_id)
            assert job is not None and placement is not None
            if beat.steps_per_s and beat.state is AgentState.RUNNING and self.provider.runs_on_market:
                gpu = session.scalar(
                    select(InstanceType.gpu_model)
                    .join(Market, Market.instance_type_id == InstanceType.id)
                    .where(Market.id == placement.market_id)
                )
                if gpu is not None:
                    workload = jobstore.job_spec(job).store_name
                    record_throughput(session, workload, gpu, placement.gpus, beat.steps_per_s, beat.at)
            if job.heartbeat_at is None or beat.at >= job.heartbeat_at:
                # The newest placement's word wins: after a move it restarts from the checkpoint,
                # and whatever the old one did past it is lost.
                job.steps = beat.step
                job.steps_per_s = beat.steps_per_s if beat.steps_per_s is not None else job.steps_per_s
                if beat.last_checkpoint is not None:
                    job.checkpoint_name = beat.last_checkpoint
                    job.checkpoint_step = beat.last_checkpoint_step or 0
                job.heartbeat_at = beat.at
                record_progress(session, job.id, placement.epoch, beat.step, beat.at)

    def _launch_spec(self, job: ManagedJob, spec: Job, move: JobMove, market: MarketKey) -> LaunchSpec:
        """What the provider starts; ``SPOTOPT_MARKET``/``SPOTOPT_GPUS`` tell the job where it runs
        (the replay's stand-in workload progresses at its throughput there). The job's
        ``max_usd_per_hour`` caps its slot, a share (``move.instances``) of an instance: the cap
        on the whole instance the provider hands the cloud is the job's times the jobs on it."""
        assert move.epoch is not None and spec.checkpoint is not None
        every = spec.checkpoint.every
        loc = job_location(job)
        return LaunchSpec(
            job=job.name,
            epoch=move.epoch,
            command=tuple(shlex.split(job.run_command)),
            checkpoint_uri=loc.url,
            checkpoint_every_s=parse_duration(every, "checkpoint.every").total_seconds() if every else None,
            env={
                "SPOTOPT_DATABASE_ID": self.database_id,
                **self.agent_env,
                "SPOTOPT_MARKET": market_label(market),
                "SPOTOPT_GPUS": str(move.gpus),
            },
            workdir=job.workdir,
            tags={
                "spotopt:job": job.name,
                "spotopt:epoch": str(move.epoch),
                "spotopt:move": str(move.id),
                DATABASE_TAG: self.database_id,
            },
            max_usd_per_instance_hour=(
                per_instance(job.max_usd_per_hour, move.price.jobs_per_instance)
                if job.max_usd_per_hour is not None
                else None
            ),
        )

    def _over_budget_for(self, move: JobMove, job: ManagedJob, spec: Job) -> str:
        """Why launching ``move`` would break a budget ('' if it does not): the executor's own
        check, whatever the planner decided (a price may have moved since)."""
        rate = move.price.usd_per_hour
        if job.max_usd_per_hour is not None and rate > job.max_usd_per_hour:
            return f"budget: {usd(rate)}/h is above the job's max_usd_per_hour {usd(job.max_usd_per_hour)}"
        now = self.clock()
        assert move.market_id is not None
        with self.db.session() as session:
            spent = spent_usd(session, job.id, now)
            fleet = fleet_usd_per_hour(session, now)
            cloud = market_key(session, move.market_id).cloud
            egress = price_entry_egress(session, move, spec, now).usd
        # The cloud bills at least its minimum for any start (AWS/GCP 60 s), so that is the least
        # a launch commits to, with the egress of entering the market.
        until = now + timedelta(hours=self.period_h, seconds=spec.restart_s + spec.checkpoint_seconds)
        ahead = interval_cost_usd(cloud, rate, now, until) + egress
        if spent + ahead > job.budget_usd:
            return (
                f"budget: {usd(spent)} spent + {usd(ahead)} for the next period and the move's "
                f"egress would exceed budget_usd {usd(job.budget_usd)}"
            )
        if self.max_usd_per_hour is not None and fleet + rate > self.max_usd_per_hour:
            return (
                f"budget: the fleet would spend {usd(fleet + rate)}/h, above max_usd_per_hour "
                f"{usd(self.max_usd_per_hour)}"
            )
        return ""

    def _mark_unavailable(self, market_id: int) -> None:
        until = self.clock() + timedelta(seconds=self.timeouts.unavailable_s)
        with self.db.session() as session:
            row = session.get(Meta, UNAVAILABLE_KEY)
            marks = json.loads(row.value) if row is not None else {}
            marks[str(market_id)] = until.isoformat()
            if row is None:
                session.add(Meta(key=UNAVAILABLE_KEY, value=json.dumps(marks)))
            else:
                row.value = json.dumps(marks)

    def unavailable_markets(self) -> set[int]:
        """Markets that refused capacity recently (left out of the options until their time)."""
        now = self.clock()
        with self.db.session() as session:
            row = session.get(Meta, UNAVAILABLE_KEY)
            marks = json.loads(row.value) if row is not None else {}
        return {int(m) for m, until in marks.items() if datetime.fromisoformat(until) > now}

    # -- watching running jobs -----------------------------------------------------------------

    def observe(self, job_name: str) -> Observation:
        """Read the current placement's heartbeat and the provider's view of it; end the
        placement when the provider says it is gone. No side effect beyond the database."""
        with self.db.session() as session:
            job = jobstore.find_job(session, job_name)
            placement = session.get(Placement, job.placement_id) if job.placement_id else None
            session.expunge_all()
        if placement is None or placement.state != "running" or placement.instance_id is None:
            return Observation(
                lost=placement is not None and placement.end_reason in PREEMPTION_ENDS | {"lost"}
            )
        loc = job_location(job)
        beat = read_heartbeat(loc, job.name, placement.epoch)
        if beat is not None:
            self._record_beat(job.id, beat, placement.id)
        finished = read_finished(loc, job.name)
        if finished is not None and int(str(finished.get("epoch", -1))) == placement.epoch:
            return Observation(finished=True)
        status = self.provider.status(placement.instance_id)
        if status.state is InstanceState.GONE and self._heard_lately(beat):
            # This provider has no record of the instance (another daemon's local state
            # directory, a listing that lags), yet its agent still writes to the store: the
            # store decides. Declared lost, it would be launched again beside itself.
            log_event("instance-unknown", job=job.name, instance=placement.instance_id, epoch=placement.epoch)
            return Observation()
        # A stop the daemon did not ask for: the agent's reason names a cloud's notice
        # (``spotopt.agent.core``: "<cloud> <kind> notice: …") or SIGTERM; only the first is a
        # preemption.
        stopping = beat is not None and beat.state in (AgentState.STOPPING, AgentState.STOPPED)
        why = (beat.reason or "") if beat is not None else ""
        noticed = stopping and " notice: " in why
        if status.state.is_live:
            return Observation(notice=stopping and not why.startswith("daemon request"))
        if status.state is InstanceState.EXITED and status.exit_code not in (0, None):
            self._end_placement(placement.id, "ended", "exited")
            self._end_billing(job.name, placement.instance_id, status.billing)
            return Observation(
                failed=self.exit_reason(status.exit_code),
                exit_code=status.exit_code,
                log_path=self.log_path(placement.instance_id),
            )
        # Saved on the notice and ended before the cloud reclaimed it ("noticed"): a preemption,
        # billed as an instance we ended (``PREEMPTION_ENDS``).
        reason = "preempted" if status.state is InstanceState.PREEMPTED else "noticed" if noticed else "lost"
        self._end_placement(placement.id, "ended", reason)
        log_event("placement-lost", job=job.name, instance=placement.instance_id, state=str(status.state))
        self._end_billing(job.name, placement.instance_id, status.billing)
        return Observation(lost=True)

    def _heard_lately(self, beat: Heartbeat | None) -> bool:
        """Whether an agent's newest heartbeat says it is alive: training, waiting or stopping,
        written within ``Timeouts.silent_s``."""
        if beat is None or beat.state in (AgentState.STOPPED, AgentState.FINISHED):
            return False
        return (self.clock() - beat.at).total_seconds() < self.timeouts.silent_s

    def _end_billing(self, job: str, instance_id: str, billing: Billing) -> None:
        """Terminate the instance of a placement that just ended when some of it still bills (a
        VM the guest powered off, its disk, an evicted VM's NIC). The placement is ended first:
        a terminate that fails is logged and left to the next round's sweep (``sweep``)."""
        if billing is Billing.NONE:
            return
        if not self.still_leader():
            raise LostLeadership("lost leadership before terminating an ended placement's instance")
        try:
            self.provider.terminate(instance_id)
        except SpotoptError as exc:
            log_event("terminate-ended", job=job, instance=instance_id, outcome="failed", error=str(exc))
            return
        log_event("terminate-ended", job=job, instance=instance_id, bills=str(billing), outcome="done")

    def sweep(self, dry_run: bool = False) -> list[Leftover]:
        """Find what of this database bills with no live placement (``spotopt.mover.sweep``) and,
        unless ``dry_run``, terminate each under the leader's lock; a terminate that fails is
        reported on its leftover (``error``) and tried again at the next sweep."""
        found = find_leftovers(self.db, self.provider, self.clock())
        if dry_run:
            return found
        done = []
        for leftover in found:
            if not self.still_leader():
                raise LostLeadership("lost leadership before terminating a leaked instance")
            try:
                self.provider.terminate(leftover.instance_id)
            except SpotoptError as exc:
                log_event("terminate-leaked", instance=leftover.instance_id, outcome="failed", error=str(exc))
                done.append(replace(leftover, error=str(exc)))
                continue
            with self.db.session() as session:
                outbox.add(
                    session,
                    "daemon.leaked_instance",
                    self.clock(),
                    payload={**leftover.as_row(), "instance": leftover.instance_id},
                    dedupe=f"daemon.leaked_instance:{leftover.cloud}:{leftover.instance_id}",
                )
            log_event(
                "terminate-leaked",
                job=leftover.job,
                instance=leftover.instance_id,
                bills=str(leftover.billing),
                why=leftover.why,
                usd_per_hour=leftover.usd_per_hour,
            )
            done.append(replace(leftover, ended=True))
        return done


def launch_key(database_id: str, job: ManagedJob, move_id: int) -> str:
    """The idempotency key of a move's launch: the job's name (readable in a console), this
    database's id and the job's and move's ids. Move ids restart in every database, and a name
    comes back (a fresh database, a job submitted again): without the database's id a launch
    would be answered with another history's instance (the local provider's record, an EC2
    ``ClientToken`` already used)."""
    return f"{job.name}-{database_id[:12]}-j{job.id}-m{move_id}"


def _open_move(session: Session, job_id: int) -> JobMove | None:
    return session.scalar(select(JobMove).where(JobMove.job_id == job_id, JobMove.outcome.is_(None)))


def open_move_jobs(session: Session) -> set[int]:
    """Ids of the jobs that have a move under way."""
    return set(session.scalars(select(JobMove.job_id).where(JobMove.outcome.is_(None))))


def _move_facts(session: Session, move: JobMove) -> dict[str, Any]:
    """What a notification of ``move`` tells: its kind, where to, at what price, what it saves."""
    return {
        "move": move.kind,
        "to": market_label(market_key(session, move.market_id)) if move.market_id is not None else None,
        "usd_per_hour": move.usd_per_hour,
        "saving_usd": move.saving_usd,
    }


def _state_after(move: JobMove, job: ManagedJob, outcome: str) -> str | None:
    """The job state a finished move leaves behind (None: unchanged)."""
    if move.kind in ("stop", "halt"):
        return move.then_state if outcome == "done" else None
    if outcome == "done":
        return "running"
    if outcome == "aborted":
        return "running" if move.kind == "move" else "pending"
    # failed: a start or recovery found nowhere to run (the next round decides again); a move
    # that failed after the lease moved leaves the job without a placement.
    return "recovering" if move.kind == "move" else "pending"
