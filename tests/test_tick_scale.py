"""The daemon's tick at scale: each fast path gives exactly what the plain one gives, and the
benchmark's world builder and one dry-run tick keep working (sizes small; no timing asserted).

The plain paths are the per-item ones: ``spent_usd`` per job, ``price_history`` for the
forecast, and the per-option enumeration loop (kept here as the reference it replaced).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import yaml
from sqlalchemy import func, select

from spotopt.db.engine import Database
from spotopt.db.models import DaemonTick, ManagedJob, Placement, PricePoint
from spotopt.db.queries import MarketFilter, price_history
from spotopt.decide.options import (
    BILLING,
    OptionInfo,
    OptionTable,
    allowed,
    enumerate_options,
    gpu_choices,
    option_key,
    work_steps,
)
from spotopt.history.ingest import run_ingest
from spotopt.history.market import MarketState, snapshot
from spotopt.jobspec import JobSpec
from spotopt.mover import daemon as daemon_mod
from spotopt.mover import jobs as jobstore
from spotopt.mover import market_view as view_mod
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.mover.ledger import market_key, spent_by_job, spent_usd
from spotopt.policies.prune import _by_job_cost_speed
from spotopt.throughput import JobThroughput, StoredFigure, checkpoint_interval_s, preemption_efficiency
from spotopt.types import PriceObservation

ROOT = Path(__file__).resolve().parents[1]


def _bench() -> ModuleType:
    """``benchmarks/tick_scale.py`` as a module (the benchmarks are scripts, not a package)."""
    name = "tick_scale_bench"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / "tick_scale.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


BENCH = _bench()
AT: datetime = BENCH.AT


@pytest.fixture
def world(db: Database) -> Database:
    BENCH.build_world(db, n_jobs=60, n_markets=150, seed=3)
    return db


def plain_enumerate_options(
    spec: JobSpec,
    markets: Sequence[MarketState],
    at: datetime,
    figures: Sequence[StoredFigure] = (),
    *,
    period_h: float | None = 1.0,
    billing: str = "instance",
    missed_deadlines: bool = False,
) -> OptionTable:
    """The per-option loop ``enumerate_options`` replaced: one ``allowed`` test and one
    preemption computation per (job, market, GPUs per job)."""
    assert billing in BILLING
    period_s = None if period_h is None else period_h * 3600.0
    by_gpu: dict[tuple[str, float], list[int]] = defaultdict(list)
    for i, m in enumerate(markets):
        if m.quote.gpu is not None and m.quote.gpu_count:
            by_gpu[(m.quote.gpu, m.quote.gpu_count)].append(i)
    rows: dict[str, list[Any]] = defaultdict(list)
    infos: list[OptionInfo] = []
    work, deadlines = [], []
    for j, job in enumerate(spec.jobs):
        book = JobThroughput(job, figures)
        work.append(work_steps(job, book))
        due = job.deadline_hours(at)
        assert missed_deadlines or due is None or due > 0
        deadlines.append(math.inf if due is None else due)
        for (gpu, count), idx in sorted(by_gpu.items()):
            for d in gpu_choices(job, count):
                fig = book.at(gpu, d)
                if fig is None:
                    continue
                slots = math.floor(count / d + 1e-9) if billing == "gpu" else 1
                for i in idx:
                    m = markets[i]
                    if not allowed(job, m):
                        continue
                    rate = m.preemptions_per_hour
                    eff = preemption_efficiency(rate, job.checkpoint_seconds, job.restart_s, period_s)
                    if eff <= 0:
                        continue
                    rows["job"].append(j)
                    rows["market"].append(i)
                    rows["tput"].append(fig.steps_per_s * 3600.0 * eff)
                    rows["slots"].append(slots)
                    interval = checkpoint_interval_s(job.checkpoint_seconds, rate, period_s)
                    infos.append(OptionInfo(m, d, slots, fig, eff, interval, 0.0))
    job_of = np.asarray(rows["job"], dtype=np.int64)
    market = np.asarray(rows["market"], dtype=np.int64)
    ids = np.array([markets[i].quote.market_id for i in market.tolist()], dtype=np.int64)
    key = option_key(ids, job_of, np.array([o.gpus for o in infos], dtype=np.int64))
    order = np.argsort(key, kind="stable")
    return OptionTable(
        key=key[order],
        job=job_of[order],
        market=market[order],
        steps_per_hour=np.asarray(rows["tput"], dtype=float)[order],
        slots=np.asarray(rows["slots"], dtype=np.int64)[order],
        infos=[infos[e] for e in order.tolist()],
        work_steps=np.asarray(work, dtype=float),
        deadline_hours=np.asarray(deadlines, dtype=float),
    )


def _spec(db: Database) -> JobSpec:
    with db.session() as session:
        jobs = session.scalars(select(ManagedJob).order_by(ManagedJob.id)).all()
        return JobSpec(jobs=[jobstore.job_spec(j) for j in jobs])


@pytest.mark.parametrize("billing", BILLING)
def test_enumerated_options_equal_the_per_option_loop(world: Database, billing: str) -> None:
    spec = _spec(world)
    with world.session() as session:
        markets = snapshot(session, AT)
    fast = enumerate_options(spec, markets, AT, billing=billing)
    plain = plain_enumerate_options(spec, markets, AT, billing=billing)
    assert len(fast.key) > 1000  # many jobs, GPU ranges and filters: a real test
    for name in ("key", "job", "market", "steps_per_hour", "slots", "work_steps", "deadline_hours"):
        assert np.array_equal(getattr(fast, name), getattr(plain, name)), name
    assert len(fast.infos) == len(plain.infos)
    assert list(fast.infos) == list(plain.infos)
    assert fast.infos[-1] == plain.infos[-1] and fast.infos[3:6] == plain.infos[3:6]
    with pytest.raises(IndexError):
        fast.infos[len(fast.infos)]


def _second_source(db: Database) -> None:
    """Another source at 40 instants the history already has (at another price): the paths must
    break such ties alike ("aaa" sorts before the benchmark's source)."""
    with db.session() as session:
        some = session.execute(
            select(PricePoint.market_id, PricePoint.observed_at, PricePoint.usd_per_hour)
            .join(Placement, Placement.market_id == PricePoint.market_id)
            .order_by(PricePoint.market_id, PricePoint.observed_at)
            .limit(40)
        ).all()
        keys = {mid: market_key(session, mid) for mid, _, _ in some}
    run_ingest(db, "aaa-other", "test", [PriceObservation(keys[m], at, usd * 1.5) for m, at, usd in some])


def test_batched_spend_equals_the_per_job_ledger(world: Database) -> None:
    _second_source(world)
    now = AT + timedelta(minutes=7)
    with world.session() as session:
        ids = list(session.scalars(select(ManagedJob.id).order_by(ManagedJob.id)))
        batched = spent_by_job(session, [*ids, 10**6], now)
        plain = {i: spent_usd(session, i, now) for i in ids}
    assert batched.pop(10**6) == 0.0
    assert batched == plain  # to the last bit
    assert sum(v > 0 for v in plain.values()) > 10


def test_forecast_history_points_equal_price_history(world: Database) -> None:
    _second_source(world)
    since, until = AT - timedelta(hours=30), AT
    with world.session() as session:
        plain = [
            (q.market_id, q.observed_at, q.usd_per_hour)
            for q in price_history(session, MarketFilter(), since, until)
        ]
        lean = list(view_mod.history_points(session, since, until, MarketFilter()))
    assert sorted(lean) == sorted(plain)
    assert len(plain) > 100


def _decisions(db: Database) -> list[dict[str, Any]]:
    report = Daemon(db, None, DaemonSettings(dry_run=True), clock=lambda: AT).tick()
    return report.decisions


def test_a_dry_run_tick_decides_the_same_on_the_plain_paths(
    world: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = _decisions(world)
    assert len(fast) > 10

    def per_job(session: Any, job_ids: Sequence[int], now: datetime) -> dict[int, float]:
        return {i: spent_usd(session, i, now) for i in job_ids}

    def via_quotes(session: Any, since: datetime, until: datetime, flt: MarketFilter) -> Any:
        return [
            (q.market_id, q.observed_at, q.usd_per_hour) for q in price_history(session, flt, since, until)
        ]

    monkeypatch.setattr(daemon_mod, "spent_by_job", per_job)
    monkeypatch.setattr(view_mod, "history_points", via_quotes)
    monkeypatch.setattr(view_mod, "enumerate_options", plain_enumerate_options)
    assert _decisions(world) == fast


def test_the_benchmark_world_and_one_dry_run_tick(db: Database) -> None:
    counts = BENCH.build_world(db, n_jobs=40, n_markets=120, seed=1)
    assert counts["jobs"] == 40 and counts["markets"] >= 120 and counts["placements"] > 0
    with db.session() as session:
        states = dict(
            session.execute(select(ManagedJob.state, func.count()).group_by(ManagedJob.state)).all()
        )
        running = session.scalars(select(ManagedJob).where(ManagedJob.state == "running")).all()
        # every running job points at its live placement, on a market it may use
        for job in running:
            placement = session.get(Placement, job.placement_id)
            assert placement is not None and placement.state == "running" and placement.job_id == job.id
    assert {"running", "pending", "done"} <= set(states)
    report, phases = BENCH.timed_tick(db)
    assert report.decisions and report.jobs == states
    assert set(phases) >= {"fleet state (+ ledger)", "decide (core)", "state read (jobs, specs)", "total"}
    assert all(v[1] >= 0 for k, v in phases.items() if k != BENCH.REST)
    with db.session() as session:  # a dry run writes nothing, not even its round's record
        assert session.scalars(select(DaemonTick)).all() == []


def test_a_bulk_job_row_is_the_row_submit_writes(db: Database) -> None:
    job, created = BENCH.job_specs(1, np.random.default_rng(5))[0]
    row = BENCH.job_row(db, job, created)
    stored = jobstore.submit(
        db, yaml.safe_dump({"jobs": [job.model_dump(mode="json")]}), now=created, check_store=False
    )
    for name, value in row.items():
        assert getattr(stored, name) == value, name


@pytest.mark.parametrize("n_jobs", [7, 2**15 + 3])
def test_pruning_sorts_options_as_lexsort_does(n_jobs: int) -> None:
    rng = np.random.default_rng(n_jobs)
    n = 20_000
    job = rng.integers(0, n_jobs, n)
    per_step = rng.choice([0.5, 1.0, 1.5, np.nan], n)  # ties everywhere, and NaN
    speed = rng.choice([1.0, 2.0, 3.0], n)
    order = _by_job_cost_speed(job, per_step, speed, n_jobs)
    assert np.array_equal(order, np.lexsort((-speed, per_step, job)))
