"""The daemon's rounds: watch, decide through the one decision core, and hand moves to the executor.

``tick()`` is one reconcile + rebalance round (what ``spotopt daemon run --once`` runs and what
the scheduler runs every planning period); ``poll()`` is the cheap round run every few seconds
(heartbeats, notices, finishing, waiting steps of open moves).

A tick, in order:

1. **Reconcile** (``Executor.sweep``): whatever of this database's instances bills with no
   live placement owning it is terminated (``spotopt.mover.sweep``: a leaked launch, an ended
   placement's stopped VM, an evicted VM's NIC), and every open move is carried on from the
   step its row records.
2. **Watch**: per running job, the heartbeat of its placement and the provider's view: finished
   jobs are stopped and marked done; a vanished or preempted placement is *lost*; a stopping
   agent that nobody asked to stop got a *notice*.
3. **Budgets**: a job whose spend so far plus one more period at the price in effect would pass
   its ``budget_usd`` is checkpointed and stopped (``over-budget``).
4. **Decide**: the jobs without a move under way, their options priced from the SQL history at
   the tick's time (``spotopt.mover.market_view``, the builder ``spotopt plan`` uses; markets
   that refused capacity recently are unavailable), handed to ``spotopt.decide.core.decide`` —
   the function the what-if engine's ``spotopt`` strategy calls. Its memory is kept in the
   ``meta`` table so a restarted daemon decides exactly as before.
5. **Act**: each decided move becomes a ``JobMove`` for the executor, which runs it as far as it
   can go now. ``dry_run`` stops after logging what it would do: no journal, no provider call.

Every decision and side effect is one logfmt line (``spotopt.mover.eventlog``); the tick's
summary is stored in ``daemon_ticks`` for ``spotopt daemon status``.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotopt.clouds.common.base import Provider
from spotopt.db.engine import Database
from spotopt.db.models import DaemonTick, JobMove, ManagedJob, Meta, Placement, Run
from spotopt.db.queries import MarketFilter
from spotopt.decide.core import Memory, decide
from spotopt.decide.fleet import FleetState, Move
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.options import location_index, option_key, price_age_h
from spotopt.errors import one_line
from spotopt.history.throughput_store import stored_figures
from spotopt.jobspec import Job, JobSpec
from spotopt.mover import jobs as jobstore
from spotopt.mover.eventlog import log_event
from spotopt.mover.executor import (
    NO_CAPACITY,
    Executor,
    LostLeadership,
    Observation,
    Timeouts,
    open_move_jobs,
    utcnow,
)
from spotopt.mover.ledger import slot_usd_per_hour, spent_by_job
from spotopt.mover.market_view import MarketView, market_availability, market_view
from spotopt.notify import outbox
from spotopt.notify.deliver import deliver
from spotopt.notify.sinks import Sink
from spotopt.price import SlotPrice
from spotopt.render import usd
from spotopt.times import parse_duration

MEMORY_KEY = "mover_memory"
"""``meta`` row holding the decision core's ``Memory`` (JSON)."""
ACTIVE = ("pending", "running", "recovering")
"""Job states the decision core plans for (the others are under way or final)."""
LAUNCH_ATTEMPTS = 4
"""Decisions per round for a job whose launch was refused for capacity (each tries the
next-best market, the refused ones out); past them the job waits for the next round."""


@dataclass(frozen=True)
class DaemonSettings:
    period_h: float = 1.0
    guardrails: Guardrails = field(default_factory=Guardrails)
    timeouts: Timeouts = field(default_factory=Timeouts)
    billing: str = "instance"
    dry_run: bool = False
    policy: str | None = None
    clouds: tuple[str, ...] | None = None
    """Plan with the markets of these clouds only (None: every market). The CLI leaves out a
    cloud whose provider cannot be built (no credentials, a setting missing)."""
    sinks: tuple[Sink, ...] = ()
    """Where the outbox's events are delivered at the end of each round (``spotopt.notify``)."""
    notify_timeout_s: float = 5.0
    """Seconds one delivery may take (the setting ``notify_timeout_s``)."""
    round_failures: int = 3
    """Rounds failing in a row that are told (the setting ``notify_round_failures``)."""
    prices_stale_h: float | None = None
    """Hours without a successful collector or import run that are told (the setting
    ``notify_prices_stale_h``); None: not watched (the replay, the what-if engine)."""
    recover_at_poll: bool = True
    """Place a job that lost its instance or got a notice at the next poll (seconds), not the
    next tick. The replay turns it off while the what-if engine still places a preempted job
    again only at the next tick (``spotopt.whatif.engine``), so the two keep agreeing."""

    def __post_init__(self) -> None:
        if self.clouds is not None and not self.clouds:  # an empty filter would mean "all"
            raise ValueError("DaemonSettings.clouds: give at least one cloud, or None for every market")

    def market_filter(self) -> MarketFilter | None:
        return None if self.clouds is None else MarketFilter(clouds=list(self.clouds))


