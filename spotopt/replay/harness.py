"""Fidelity: the real daemon on a replayed market, on a simulated clock, against the what-if.

``fidelity(history, request, workdir)`` runs the what-if engine (strategy ``spotopt``) and then
the real daemon (executor, journal, agents, checkpoints, ``local`` processes) from the same
start over the same price history, and compares per job what each paid, when the job finished,
how often it moved and how often it was preempted.

- The daemon works on a **throwaway copy** of the history (``copy_history``: a temporary SQLite
  database holding the markets, prices, interruptions and throughputs, and none of the source's
  managed jobs), so a replayed ledger never mixes with real money and the source is not touched.
- Every job runs as the stand-in workload (``spotopt.replay.standin``): a real process that
  trains at the job's throughput on its market's GPUs in simulated time, the figures being the
  ones the what-if engine simulates for the same option (same builder, same checkpoint interval).
- Time is a ``SimClock`` file. ``LockStep`` advances it only when the daemon's round is done
  and every live process has acknowledged the newest clock generation, straight to the next
  planning round, the earliest event a process announced (a checkpoint written, the work
  done) or the next preemption. Process start-up and I/O take real time but no simulated time.
- Preemptions come from the what-if's own table (``--preemptions none|model|replay --seed S``,
  ``spotopt.whatif.preemptions``): at a notice time every instance on that market launched
  before it gets the cloud's notice (``LocalProvider.notify``: the agent checkpoints and
  stops), and ``NOTICE_S`` later whatever still runs there is reclaimed (killed).
"""

from __future__ import annotations

import itertools
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from sqlalchemy import select

from spotopt.checkpoints import read_heartbeat, read_lease
from spotopt.clouds.common.base import market_label
from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import Base, JobEvent, JobMove, ManagedJob, Placement
from spotopt.decide.guardrails import Guardrails
from spotopt.errors import InputError
from spotopt.history.setup import open_history
from spotopt.jobspec import JobSpec
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.mover.executor import Timeouts, job_location
from spotopt.mover.ledger import intervals, total_usd
from spotopt.mover.observed import PREEMPTION_ENDS
from spotopt.replay.standin import Rates
from spotopt.settings import Settings
from spotopt.simclock import CLOCK_ENV, SimClock
from spotopt.types import MarketKey, MarketKind
from spotopt.whatif.preemptions import NOTICE_S, PreemptionMode
from spotopt.whatif.replay import ReplayRequest, ReplayResult, replay
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]
MOVER_TABLES = frozenset(
    {
        "managed_jobs",
        "job_events",
        "job_progress",
        "placements",
        "job_moves",
        "journal",
        "daemon_ticks",
        "meta",
    }
)
"""The daemon's own state: never copied into the replay (it starts with no jobs and no memory)."""
EPS_S = 1e-6
WAIT_LIMIT_S = 120.0
"""Real seconds a process may take to act on one clock generation (only a broken build waits so long)."""
AGENT_ENV = {"SPOTOPT_POLL_EVERY": "0.02s", "SPOTOPT_HEARTBEAT_EVERY": "0.001s"}
"""Agents poll every 20 ms of real time and write a heartbeat whenever simulated time moved on
(a millisecond: announced events can be a fraction of a second apart, e.g. the first step
after a restart, which is what confirms a move)."""
REPLAY_BUDGET_USD = 1e9
"""A job without ``budget_usd`` is replayed unbounded (the what-if engine has no budgets)."""
COLUMNS = (
    "job",
    "predicted_cost_usd",
    "predicted_egress_usd",
    "realised_cost_usd",
    "cost_diff",
    "predicted_finish_hours",
    "realised_finish_hours",
    "finish_diff",
    "predicted_moves",
    "realised_moves",
    "predicted_preemptions",
    "realised_preemptions",
    "failed_moves",
)


@dataclass(frozen=True)
class FidelityRequest:
    spec: JobSpec
    start: datetime | None = None
    preemptions: PreemptionMode = PreemptionMode.NONE
    seed: int = 0
    tick_h: float = 1.0
    until: datetime | None = None
    """Stop the replayed daemon here (default: the what-if's window, long enough for every job)."""


