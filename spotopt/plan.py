"""From job specs and a market snapshot to a policy's allocation, and back to a readable plan.

The seam ``spotopt plan``, the what-if engine and the daemon share:

- ``enumerate_options(spec, markets, at, figures, ...) -> OptionTable``: dict ⇄ array
  conversion, done once: every (job, market, GPUs per job) option with its effective throughput.
- ``build_problem(...) -> PlanProblem``: the policy input for the fleet before any job runs,
  built by the decision core's one builder (``spotopt.mover.core.policy_input``), dominated
  options pruned (exactly, see ``spotopt.policies.prune``).
- ``solve(policy_name, problem.input) -> Allocation``: the registered pure policy.
- ``plan_report(problem, allocation) -> dict``: the JSON document ``spotopt plan`` prints.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from spotopt.catalog import gpu_matches
from spotopt.errors import InputError
from spotopt.jobspec import Job, JobSpec
from spotopt.market import MarketState
from spotopt.mover.core import policy_input
from spotopt.mover.egress import entry_usd, transfer_matrix
from spotopt.mover.fleet import FleetState, Options
from spotopt.mover.guardrails import Guardrails
from spotopt.policies.base import Allocation, Array, PolicyInput, get_policy
from spotopt.policies.prune import prune_dominated, select_options
from spotopt.throughput import (
    Figure,
    JobThroughput,
    StoredFigure,
    checkpoint_interval_s,
    preemption_efficiency,
)

DEFAULT_HORIZON_HOURS = 720.0


@dataclass(frozen=True)
class OptionInfo:
    """What an option means, for reports: not needed by the policies."""

    market: MarketState
    gpus: int
    slots: int
    figure: Figure
    efficiency: float
    checkpoint_interval_s: float | None
    egress_usd: float


@dataclass
class PlanProblem:
    input: PolicyInput
    options: list[OptionInfo]
    jobs: list[Job]
    at: datetime
    markets: list[MarketState]
    ranked: dict[int, list[tuple[float, OptionInfo]]] = field(default_factory=dict)
    """Per job, its cheapest options per step (before pruning), to explain the choice."""
    pruned: int = 0
    state: FleetState | None = None
    """The fleet before any job runs, as the decision core sees it."""
    billing: str = "instance"


def allowed(job: Job, market: MarketState) -> bool:
    q, a = market.quote, job.allow
    return (
        (not a.clouds or q.cloud in a.clouds)
        and (not a.markets or q.market in a.markets)
        and (not a.regions or q.region in a.regions)
        and (not a.instance_types or q.instance_type in a.instance_types)
        and (not a.gpus or any(gpu_matches(g, q.gpu) for g in a.gpus))
    )


def gpu_choices(job: Job, instance_gpus: float) -> list[int]:
    """GPUs per job on an instance with ``instance_gpus``: fixed, or min/max/powers of two/all."""
    low, high = job.gpu_range
    total = math.floor(instance_gpus + 1e-9)
    if low == high:
        return [low] if low <= total else []
    wanted = {low, high, total} | {2**i for i in range(0, 12)}
    return sorted(d for d in wanted if low <= d <= min(high, total))


def work_steps(job: Job, book: JobThroughput) -> float:
    if job.work.steps is not None:
        return job.work.steps
    assert job.work.gpu is not None and job.work.gpu_days is not None
    ref = book.single(job.work.gpu)
    if ref is None:
        raise InputError(
            f"job {job.name!r}: work.gpu is {job.work.gpu} but the job has no throughput on it; "
            f"add throughput.{job.work.gpu} or give work.steps"
        )
    return job.work.gpu_days * 86400.0 * ref.steps_per_s


BILLING = ("instance", "gpu")
"""How an option on ``d`` of an instance's ``G`` GPUs is billed: ``instance`` (the default) rents
the whole instance, as the daemon does; ``gpu`` is the thesis' packed accounting, ``price / k``
for ``k = floor(G / d)`` jobs sharing it, as if other jobs filled the rest (labelled wherever used)."""


@dataclass
class OptionTable:
    """Every (job, market, GPUs per job) option of a spec on a snapshot, before any pricing
    decision: what ``spotopt plan``, the what-if engine and the daemon all start from."""

    key: Array
    """A stable id per option, sorted: ``option_key(market_id, job, gpus)``."""
    job: Array
    market: Array
    steps_per_hour: Array
    """Expected effective throughput (discounted for preemption loss at the planning period)."""
    slots: Array
    """Jobs billed per instance: ``floor(G / d)`` with ``gpu`` billing, else 1."""
    infos: list[OptionInfo]
    work_steps: Array
    deadline_hours: Array


def enumerate_options(
    spec: JobSpec,
    markets: Sequence[MarketState],
    at: datetime,
    figures: Sequence[StoredFigure] = (),
    *,
    period_h: float | None = 1.0,
    billing: str = "instance",
) -> OptionTable:
    """All options of all jobs on ``markets`` (a snapshot at ``at``).

    A market whose GPU count is unknown or smaller than the job's minimum is skipped for it, and
    so is an option whose preemption loss leaves no progress. ``period_h`` is the planning period
    (checkpoints fall on its boundaries, see ``spotopt.throughput``).
    """
    if billing not in BILLING:
        raise InputError(f"--billing {billing!r}: must be one of {', '.join(BILLING)}")
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
        if due is not None and due <= 0:
            raise InputError(f"job {job.name!r}: deadline {job.deadline} is not after --at {at.isoformat()}")
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


def option_key(market_id: Array, job: Array, gpus: Array) -> Array:
    """A stable id of (market, job, GPUs per job): the same option keeps its key from one
    snapshot to the next, so a fleet state that names it stays valid (the daemon's case)."""
    return np.asarray(market_id.astype(np.int64) * 2**32 + job.astype(np.int64) * 2**12 + gpus)


def initial_state(
    spec: JobSpec, table: OptionTable, markets: Sequence[MarketState], at: datetime
) -> tuple[FleetState, Options]:
    """The fleet before any job runs, and the table's options priced at the snapshot (no
    history: the forecast is today's price), for ``spotopt.mover.core``."""
    locations: list[tuple[str, str]] = []
    data_loc = [
        -1
        if job.dataset is None or job.dataset.gb == 0
        else location_index(locations, job.dataset.cloud, job.dataset.region)
        for job in spec.jobs
    ]
    opts = price_options(table, markets, at, locations)
    n = len(spec.jobs)
    state = FleetState(
        names=tuple(job.name for job in spec.jobs),
        locations=tuple(locations),
        option=np.full(n, -1, dtype=np.int64),
        location=np.full(n, -1, dtype=np.int64),
        remaining_steps=table.work_steps.copy(),
        dwell_h=np.zeros(n),
        since_checkpoint_h=np.zeros(n),
        deadline_h=table.deadline_hours.copy(),
        notice=np.zeros(n, dtype=bool),
        lost=np.zeros(n, dtype=bool),
        spent_usd=np.zeros(n),
        restart_h=np.array([job.restart_s / 3600.0 for job in spec.jobs]),
        save_h=np.array([job.checkpoint_seconds / 3600.0 for job in spec.jobs]),
        checkpoint_gb=np.array([job.checkpoint_gb for job in spec.jobs]),
        dataset_gb=np.array([job.dataset.gb if job.dataset else 0.0 for job in spec.jobs]),
        dataset_location=np.asarray(data_loc, dtype=np.int64),
    )
    return state, opts


def location_index(locations: list[tuple[str, str]], cloud: str, region: str) -> int:
    """Index of ``(cloud, region)`` in ``locations``, appended if new (append only: indices a fleet
    state holds stay valid)."""
    if (cloud, region) not in locations:
        locations.append((cloud, region))
    return locations.index((cloud, region))


def price_options(
    table: OptionTable,
    markets: Sequence[MarketState],
    at: datetime,
    locations: list[tuple[str, str]],
    baseline_usd_per_hour: Array | None = None,
    revert_h: Array | None = None,
) -> Options:
    """The table's options priced at the snapshot ``markets`` for ``spotopt.mover.core``.

    ``locations`` gains the markets' regions it lacks. The forecast is per market (instance
    prices; ``None``: today's price holds).
    """
    market_loc = np.array(
        [location_index(locations, m.quote.cloud, m.quote.region) for m in markets], dtype=np.int64
    )
    slots = np.maximum(table.slots, 1)
    now = np.array([m.quote.usd_per_hour for m in markets], dtype=float)
    base = now if baseline_usd_per_hour is None else baseline_usd_per_hour
    revert = np.full(len(markets), np.inf) if revert_h is None else revert_h
    m = table.market
    return Options(
        key=table.key,
        job=table.job,
        market=m,
        location=market_loc[m],
        steps_per_hour=table.steps_per_hour,
        usd_per_hour=now[m] / slots,
        instances_per_hour=1.0 / slots,
        on_demand=np.array([markets[i].quote.market == "on-demand" for i in m.tolist()], dtype=bool),
        baseline_usd_per_hour=base[m] / slots,
        revert_h=revert[m],
        preemptions_per_hour=np.array([markets[i].preemptions_per_hour for i in m.tolist()]),
        transfer=transfer_matrix(locations, at),
        capacity=np.full(len(markets), math.inf),
    )


def build_problem(
    spec: JobSpec,
    markets: Sequence[MarketState],
    at: datetime,
    figures: Sequence[StoredFigure] = (),
    *,
    horizon_hours: float | None = None,
    budget_usd: float | None = None,
    capacity: float = math.inf,
    prune: bool = True,
    period_h: float = 1.0,
    billing: str = "instance",
) -> PlanProblem:
    """The policy input ``spotopt plan`` solves: the core's builder (``policy_input``) on the
    fleet before any job runs, so a plan is what the daemon would start with.

    ``capacity`` is instances per market one may hold at once (``inf``: unlimited).
    """
    table = enumerate_options(spec, markets, at, figures, period_h=period_h, billing=billing)
    state, opts = initial_state(spec, table, markets, at)
    opts = dataclasses.replace(opts, capacity=np.full(len(markets), capacity, dtype=float))
    guard = Guardrails(period_h=period_h, budget_usd=budget_usd)
    built = policy_input(state, opts, guard, horizon_h=horizon_hours, prune=False, every_job=True)
    inp = dataclasses.replace(built.input, market_names=tuple(m.label for m in markets))
    egress = entry_usd(
        opts.transfer,
        state.location[opts.job],
        opts.location,
        state.checkpoint_gb[opts.job],
        state.dataset_gb[opts.job],
        state.dataset_location[opts.job],
    )
    infos = [
        dataclasses.replace(table.infos[e], egress_usd=float(egress[e])) for e in built.positions.tolist()
    ]
    problem = PlanProblem(
        inp, infos, list(spec.jobs), at, list(markets), _ranked(inp, infos), state=state, billing=billing
    )
    if prune:
        keep = prune_dominated(inp)
        problem.pruned = int((~keep).sum())
        problem.input = select_options(inp, keep)
        problem.options = [o for o, k in zip(infos, keep, strict=True) if k]
    return problem


def _ranked(
    inp: PolicyInput, infos: list[OptionInfo], top: int = 8
) -> dict[int, list[tuple[float, OptionInfo]]]:
    """Per job, its ``top`` cheapest options per step."""
    per_step = inp.usd_per_hour / inp.steps_per_hour
    ranked: dict[int, list[tuple[float, OptionInfo]]] = defaultdict(list)
    for e in np.lexsort((-inp.steps_per_hour, per_step, inp.job)):
        if len(ranked[int(inp.job[e])]) < top:
            ranked[int(inp.job[e])].append((float(per_step[e]), infos[e]))
    return dict(ranked)


def solve(policy_name: str, inp: PolicyInput) -> Allocation:
    """Run the registered policy ``policy_name`` (did-you-mean error for an unknown name)."""
    return get_policy(policy_name)(inp)


STALE_PRICE_AFTER = timedelta(days=7)
"""A chosen market whose price point is older than this at plan time gets a warning."""


def _hours(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def plan_report(problem: PlanProblem, alloc: Allocation) -> dict[str, Any]:
    """The plan as a JSON-ready dict (schema in the README, "Planning jobs")."""
    inp = problem.input
    jobs = []
    for j, job in enumerate(problem.jobs):
        picked = [e for e in np.flatnonzero(inp.job == j) if alloc.share[e] > 1e-6]
        picked.sort(key=lambda e: inp.usd_per_hour[e] / inp.steps_per_hour[e])  # the order they run in
        wall = float(alloc.wall_hours[j])
        deadline = float(problem.state.deadline_h[j]) if problem.state else float(inp.deadline_hours[j])
        steps = float(inp.work_steps[j])
        cost = float(alloc.cost_usd[j])
        chosen = {id(problem.options[e]) for e in picked}
        runner = next((r for r in problem.ranked.get(j, []) if id(r[1]) not in chosen), None)
        jobs.append(
            {
                "name": job.name,
                "cost_usd": cost if math.isfinite(cost) else None,
                "finish_hours": _hours(wall),
                "finish_at": problem.at + timedelta(hours=wall) if math.isfinite(wall) else None,
                "deadline_hours": _hours(deadline),
                "slack_hours": _hours(deadline - wall) if math.isfinite(deadline) else None,
                "work_steps": steps,
                "usd_per_step": cost / steps if math.isfinite(cost) else None,
                "runner_up": None
                if runner is None
                else {**_market_fields(runner[1]), "usd_per_step": runner[0]},
                "allocation": [
                    {
                        **_market_fields(problem.options[e]),
                        "share": float(alloc.share[e]),
                        "hours": float(alloc.hours[e]),
                        "usd_per_step": float(inp.usd_per_hour[e] / inp.steps_per_hour[e]),
                    }
                    for e in picked
                ],
            }
        )
    return {
        "status": alloc.status,
        "policy": alloc.policy,
        "solver": alloc.solver,
        "at": problem.at,
        "horizon_hours": inp.horizon_hours,
        "budget_usd": inp.budget_usd,
        "billing": problem.billing,
        "total_cost_usd": alloc.total_cost_usd,
        "makespan_hours": _hours(alloc.makespan_hours),
        "options": inp.n_options,
        "pruned_options": problem.pruned,
        "jobs": jobs,
        "warnings": stale_price_warnings(problem.at, jobs),
    }


def stale_price_warnings(at: datetime, jobs: list[dict[str, Any]]) -> list[str]:
    """Say when a plan rests on old prices: a point holds until the next one, so an old point
    is the price "at" t as far as the history knows, but the history may simply have stopped."""
    chosen = {_market_key(item): item for job in jobs for item in job["allocation"]}
    stale = {k: item for k, item in chosen.items() if at - item["price_observed_at"] > STALE_PRICE_AFTER}
    if not stale:
        return []
    oldest = min(item["price_observed_at"] for item in stale.values())
    aws_spot = any(item["cloud"] == "aws" and item["market"] == "spot" for item in stale.values())
    why = (
        "AWS records a spot price only when it changes, so an old point may still hold, but "
        if aws_spot
        else ""
    )
    return [
        f"{len(stale)} of the {len(chosen)} chosen markets have prices last observed more than "
        f"{STALE_PRICE_AFTER.days} days before {at:%Y-%m-%d %H:%M} UTC (oldest {oldest:%Y-%m-%d}); "
        f"{why}check coverage (`spotopt report run coverage`) and refresh with `spotopt collect` or "
        "`spotopt import`"
    ]


def _market_key(item: dict[str, Any]) -> tuple[Any, ...]:
    return (item["cloud"], item["region"], item["zone"], item["instance_type"], item["market"])


def _market_fields(o: OptionInfo) -> dict[str, Any]:
    q = o.market.quote
    return {
        "cloud": q.cloud,
        "region": q.region,
        "zone": q.zone,
        "instance_type": q.instance_type,
        "market": q.market,
        "gpu": q.gpu,
        "gpus": o.gpus,
        "jobs_per_instance": o.slots,
        "usd_per_hour": q.usd_per_hour,
        "price_observed_at": q.observed_at,
        "price_source": q.source,
        "steps_per_s": o.figure.steps_per_s * o.efficiency,
        "throughput_source": o.figure.source,
        "preemptions_per_hour": o.market.preemptions_per_hour,
        "rate_source": o.market.rate_source,
        "checkpoint_interval_s": o.checkpoint_interval_s,
        "egress_usd": o.egress_usd,
    }
