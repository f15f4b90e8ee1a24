"""``replay(db, request) -> ReplayResult``: the what-if as a library call (the CLI is a thin layer).

A replay reads the history once (prices of the window, preemption data, stored throughputs),
builds every job's options through the same builder as ``spotopt plan`` and the daemon, and
runs every requested strategy from every start. ``example_history()`` is the bundled synthetic
market in a throwaway database, so ``spotopt whatif --example`` never writes synthetic prices
into the user's history.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from spotopt.db.engine import Database
from spotopt.db.queries import MarketFilter, prices_at
from spotopt.decide.egress import transfer_matrix
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.options import BILLING
from spotopt.errors import InputError
from spotopt.history.setup import open_history
from spotopt.history.throughput_store import stored_figures
from spotopt.jobspec import JobSpec
from spotopt.policies.base import get_policy
from spotopt.settings import Settings
from spotopt.whatif.example_market import load_example
from spotopt.whatif.jobs import SimJobs, build_jobs
from spotopt.whatif.preemptions import PreemptionMode, preemption_table
from spotopt.whatif.run import (
    BASELINE,
    STRATEGIES,
    StrategyRun,
    placements,
    run_whatif,
    set_aside_jobs,
    summarise,
    window_hours,
)
from spotopt.whatif.timeline import Timeline, load_timeline

Array = np.ndarray[Any, Any]


MAX_STARTS = 1_000
"""The most start times one replay takes: each runs every strategy (seconds to minutes apiece),
so a thousand starts are hours of work; a million were years, with nothing said."""


ESTIMATED = (
    "throughput_source estimated: the job ran on a GPU it has no figure for; every strategy replays "
    "it at the estimate's point, the spotopt strategy plans its deadline at the low end of the "
    "estimate's 80 % interval, as `spotopt plan` does (`spotopt throughput estimate JOBS.yaml` "
    "lists them; a short `spotopt throughput profile` measures one)"
)
"""The note of a replay where some job ran on an estimated figure (issue 37: estimates marked)."""


@dataclass(frozen=True)
class ReplayRequest:
    """What to replay. ``start`` None: one window before the history's latest price, so the
    replay ends where the history does. ``billing``: see ``spotopt.decide.options.BILLING``."""

    spec: JobSpec
    start: datetime | None = None
    starts: int = 1
    every_h: float = 24.0
    strategies: tuple[str, ...] = tuple(STRATEGIES)
    preemptions: PreemptionMode = PreemptionMode.MODEL
    seed: int = 0
    clouds: tuple[str, ...] | None = None
    policy: str | None = None
    tick_h: float = 1.0
    billing: str = "instance"

    def __post_init__(self) -> None:
        if not self.strategies:
            raise InputError(f"strategies: none given; strategies: {', '.join(STRATEGIES)}")
        for name in self.strategies:
            STRATEGIES.lookup(name)
        if self.billing not in BILLING:
            raise InputError(f"billing {self.billing!r}: must be one of {', '.join(BILLING)}")
        if self.starts < 1 or self.every_h <= 0 or self.tick_h <= 0:
            raise InputError("starts must be >= 1, every and tick positive")
        if self.starts > MAX_STARTS:
            raise InputError(
                f"--starts {self.starts}: at most {MAX_STARTS:,} start times (each replays every "
                "strategy); fewer starts with a longer --every cover the same span"
            )
        if self.starts > 1 and self.every_h < self.tick_h:
            raise InputError(
                f"--every {self.every_h * 3600:g} s is shorter than --tick {self.tick_h * 3600:g} s: "
                "starts fall on ticks, so several would replay the same start; give --every of at least "
                "the tick"
            )
        if self.policy is not None:
            get_policy(self.policy)


@dataclass
class ReplayResult:
    request: ReplayRequest
    first_start: datetime
    window_hours: float
    timeline: Timeline
    jobs: SimJobs
    events: Array
    """The preemption table every strategy ran with (``spotopt.whatif.preemptions``)."""
    runs: list[StrategyRun]
    rows: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    @property
    def synthetic(self) -> bool:
        return self.timeline.synthetic

    @property
    def policy_solves(self) -> int | None:
        """Policy solves of the spotopt strategy over all starts (None if it did not run)."""
        counts = [r.policy_solves for r in self.runs if r.policy_solves is not None]
        return sum(counts) if counts else None

    def placements(self) -> list[dict[str, Any]]:
        """Where each job ran (one start only; empty over several starts)."""
        if self.request.starts != 1:
            return []
        shown = [r for r in self.runs if r.strategy in self.request.strategies]
        return [p for r in shown for p in placements(r, self.timeline, self.jobs)]

    def document(self) -> dict[str, Any]:
        """The JSON document of ``spotopt whatif --format json`` (schema in docs/guides/whatif.md)."""
        req = self.request
        return {
            "synthetic": self.synthetic,
            "price_sources": sorted(self.timeline.sources),
            "first_start": self.first_start,
            "starts": req.starts,
            "every_hours": req.every_h,
            "window_hours": self.window_hours,
            "preemptions": req.preemptions.value,
            "seed": req.seed if req.preemptions is PreemptionMode.MODEL else None,
            "billing": req.billing,
            "results": self.rows,
            "placements": self.placements(),
            "notes": self.notes,
            "policy_solves": self.policy_solves,
        }


def replay(
    db: Database, request: ReplayRequest, on_step: Callable[[str, datetime], None] | None = None
) -> ReplayResult:
    """Replay ``request`` over ``db``'s history; ``on_step(strategy, start)`` after each run."""
    flt = MarketFilter(clouds=list(request.clouds) if request.clouds else None)
    with db.session() as session:
        latest = _latest_price(session, flt)
        kept, aside = set_aside_jobs(request.spec, request.start or latest)
        if not kept:
            raise InputError(f"{'; '.join(aside)}: no job left to replay")
        spec = JobSpec(jobs=[job for job in request.spec.jobs if job.name in kept])
        first = request.start or _default_start(latest, spec, request.starts, request.every_h)
        _check_starts(request, first, latest)
        hours = window_hours(spec, first, request.starts, request.every_h)
        tl = load_timeline(session, first, hours, request.tick_h, flt)
        figures = stored_figures(session)
        events = preemption_table(session, tl, request.preemptions, request.seed)
    sim = build_jobs(spec, tl, figures, billing=request.billing)
    transfer = transfer_matrix(tl.locations, first)
    start_ticks = [round(k * request.every_h / request.tick_h) for k in range(request.starts)]
    step = None if on_step is None else (lambda name, tick: on_step(name, tl.time(tick)))
    guard = Guardrails(period_h=request.tick_h).with_jobs(spec.jobs)
    runs = run_whatif(tl, sim, events, transfer, request.strategies, start_ticks, guard, request.policy, step)
    rows = summarise(runs, sim, list(request.strategies))
    shown = [r for r in runs if r.strategy in request.strategies]
    notes = sorted({f"{r.strategy}: {n}" for r in shown for n in r.notes})
    notes.extend(f"{why}; not replayed" for why in aside)
    if not (~tl.on_demand).any():
        notes.append("no spot prices in this window: the spot strategies ran on on-demand markets")
    if any("estimated" in (row["throughput_source"] or "") for row in rows):
        notes.append(ESTIMATED)
    if request.billing == "gpu":
        notes.append(
            "billing gpu: a job on k of an instance's n GPUs pays k/n of it (packed, as in the thesis)"
        )
    if tl.last_observed is not None and tl.time(tl.n_ticks) > tl.last_observed + timedelta(days=1):
        notes.append(
            f"the window ends {tl.time(tl.n_ticks):%Y-%m-%d} but the last price is from "
            f"{tl.last_observed:%Y-%m-%d}: later prices are held constant"
        )
    # The result's request holds the jobs replayed (its jobs index the simulation's).
    return ReplayResult(replace(request, spec=spec), first, hours, tl, sim, events, runs, rows, notes)