@dataclass(frozen=True)
class Notice:
    """One market's preemption in the replay: the notice, and the reclaim ``NOTICE_S`` later
    (simulated seconds since the epoch)."""

    market_id: int
    at: float
    reclaim_at: float


def notices(tl: Timeline, events: Array) -> list[Notice]:
    """The preemption table as notices in time order (the same times the engine simulates)."""
    out = []
    for m, t in zip(*np.nonzero(np.isfinite(events)), strict=True):
        quote = tl.markets[int(m)].quote
        at = tl.time(float(t) + float(events[m, t])).timestamp()
        out.append(Notice(quote.market_id, at, at + NOTICE_S[quote.cloud]))
    return sorted(out, key=lambda n: (n.at, n.market_id))


@dataclass
class Fidelity:
    whatif: ReplayResult
    rows: list[dict[str, Any]]
    rounds: int
    real_seconds: float


@dataclass
class ReplayedDaemon:
    """What ``replay_daemon`` ran: the what-if it was fed from, and per job what the daemon did."""

    whatif: ReplayResult
    realised: dict[str, Realised]
    rounds: int
    real_seconds: float
    database: Path
    """The replay's own SQLite database (its ledger: ``spotopt --db sqlite:///… jobs cost``)."""
    ended: datetime
    """The simulated time the replay stopped at (every job final, or the window's end)."""


RoundHook = Callable[[datetime, datetime, datetime], None]
"""``on_round(simulated now, start, end)`` after each daemon round (progress displays)."""


def fidelity(
    history: Database,
    request: FidelityRequest,
    workdir: Path,
    on_round: RoundHook | None = None,
) -> Fidelity:
    """Run the what-if and the replayed daemon (see the module docstring); rows per job."""
    run = replay_daemon(history, request, workdir, on_round)
    return Fidelity(run.whatif, compare(run.whatif, run.realised), run.rounds, run.real_seconds)


def replay_daemon(
    history: Database,
    request: FidelityRequest,
    workdir: Path,
    on_round: RoundHook | None = None,
) -> ReplayedDaemon:
    """The real daemon on ``history`` replayed from ``request.start`` in ``workdir`` (its own
    database, checkpoint store and processes' logs), fed the what-if's figures and preemptions."""
    began = time.monotonic()
    result = replay(
        history,
        ReplayRequest(
            spec=request.spec,
            start=request.start,
            strategies=("spotopt",),
            preemptions=request.preemptions,
            seed=request.seed,
            tick_h=request.tick_h,
        ),
    )
    start = result.first_start
    end = start + timedelta(hours=result.window_hours)
    if request.until is not None:
        if request.until <= start:
            raise InputError(f"--until {request.until.isoformat()}: not after the start {start.isoformat()}")
        end = min(end, request.until)
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "replay.sqlite"
    db = copy_history(history, path)
    try:
        clock = SimClock(workdir / "clock" / "now.json", start)
        for j, job in enumerate(result.request.spec.jobs):
            rates = workdir / f"{job.name}.rates.json"
            job_rates(result, j).dump(rates)
            jobstore.submit(db, _managed_spec(job.model_dump(mode="json"), rates, workdir), now=start)
        capacity = replayed_capacity(result.timeline, clock.now)
        provider = LocalProvider(workdir / "local", grace_s=5.0, capacity=capacity)
        guard = Guardrails(period_h=request.tick_h)
        # The what-if engine places a preempted job again at the next tick, and a market that
        # refused a launch is out for the rest of the tick: the replayed daemon does the same
        # (``DaemonSettings.recover_at_poll``, ``Timeouts.unavailable_s``) to stay comparable.
        timeouts = Timeouts(unavailable_s=request.tick_h * 3600.0)
        settings = DaemonSettings(
            period_h=request.tick_h, guardrails=guard, timeouts=timeouts, recover_at_poll=False
        )
        env = {**AGENT_ENV, CLOCK_ENV: str(clock.path)}
        daemon = Daemon(db, provider, settings, clock=clock.now, agent_env=env)
        cloud = notices(result.timeline, result.events)
        stepper = LockStep(db, daemon, provider, clock, request.tick_h, cloud)
        hook = None if on_round is None else (lambda now: on_round(now, start, end))
        try:
            rounds = stepper.run(end, hook)
        finally:
            for instance in provider.list_instances():
                provider.terminate(instance.instance_id)
        _end_open_placements(db, clock.now())
        realised = realised_by_job(db, start, clock.now())
    finally:
        db.dispose()
    return ReplayedDaemon(result, realised, rounds, time.monotonic() - began, path, clock.now())