@dataclass
class TickReport:
    """What one tick saw and did (stored as the ``daemon_ticks`` summary)."""

    started_at: datetime
    jobs: dict[str, int] = field(default_factory=dict)
    decisions: list[dict[str, Any]] = field(default_factory=list)
    opened: list[int] = field(default_factory=list)
    open_moves: int = 0
    leaked: list[str] = field(default_factory=list)
    """Ids the round's sweep terminated."""
    swept: list[dict[str, Any]] = field(default_factory=list)
    """The sweep's leftovers (``Leftover.as_row``): what billed, why, its $/h, what was done."""
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "decisions": self.decisions,
            "opened_moves": self.opened,
            "open_moves": self.open_moves,
            "leaked": self.leaked,
            "swept": self.swept,
            "notes": self.notes,
        }


class Daemon:
    """One daemon's rounds over ``db`` with ``provider`` (None: dry run, no provider at all)."""

    def __init__(
        self,
        db: Database,
        provider: Provider | None,
        settings: DaemonSettings = DaemonSettings(),
        *,
        clock: Callable[[], datetime] = utcnow,
        still_leader: Callable[[], bool] = lambda: True,
        agent_env: dict[str, str] | None = None,
        failpoint: Callable[[str, str], None] | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock
        self.dry_run = settings.dry_run or provider is None
        self._failing: dict[str, tuple[int, datetime]] = {}
        """Per round (``tick``, ``poll``): how many in a row failed, since when."""
        self.executor = (
            Executor(
                db,
                provider,
                clock=clock,
                still_leader=still_leader,
                agent_env=agent_env,
                timeouts=settings.timeouts,
                period_h=settings.period_h,
                max_usd_per_hour=settings.guardrails.max_usd_per_hour,
                failpoint=failpoint,
            )
            if provider is not None
            else None
        )

    # -- rounds ------------------------------------------------------------------------------

    def poll(self) -> None:
        """The frequent round: carry open moves on, notice finished, lost or warned jobs, stop
        any job a price spike would take past its budget, and place at once the jobs that must
        be placed (a notice, a lost instance, a job never started): through the same decision
        as a tick, acting on those jobs' moves only (voluntary moves wait for the period)."""
        if self.executor is None or self.dry_run:
            return
        self.executor.advance_all()
        observed = self._watch()
        for name, obs in observed.items():
            if obs.finished or obs.failed or obs.lost or obs.notice:
                observed[name] = self._react(name, obs)
        # Budgets every poll, not only every period: a price spike is caught within seconds.
        self._enforce_budgets()
        if self.settings.recover_at_poll and self._must_place(observed):
            self._place(TickReport(self.clock()), observed, forced_only=True)
        self.executor.advance_all()
        self.notify()

    def tick(self) -> TickReport:
        """One reconcile + rebalance round (see the module docstring)."""
        now = self.clock()
        report = TickReport(now)
        tick_id = None if self.dry_run else self._begin_tick(now)  # a dry run writes nothing
        if self.executor is not None and not self.dry_run:
            swept = self.executor.sweep()
            report.leaked = [leftover.instance_id for leftover in swept if leftover.ended]
            report.swept = [leftover.as_row() for leftover in swept]
            self.executor.advance_all()
        observed = self._watch()
        for name, obs in observed.items():
            observed[name] = self._react(name, obs)
        if not self.dry_run:
            self._stop_cancelled()
            self._enforce_budgets()
        self._place(report, observed)
        if self.executor is not None and not self.dry_run:
            report.open_moves = self.executor.advance_all()
        with self.db.session() as session:
            rows = session.execute(select(ManagedJob.state, func.count()).group_by(ManagedJob.state)).all()
            report.jobs = {str(state): int(n) for state, n in rows}
            if tick_id is not None:
                tick = session.get(DaemonTick, tick_id)
                assert tick is not None
                tick.finished_at = self.clock()
                tick.summary = json.dumps(report.to_dict(), default=str)
        for note in report.notes:
            log_event("warning", note=note)
        if not self.dry_run:
            self._check_prices(now)
            self.notify()
        log_event(
            "tick",
            dry_run=self.dry_run,
            decisions=len(report.decisions),
            opened=len(report.opened),
            open_moves=report.open_moves,
            jobs=" ".join(f"{k}:{v}" for k, v in sorted(report.jobs.items())),
        )
        return report

    def notify(self) -> None:
        """The round's last, bounded step: deliver the outbox's events to the sinks
        (``spotopt.notify.deliver``); a sink that is down costs at most one timeout and never
        fails the round."""
        for outcome in deliver(
            self.db, self.settings.sinks, self.clock(), timeout_s=self.settings.notify_timeout_s
        ):
            if outcome.delivered or outcome.failed:
                log_event("notify", sink=outcome.sink, delivered=outcome.delivered, failed=outcome.failed)

    def round_ended(self, name: str, error: BaseException | None) -> None:
        """The scheduler's report of round ``name``: a failure is counted, and the
        ``round_failures``-th in a row is told (``daemon.rounds_failing``), once per run; a lost
        leadership is told at once (``daemon.leadership_lost``). Telling is best effort: the
        database may be what fails."""
        if error is None:
            self._failing.pop(name, None)
            return
        now = self.clock()
        if isinstance(error, LostLeadership):
            kind, facts, dedupe = "daemon.leadership_lost", {}, None
        else:
            count, since = self._failing.get(name, (0, now))
            self._failing[name] = (count + 1, since)
            if count + 1 != self.settings.round_failures:
                return
            kind, facts = "daemon.rounds_failing", {"round": name, "failures": count + 1}
            dedupe = f"daemon.rounds_failing:{socket.gethostname()}:{os.getpid()}:{name}:{since.isoformat()}"
        facts.update(host=socket.gethostname(), pid=os.getpid(), reason=one_line(error))
        try:
            with self.db.session() as session:
                outbox.add(session, kind, now, payload=facts, dedupe=dedupe)
        except Exception as exc:  # the database itself may be why the round failed
            log_event("notify-failed", kind=kind, error=one_line(exc))

    def _check_prices(self, now: datetime) -> None:
        """Tell, once per newest run, that no collector or import has succeeded for
        ``prices_stale_h`` (a history that never had a run is not watched)."""
        if self.settings.prices_stale_h is None:
            return
        with self.db.session() as session:
            newest = session.execute(
                select(Run.id, Run.source, Run.finished_at)
                .where(Run.status == "ok", Run.finished_at.is_not(None))
                .order_by(Run.finished_at.desc(), Run.id.desc())
                .limit(1)
            ).first()
            if newest is None or now - newest.finished_at < timedelta(hours=self.settings.prices_stale_h):
                return
            facts = {
                "reason": f"no collector or import has succeeded since {newest.finished_at:%Y-%m-%dT%H:%MZ}",
                "last_run": newest.source,
                "last_run_at": newest.finished_at,
            }
            outbox.add(
                session, "daemon.prices_stale", now, payload=facts, dedupe=f"daemon.prices_stale:{newest.id}"
            )

    # -- watching ----------------------------------------------------------------------------

    def _watch(self) -> dict[str, Observation]:
        """Observations of every running job without a move under way (read-only in a dry run)."""
        with self.db.session() as session:
            busy = open_move_jobs(session)
            names = [
                j.name
                for j in session.scalars(select(ManagedJob).where(ManagedJob.state == "running"))
                if j.id not in busy
            ]
        if self.executor is None or self.dry_run:
            return {}
        observed = {}
        for name in names:
            try:
                observed[name] = self.executor.observe(name)
            except LostLeadership:
                raise
            except Exception as exc:  # one job's store must not blind the daemon to the others
                self.executor.job_fault(name, exc)
                continue
            self.executor.job_ok(name)
        return observed

    def _react(self, name: str, obs: Observation) -> Observation:
        """Finished jobs are stopped and done. A job whose training process failed is retried
        from its newest verified checkpoint as its ``retry`` policy says (then it is *lost*, as
        the observation returned says, and placed again like a preempted job), else failed."""
        assert self.executor is not None
        if obs.finished:
            self.executor.open_move(
                name, "stop", "finished: the agent marked the job complete", then_state="done"
            )
        elif obs.failed:
            assert obs.exit_code is not None
            with self.db.session() as session:
                job = session.scalar(select(ManagedJob).where(ManagedJob.name == name).with_for_update())
                assert job is not None
                if job.state != "running":
                    return obs
                after = jobstore.after_failure(
                    session, job, obs.failed, obs.exit_code, self.clock(), obs.log_path
                )
            log_event("job-retry" if after == "recovering" else "job-failed", job=name, reason=obs.failed)
            if after == "recovering":
                return Observation(lost=True)
        return obs

    def _stop_cancelled(self) -> None:
        """A cancelled job's move under way is abandoned (its new instance terminated: a start
        must not run on until its launch times out), and a placement that still runs is
        checkpointed and stopped, or terminated at once (a ``halt``) when the cancellation said
        so (``jobs cancel --now``: a stop already under way is abandoned for it)."""
        assert self.executor is not None
        with self.db.session() as session:
            cancelled = list(session.scalars(select(ManagedJob).where(ManagedJob.state == "cancelled")))
            at_once = {job.id for job in cancelled if jobstore.cancelled_at_once(session, job)}
            abandoned = [
                move.id
                for move in session.scalars(
                    select(JobMove).where(
                        JobMove.job_id.in_([job.id for job in cancelled]), JobMove.outcome.is_(None)
                    )
                )
                if move.kind not in ("stop", "halt") or (move.kind == "stop" and move.job_id in at_once)
            ]
        for move_id in abandoned:
            self.executor.abandon(move_id, "cancelled: the job was cancelled while this move was under way")
        with self.db.session() as session:
            busy = open_move_jobs(session)
            stopping = [
                (job.name, job.id in at_once)
                for job, placement in session.execute(
                    select(ManagedJob, Placement)
                    .join(Placement, Placement.id == ManagedJob.placement_id)
                    .where(ManagedJob.state == "cancelled", Placement.state.in_(("launching", "running")))
                )
                if job.id not in busy
            ]
        for name, now in stopping:
            if now:
                self.executor.open_move(name, "halt", "cancelled at once: terminating its placement")
            else:
                self.executor.open_move(name, "stop", "cancelled: stopping its placement")

    def _enforce_budgets(self) -> None:
        """Stop, checkpointed, every running job that one more period would take past its budget."""
        assert self.executor is not None
        now = self.clock()
        with self.db.session() as session:
            busy = open_move_jobs(session)
            running = [
                j
                for j in session.scalars(select(ManagedJob).where(ManagedJob.state == "running"))
                if j.id not in busy
            ]
            spent_by = spent_by_job(session, [j.id for j in running], now)
            over = []
            crossed: list[tuple[ManagedJob, int, float]] = []
            for job in running:
                placement = session.get(Placement, job.placement_id) if job.placement_id else None
                if placement is None or placement.state != "running" or placement.started_at is None:
                    continue
                spec = jobstore.job_spec(job)
                rate = slot_usd_per_hour(session, placement, now, now)
                spent = spent_by[job.id]
                crossed += [(job, p, spent) for p in BUDGET_THRESHOLDS if spent >= job.budget_usd * p / 100.0]
                ahead = rate * (self.settings.period_h + spec.checkpoint_seconds / 3600.0)
                if spent + ahead > job.budget_usd:
                    over.append((job.name, spent, ahead, job.budget_usd))
            _budget_thresholds(session, crossed, now)
        for name, spent, ahead, budget in over:
            self.executor.open_move(
                name,
                "stop",
                f"budget: {usd(spent)} spent + {usd(ahead)} for the next period would exceed "
                f"budget_usd {usd(budget)}",
                then_state="over-budget",
            )

    # -- deciding ----------------------------------------------------------------------------

    def _must_place(self, observed: dict[str, Observation]) -> bool:
        """Whether a poll has a forced placement to make: a running job lost its instance or got
        a notice, or a job waits that no round has tried to place yet (a job whose start or
        recovery failed waits for the next tick: each round already tried every market that
        was open, ``_place``)."""
        if any(obs.lost or obs.notice for obs in observed.values()):
            return True
        with self.db.session() as session:
            tried = select(JobMove.job_id)
            return (
                session.scalar(
                    select(func.count())
                    .select_from(ManagedJob)
                    .where(ManagedJob.state == "pending", ManagedJob.id.not_in(tried))
                )
                or 0
            ) > 0

    def _place(
        self, report: TickReport, observed: dict[str, Observation], *, forced_only: bool = False
    ) -> None:
        """Decide and launch; a launch refused for capacity is decided again at once with that
        market out (``Executor.unavailable_markets``), up to ``LAUNCH_ATTEMPTS`` decisions a
        round, so the job goes to the next-best market in the same round."""
        retry: set[str] | None = None
        for _ in range(LAUNCH_ATTEMPTS):
            opened = self._decide(report, observed, forced_only=forced_only, only=retry)
            if self.executor is None or self.dry_run or not opened:
                return
            self.executor.advance_all()
            with self.db.session() as session:
                retry = set(
                    session.scalars(
                        select(ManagedJob.name)
                        .join(JobMove, JobMove.job_id == ManagedJob.id)
                        .where(JobMove.id.in_(opened), JobMove.detail.like(f"{NO_CAPACITY}%"))
                    )
                )
            if not retry:
                return

    def _decide(
        self,
        report: TickReport,
        observed: dict[str, Observation],
        *,
        forced_only: bool = False,
        only: set[str] | None = None,
    ) -> list[int]:
        """Decide for every job through the core; act on the moves of ``only`` (None: all), and
        with ``forced_only`` on forced placements only. The moves opened."""
        now = self.clock()
        with self.db.session() as session:
            busy = open_move_jobs(session)
            jobs = [
                j
                for j in session.scalars(
                    select(ManagedJob).where(ManagedJob.state.in_(ACTIVE)).order_by(ManagedJob.id)
                )
                if j.id not in busy and not observed.get(j.name, Observation()).finished
            ]
            if not jobs:
                return []
            specs = [_absolute_deadline(jobstore.job_spec(j), j.created_at) for j in jobs]
            current = {
                p.id: p
                for p in session.scalars(
                    select(Placement)
                    .join(ManagedJob, ManagedJob.placement_id == Placement.id)
                    .where(ManagedJob.state.in_(ACTIVE))
                )
            }
            placements = {j.id: current.get(j.placement_id) for j in jobs if j.placement_id is not None}
            locations: list[tuple[str, str]] = []
            view = market_view(
                session,
                JobSpec(jobs=specs),
                now,
                locations,
                stored_figures(session),
                period_h=self.settings.period_h,
                billing=self.settings.billing,
                flt=self.settings.market_filter(),
            )
            state = self._fleet_state(session, jobs, specs, placements, view, locations, observed, now)
            memory = self._memory(session)
            refused = self._refused(view)
            running = np.isin(
                [m.quote.market_id for m in view.markets],
                [p.market_id for p in current.values() if p.state == "running"],
            )
            availability = market_availability(
                session, view.markets, now, self.settings.period_h, refused, running
            )
        if not view.markets:
            report.notes.append(
                "no market has a price in this history, so no job can be placed: "
                "`spotopt collect`, `spotopt import` or the example prices "
                "(`spotopt import csv data/examples/prices.csv`) bring some"
            )
        opts = replace(self._without(view, refused), availability=availability)
        guard = self.settings.guardrails.with_jobs(specs)
        known = len(memory.notes)
        for why in view.table.no_option.values():  # an active job nothing can place: why, once
            if why not in memory.notes:
                memory.notes.append(why)
        moves = decide(state, opts, guard, memory, self.settings.policy)
        report.notes.extend(memory.notes[known:])  # each said once (a job set aside, a fallback)
        if not self.dry_run:
            with self.db.session() as session:
                _save_memory(session, memory)
        opened: list[int] = []
        for mv in moves:
            if forced_only and not state.forced[mv.job]:
                continue
            if only is not None and state.names[mv.job] not in only:
                continue
            move_id = self._act(report, jobs[mv.job], placements.get(jobs[mv.job].id), mv, view, opts)
            if move_id is not None:
                opened.append(move_id)
        return opened

    def _fleet_state(
        self,
        session: Session,
        jobs: list[ManagedJob],
        specs: list[Job],
        placements: dict[int, Placement | None],
        view: MarketView,
        locations: list[tuple[str, str]],
        observed: dict[str, Observation],
        now: datetime,
    ) -> FleetState:
        """The managed jobs as the decision core sees them (the what-if adapter's twin)."""
        table = view.table
        market_index = {m.quote.market_id: i for i, m in enumerate(view.markets)}
        n = len(jobs)
        option = np.full(n, -1, dtype=np.int64)
        location = np.full(n, -1, dtype=np.int64)
        remaining = table.work_steps.astype(float).copy()
        dwell = np.zeros(n)
        lost = np.zeros(n, dtype=bool)
        notice = np.zeros(n, dtype=bool)
        spent_by = spent_by_job(session, [job.id for job in jobs], now)
        spent = np.array([spent_by[job.id] for job in jobs], dtype=float)
        for j, job in enumerate(jobs):
            placement = placements.get(job.id)
            obs = observed.get(job.name, Observation())
            done_steps = (
                job.checkpoint_step if obs.lost or placement is None else max(job.steps, job.checkpoint_step)
            )
            remaining[j] -= done_steps
            if placement is None:
                continue
            market = (
                view.markets[market_index[placement.market_id]]
                if placement.market_id in market_index
                else None
            )
            if market is not None:
                location[j] = location_index(locations, market.quote.cloud, market.quote.region)
            live = placement.state == "running"
            if live or obs.lost:
                option[j] = int(
                    option_key(np.array([placement.market_id]), np.array([j]), np.array([placement.gpus]))[0]
                )
                lost[j] = obs.lost or not live
                notice[j] = obs.notice
                if placement.started_at is not None:
                    dwell[j] = (now - placement.started_at).total_seconds() / 3600.0
        data_loc = [
            -1
            if s.dataset is None or s.dataset.gb == 0
            else location_index(locations, s.dataset.cloud, s.dataset.region)
            for s in specs
        ]
        return FleetState(
            names=tuple(j.name for j in jobs),
            locations=tuple(locations),
            option=option,
            location=location,
            remaining_steps=remaining,
            dwell_h=dwell,
            since_checkpoint_h=np.zeros(n),
            deadline_h=table.deadline_hours.copy(),
            notice=notice,
            lost=lost,
            spent_usd=spent,
            restart_h=np.array([s.restart_s / 3600.0 for s in specs]),
            save_h=np.array([s.checkpoint_seconds / 3600.0 for s in specs]),
            checkpoint_gb=np.array([s.checkpoint_gb for s in specs]),
            dataset_gb=np.array([s.dataset.gb if s.dataset else 0.0 for s in specs]),
            dataset_location=np.asarray(data_loc, dtype=np.int64),
            clock_h=now.timestamp() / 3600.0,
        )

    def _refused(self, view: MarketView) -> Any:
        """Per market of ``view``: a launch there was refused recently (``Executor.unavailable_markets``)."""
        marks = self.executor.unavailable_markets() if self.executor is not None else set()
        return np.isin([m.quote.market_id for m in view.markets], list(marks))

    @staticmethod
    def _without(view: MarketView, refused: Any) -> Any:
        """The view's options with the ``refused`` markets priced NaN (unavailable): the move
        test of jobs the capacity rule does not decide must not pick them again either."""
        opts = view.options
        if not refused.any():
            return opts
        return replace(opts, usd_per_hour=np.where(refused[opts.market], np.nan, opts.usd_per_hour))

    def _act(
        self,
        report: TickReport,
        job: ManagedJob,
        placement: Placement | None,
        mv: Move,
        view: MarketView,
        opts: Any,
    ) -> int | None:
        e = int(opts.position(np.array([mv.to]))[0])
        market = view.markets[int(opts.market[e])]
        info = view.table.infos[int(np.searchsorted(view.table.key, mv.to))]
        # A live placement is moved (make-before-break), a preempted one recovered; a job with
        # nothing running is started.
        reason = mv.reason
        if mv.reason == "preempted" and placement is not None:
            kind = "recover"
            # The core calls every lost placement preempted; one whose training process exited
            # (an OOM kill's 137, a crash) is placed again by its retry policy: say so.
            reason = "retry" if placement.end_reason == "exited" else reason
        elif placement is not None and placement.state == "running":
            kind = "move"
        else:
            kind = "start"
        price = SlotPrice(float(opts.usd_per_hour[e]), info.slots)
        decision = {
            "job": job.name,
            "kind": kind,
            "reason": reason,
            "to": market.label,
            "gpus": info.gpus,
            "usd_per_hour": price.usd_per_hour,
            "saving_usd": mv.saving_usd,
            "cost_usd": mv.cost_usd,
        }
        report.decisions.append(decision)
        log_event("decide", dry_run=self.dry_run, **decision)
        age_h = price_age_h(market.quote.observed_at, self.clock())
        if age_h > self.settings.guardrails.max_price_age_h:  # the core took it: no fresh price
            report.notes.append(
                f"{job.name}: {market.label}'s price was last observed {market.quote.observed_at:%Y-%m-%d} "
                f"({age_h / 24:,.0f} days ago, over the setting price_max_age_days) and the job has no "
                "fresher one; refresh prices with `spotopt collect` or `spotopt import`"
            )
        if self.dry_run or self.executor is None:
            return None
        move_id = self.executor.open_move(
            job.name,
            kind,
            f"{reason}: {market.label}",
            market_id=market.quote.market_id,
            gpus=info.gpus,
            price=price,
            saving_usd=mv.saving_usd,
            cost_usd=mv.cost_usd,
        )
        if move_id is not None:
            report.opened.append(move_id)
        return move_id

    # -- records -----------------------------------------------------------------------------

    def _begin_tick(self, now: datetime) -> int:
        with self.db.session() as session:
            tick = DaemonTick(
                started_at=now, host=socket.gethostname(), pid=os.getpid(), dry_run=self.dry_run
            )
            session.add(tick)
            session.flush()
            return tick.id

    def _memory(self, session: Session) -> Memory:
        row = session.get(Meta, MEMORY_KEY)
        return Memory.from_dict(json.loads(row.value)) if row is not None else Memory()


BUDGET_THRESHOLDS = (50, 80)
"""Percentages of a job's budget whose crossing is told (``budget.threshold``); 100 % is told
when the job is stopped at its budget (``jobs.record_transition``)."""


def _budget_thresholds(session: Session, crossed: list[tuple[ManagedJob, int, float]], now: datetime) -> None:
    """Tell of each budget threshold reached (job, percent, spent), once per budget: the ones
    already told are read in one query for the whole round."""
    told = outbox.written(session, [jobstore.budget_dedupe(job, percent) for job, percent, _ in crossed])
    for job, percent, spent in crossed:
        dedupe = jobstore.budget_dedupe(job, percent)
        if dedupe in told:
            continue
        outbox.add(
            session,
            "budget.threshold",
            now,
            job=job,
            payload={"percent": percent, "spent_usd": round(spent, 6), "budget_usd": job.budget_usd},
            dedupe=dedupe,
        )


def _save_memory(session: Session, memory: Memory) -> None:
    row = session.get(Meta, MEMORY_KEY)
    value = json.dumps(memory.to_dict())
    if row is None:
        session.add(Meta(key=MEMORY_KEY, value=value))
    else:
        row.value = value


def _absolute_deadline(spec: Job, submitted: datetime) -> Job:
    """A relative deadline (``5d``) counts from the job's submission, not from each tick."""
    if isinstance(spec.deadline, str):
        return spec.model_copy(update={"deadline": submitted + parse_duration(spec.deadline, "deadline")})
    return spec