def total_runs(request: ReplayRequest) -> int:
    """How many strategy runs ``replay`` makes (the baseline always runs)."""
    return request.starts * len(set(request.strategies) | {BASELINE})


@contextmanager
def example_history() -> Iterator[Database]:
    """The bundled synthetic example market in a throwaway SQLite database (deleted after)."""
    with tempfile.TemporaryDirectory(prefix="spotopt-example-") as tmp:
        db = open_history(f"sqlite:///{Path(tmp) / 'example.sqlite'}", Settings(auto_migrate=True))
        try:
            load_example(db)
            yield db
        finally:
            db.dispose()


def _latest_price(session: Any, flt: MarketFilter) -> datetime:
    latest = max((q.observed_at for q in prices_at(session, datetime.now(UTC), flt)), default=None)
    if latest is None:
        raise InputError(
            "the history has no prices; import or collect some, or run `spotopt whatif --example`"
        )
    return latest


def _default_start(latest: datetime, spec: JobSpec, starts: int, every_h: float) -> datetime:
    """One window before the latest price point, so the replay ends where the history does."""
    return latest - timedelta(hours=window_hours(spec, latest, starts, every_h))


def _check_starts(request: ReplayRequest, first: datetime, latest: datetime) -> None:
    """Refuse starts after the history's last price: they would replay prices held constant
    (and a huge --starts would build a window of years before failing)."""
    last = first + timedelta(hours=(request.starts - 1) * request.every_h)
    if last <= latest:
        return
    fit = 1 + int((latest - first).total_seconds() / 3600.0 // request.every_h) if latest >= first else 0
    raise InputError(
        f"--starts {request.starts} every {request.every_h:g} h from {first:%Y-%m-%d %H:%M}: the last start "
        f"({last:%Y-%m-%d %H:%M}) is after the history's last price ({latest:%Y-%m-%d %H:%M} UTC); "
        + (f"use --starts {fit} or less, or an earlier --start" if fit else "use an earlier --start")
    )