def replayed_capacity(tl: Timeline, now: Callable[[], datetime]) -> Callable[[MarketKey], bool] | None:
    """The recorded availability as the replay's cloud capacity (``LocalProvider``'s
    ``capacity``): a market with observations launches only while the engine's ``Capacity.up``
    says so at the tick of ``now``; ``None`` when nothing was observed (``--preemptions`` other
    than ``replay`` load no capacity)."""
    cap = tl.capacity
    if cap is None or not cap.observed.any():
        return None
    index = {
        (q.cloud, q.region, q.zone, q.instance_type, q.market): k
        for k, q in enumerate(m.quote for m in tl.markets)
    }

    def available(market: MarketKey) -> bool:
        k = index.get((market.cloud, market.region, market.zone, market.instance_type, market.kind))
        if k is None or not cap.observed[k]:
            return True
        t = math.floor((now() - tl.start).total_seconds() / 3600.0 / tl.tick_h + 1e-9)
        return bool(cap.up[k, min(max(t, 0), tl.n_ticks - 1)])

    return available


def _end_open_placements(db: Database, at: datetime) -> None:
    """End what still ran when the replay stopped at simulated time ``at`` (``replay-end``), so
    the replay's ledger read later (``jobs cost``) bills up to ``at``, not up to the real now."""
    with db.session() as session:
        for p in session.scalars(select(Placement).where(Placement.state.in_(("launching", "running")))):
            p.state, p.end_reason, p.ended_at = "ended", "replay-end", at


def copy_history(source: Database, path: Path) -> Database:
    """A new SQLite database at ``path`` with ``source``'s history and none of its mover state."""
    db = open_history(f"sqlite:///{path}", Settings(auto_migrate=True))
    tables = [t for t in Base.metadata.sorted_tables if t.name not in MOVER_TABLES]
    with source.engine.connect() as src, db.engine.begin() as dst:
        for table in reversed(tables):  # the migrations seed some (the catalog): the source's win
            dst.execute(table.delete())
        for table in tables:
            rows = [dict(r) for r in src.execute(table.select()).mappings()]
            if rows:
                dst.execute(table.insert(), rows)
    return db


def job_rates(result: ReplayResult, j: int) -> Rates:
    """Job ``j``'s stand-in figures: the what-if engine's own per option (speed, checkpoint interval)."""
    sim, tl = result.jobs, result.timeline
    job = sim.jobs[j]
    options = {}
    for e in range(int(sim.bounds()[j]), int(sim.bounds()[j + 1])):
        q = tl.markets[int(sim.market[e])].quote
        label = market_label(MarketKey(q.cloud, q.region, q.zone, q.instance_type, MarketKind(q.market)))
        options[f"{label}|{int(sim.gpus[e])}"] = {
            "steps_per_s": float(sim.steps_per_hour[e]) / 3600.0,
            "tau_s": float(sim.tau_h[e]) * 3600.0,
        }
    return Rates(float(sim.work[j]), float(job.restart_s), float(job.checkpoint_seconds), options)


def _managed_spec(job: dict[str, Any], rates: Path, workdir: Path) -> str:
    """The what-if job as a managed job run by the stand-in workload (YAML text)."""
    managed = {k: v for k, v in job.items() if v is not None}
    managed["run"] = f"{sys.executable} -m spotopt.replay.standin {rates}"
    managed["checkpoint"] = {"uri": f"file://{workdir / 'store'}"}
    managed.setdefault("budget_usd", REPLAY_BUDGET_USD)
    return yaml.safe_dump({"jobs": [managed]}, sort_keys=False)


class LockStep:
    """Drives the daemon's rounds on the simulated clock (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        daemon: Daemon,
        provider: LocalProvider,
        clock: SimClock,
        period_h: float,
        preemptions: Sequence[Notice] = (),
    ) -> None:
        self.db, self.daemon, self.provider, self.clock = db, daemon, provider, clock
        self.period = timedelta(hours=period_h)
        self.notices = sorted(preemptions, key=lambda n: n.at)
        self.reclaims: list[tuple[float, str]] = []
        """(simulated time, instance id) of the instances under notice, in time order."""

    def run(self, end: datetime, on_round: Callable[[datetime], None] | None = None) -> int:
        """Rounds until every job is final or ``end``; the number of rounds."""
        next_tick = self.clock.now()
        rounds = 0
        while True:
            now = self.clock.now()
            tick = now >= next_tick - timedelta(seconds=EPS_S)
            if tick:
                next_tick += self.period
            self._preempt(now.timestamp())
            self._round(tick)
            rounds += 1
            if on_round is not None:
                on_round(now)
            if self._all_final() or now >= end:
                return rounds
            upcoming = [e for e in self._next_events() if e > now.timestamp() + EPS_S]
            cloud = [n.at for n in self.notices[:1]] + [at for at, _ in self.reclaims[:1]]
            at = min([next_tick.timestamp(), end.timestamp(), *upcoming, *cloud])
            self.clock.advance_to(datetime.fromtimestamp(at, now.tzinfo))

    def _preempt(self, now: float) -> None:
        """What the clouds do at ``now``: reclaim the instances whose notice ran out, then give
        notice to every live instance on a preempted market launched before the notice. The
        processes then act on it in the round that follows (the clock's new generation)."""
        acted = False
        if self.reclaims and self.reclaims[0][0] <= now + EPS_S:
            # The processes act on this time first: a write that ends exactly at the reclaim is
            # done, as the engine counts it (``save_h <= notice_h``), whatever the real timing.
            self._await_processes()
        while self.reclaims and self.reclaims[0][0] <= now + EPS_S:
            _, instance_id = self.reclaims.pop(0)
            self.provider.reclaim(instance_id)
            acted = True
        while self.notices and self.notices[0].at <= now + EPS_S:
            notice = self.notices.pop(0)
            for _job, p in self._live():
                assert p.instance_id is not None and p.started_at is not None
                if p.market_id == notice.market_id and p.started_at.timestamp() < notice.at - EPS_S:
                    self.provider.notify(p.instance_id, notice.reclaim_at - notice.at)
                    self.reclaims.append((notice.reclaim_at, p.instance_id))
                    acted = True
            self.reclaims.sort()
        if acted:
            self.clock.bump()

    def _round(self, tick: bool) -> None:
        """The daemon's round at this simulated time, repeated until it changes nothing more."""
        self._await_processes()
        before = self._snapshot()
        if tick:
            self.daemon.tick()
        else:
            self.daemon.poll()
        while (after := self._snapshot()) != before:
            before = after
            self.clock.bump()
            self._await_processes()
            self.daemon.poll()

    def _snapshot(self) -> tuple[Any, ...]:
        """What a round may change that the processes or the next round must see."""
        with self.db.session() as session:
            moves = tuple(session.execute(select(JobMove.id, JobMove.step, JobMove.outcome)).all())
            placements = tuple(session.execute(select(Placement.id, Placement.state)).all())
            jobs = tuple(session.execute(select(ManagedJob.id, ManagedJob.state)).all())
        return moves, placements, jobs

    def _live(self) -> list[tuple[ManagedJob, Placement]]:
        with self.db.session() as session:
            rows = session.execute(
                select(ManagedJob, Placement)
                .join(Placement, Placement.job_id == ManagedJob.id)
                .where(Placement.state == "running", Placement.instance_id.is_not(None))
            ).all()
            session.expunge_all()
        return [
            (job, p)
            for job, p in rows
            if p.instance_id is not None and self.provider.status(p.instance_id).state.is_live
        ]

    def _behind(self) -> list[str]:
        """Live placements that have not yet acted on the newest clock generation."""
        behind = []
        for job, p in self._live():
            loc = job_location(job)
            lease = read_lease(loc, job.name)
            if lease is None or lease.epoch < p.epoch:
                # Launched ahead of a move: it only waits for the lease; its first heartbeat
                # says it is up (what the executor's await-up step looks for).
                if read_heartbeat(loc, job.name, p.epoch) is None:
                    behind.append(f"{job.name} epoch {p.epoch} (starting)")
            elif lease.epoch == p.epoch and self.clock.acknowledged(job.name, p.epoch)[0] < self.clock.gen:
                behind.append(f"{job.name} epoch {p.epoch}")
        return behind

    def _await_processes(self) -> None:
        deadline = time.monotonic() + WAIT_LIMIT_S
        while behind := self._behind():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"replay: {', '.join(behind)} did not act on simulated time "
                    f"{self.clock.now():%Y-%m-%d %H:%M:%S} within {WAIT_LIMIT_S:g} s; "
                    f"see the logs under {self.provider.state_dir}"
                )
            time.sleep(0.005)

    def _next_events(self) -> list[float]:
        out = []
        for job, p in self._live():
            gen, nxt = self.clock.acknowledged(job.name, p.epoch)
            if gen == self.clock.gen and nxt is not None:
                out.append(nxt)
        return out

    def _all_final(self) -> bool:
        with self.db.session() as session:
            states = set(session.scalars(select(ManagedJob.state)))
        return states <= jobstore.TERMINAL | {"over-budget"}


@dataclass(frozen=True)
class Realised:
    state: str
    cost_usd: float
    finish_hours: float
    moves: int
    preemptions: int
    failed_moves: int
    """Moves (starts included) the executor failed or aborted: none in a faithful replay."""


def realised_by_job(db: Database, start: datetime, now: datetime) -> dict[str, Realised]:
    """What the replayed daemon's ledger and records say per job."""
    out = {}
    with db.session() as session:
        for job in session.scalars(select(ManagedJob).order_by(ManagedJob.id)):
            rows = intervals(session, job.id, now)
            done = session.scalar(
                select(JobEvent.at).where(JobEvent.job_id == job.id, JobEvent.to_state == "done")
            )
            ran = [
                (p.market_id, p.gpus)
                for p in session.scalars(
                    select(Placement)
                    .where(Placement.job_id == job.id, Placement.started_at.is_not(None))
                    .order_by(Placement.started_at, Placement.id)
                )
            ]
            out[job.name] = Realised(
                state=job.state,
                cost_usd=total_usd(rows),
                finish_hours=math.inf if done is None else _hours(done - start),
                moves=sum(1 for a, b in itertools.pairwise(ran) if a != b),
                preemptions=sum(1 for r in rows if r.end_reason in PREEMPTION_ENDS),
                failed_moves=len(
                    session.scalars(
                        select(JobMove.id).where(
                            JobMove.job_id == job.id, JobMove.outcome.in_(("failed", "aborted"))
                        )
                    ).all()
                ),
            )
    return out


def compare(result: ReplayResult, realised: dict[str, Realised]) -> list[dict[str, Any]]:
    """One row per job: predicted (what-if ``spotopt``) and realised, with relative differences.
    ``predicted_egress_usd`` is the part of the predicted cost that is data transfer (the ledger
    bills it too, by the same rule: the realised cost includes it)."""
    (run,) = [r for r in result.runs if r.strategy == "spotopt"]
    rows = []
    for j, name in enumerate(result.jobs.names):
        got = realised[name]
        finished = math.isfinite(run.result.finish_h[j])
        predicted_cost = float(run.result.cost_usd[j]) if finished else math.inf
        predicted_finish = float(run.result.finish_h[j]) if finished else math.inf
        rows.append(
            {
                "job": name,
                "predicted_cost_usd": predicted_cost,
                "predicted_egress_usd": float(run.result.egress_usd[j]),
                "realised_cost_usd": got.cost_usd,
                "cost_diff": _relative(got.cost_usd, predicted_cost),
                "predicted_finish_hours": predicted_finish,
                "realised_finish_hours": got.finish_hours,
                "finish_diff": _relative(got.finish_hours, predicted_finish),
                "predicted_moves": int(run.result.moves[j]),
                "realised_moves": got.moves,
                "predicted_preemptions": int(run.result.preemptions[j]),
                "realised_preemptions": got.preemptions,
                "failed_moves": got.failed_moves,
            }
        )
    return rows


def _relative(realised: float, predicted: float) -> float | None:
    if not math.isfinite(predicted) or not math.isfinite(realised) or predicted == 0:
        return None
    return (realised - predicted) / predicted


def _hours(delta: timedelta) -> float:
    return delta.total_seconds() / 3600.0
