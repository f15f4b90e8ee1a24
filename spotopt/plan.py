"""From job specs and a market snapshot to a policy's allocation, and back to a readable plan.

The seam the CLI and the what-if engine share:

- ``build_problem(spec, markets, at, figures, ...) -> PlanProblem``: dict ⇄ array conversion,
  done once: every (job, market, GPUs per job) option with its effective throughput and cost,
  dominated options pruned (exactly, see ``prune_dominated``).
- ``solve(policy_name, problem.input) -> Allocation``: the registered pure policy.
- ``plan_report(problem, allocation) -> dict``: the JSON document ``spotopt plan`` prints.
"""

from __future__ import annotations

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
from spotopt.mover import egress
from spotopt.policies.base import Allocation, Array, PolicyInput, get_policy
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


def egress_usd(job: Job, market: MarketState, at: datetime) -> float:
    """One dataset transfer to the market's region (0 with no dataset or in the same region),
    at the prices of ``data/egress.csv`` in effect at ``at`` (the ones the what-if engine uses)."""
    data = job.dataset
    if data is None or data.gb == 0:
        return 0.0
    q = market.quote
    if data.cloud != q.cloud:
        return data.gb * egress.usd_per_gb(data.cloud, "internet", at)
    return 0.0 if data.region == q.region else data.gb * egress.usd_per_gb(data.cloud, "inter-region", at)


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
) -> PlanProblem:
    """All options of all jobs on ``markets`` (a snapshot at ``at``) as a ``PolicyInput``.

    ``capacity`` is instances per market one may hold at once (``inf``: unlimited).
    A market whose GPU count is unknown or smaller than the job's minimum is skipped for it.
    """
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
                slots = math.floor(count / d + 1e-9)
                for i in idx:
                    m = markets[i]
                    if not allowed(job, m):
                        continue
                    eff = preemption_efficiency(m.preemptions_per_hour, job.checkpoint_seconds, job.restart_s)
                    if eff <= 0:
                        continue
                    tput = fig.steps_per_s * 3600.0 * eff
                    move = egress_usd(job, m, at)
                    rows["job"].append(j)
                    rows["market"].append(i)
                    rows["tput"].append(tput)
                    rows["usd"].append(m.quote.usd_per_hour / slots + move * tput / work[-1])
                    rows["share"].append(1.0 / slots)
                    infos.append(
                        OptionInfo(
                            m,
                            d,
                            slots,
                            fig,
                            eff,
                            checkpoint_interval_s(job.checkpoint_seconds, m.preemptions_per_hour),
                            move,
                        )
                    )
    finite_deadlines = [d for d in deadlines if math.isfinite(d)]
    horizon = horizon_hours or max([DEFAULT_HORIZON_HOURS, *finite_deadlines])
    inp = PolicyInput(
        job=np.asarray(rows["job"], dtype=np.int64),
        market=np.asarray(rows["market"], dtype=np.int64),
        steps_per_hour=np.asarray(rows["tput"], dtype=float),
        usd_per_hour=np.asarray(rows["usd"], dtype=float),
        instances_per_hour=np.asarray(rows["share"], dtype=float),
        work_steps=np.asarray(work, dtype=float),
        deadline_hours=np.asarray(deadlines, dtype=float),
        capacity=np.full(len(markets), capacity, dtype=float),
        horizon_hours=float(horizon),
        budget_usd=budget_usd,
        job_names=tuple(job.name for job in spec.jobs),
        market_names=tuple(m.label for m in markets),
    )
    problem = PlanProblem(inp, infos, list(spec.jobs), at, list(markets), _ranked(inp, infos))
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


def prune_dominated(inp: PolicyInput) -> Array:
    """Mask of options to keep: drop an option another option of its job beats on both $/step and speed.

    Exact for every policy here: if option ``e'`` is at most as expensive per step and at least
    as fast as ``e``, moving ``e``'s hours to ``e'`` keeps work and deadlines and costs no more,
    *provided ``e'`` has room*. So only dominators whose market can host every job at once
    (unlimited capacity, or ``capacity × slots >= number of jobs``) may prune; then room is
    guaranteed whatever the other jobs do. Vectorised: one lexsort and a grouped running max.

    Pruning only shrinks the explicit arrays (and the reports' option lists); the policies
    solve over every option anyway, by column generation (``spotopt.policies.columns``), so no
    inexact cut is needed for scale.
    """
    n = inp.n_options
    if n == 0:
        return np.ones(0, dtype=bool)
    per_step = inp.usd_per_hour / inp.steps_per_hour
    roomy = inp.capacity[inp.market] / inp.instances_per_hour >= inp.n_jobs
    order = np.lexsort((-inp.steps_per_hour, per_step, inp.job))
    speed_rank = np.unique(inp.steps_per_hour, return_inverse=True)[1].astype(np.int64) + 1
    jobs = inp.job[order]
    offset = jobs * (n + 2)
    value = np.where(roomy[order], speed_rank[order], 0) + offset
    running = np.maximum.accumulate(value)
    before = np.empty(n, dtype=np.int64)
    before[0] = 0
    before[1:] = running[:-1]
    first = np.ones(n, dtype=bool)
    first[1:] = jobs[1:] != jobs[:-1]
    best_before = np.where(first, 0, before - offset)
    keep = np.empty(n, dtype=bool)
    keep[order] = best_before < speed_rank[order]
    return keep


def select_options(inp: PolicyInput, keep: Array) -> PolicyInput:
    return PolicyInput(
        job=inp.job[keep],
        market=inp.market[keep],
        steps_per_hour=inp.steps_per_hour[keep],
        usd_per_hour=inp.usd_per_hour[keep],
        instances_per_hour=inp.instances_per_hour[keep],
        work_steps=inp.work_steps,
        deadline_hours=inp.deadline_hours,
        capacity=inp.capacity,
        horizon_hours=inp.horizon_hours,
        budget_usd=inp.budget_usd,
        job_names=inp.job_names,
        market_names=inp.market_names,
    )


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
        picked.sort(key=lambda e: -alloc.share[e])
        wall = float(alloc.wall_hours[j])
        deadline = float(inp.deadline_hours[j])
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
    chosen = [item for job in jobs for item in job["allocation"]]
    stale = [item for item in chosen if at - item["price_observed_at"] > STALE_PRICE_AFTER]
    if not stale:
        return []
    oldest = min(item["price_observed_at"] for item in stale)
    return [
        f"{len(stale)} of the {len(chosen)} chosen markets have prices last observed more than "
        f"{STALE_PRICE_AFTER.days} days before {at:%Y-%m-%d %H:%M} UTC (oldest {oldest:%Y-%m-%d}); "
        "AWS records a spot price only when it changes, so an old point may still hold, but check "
        "coverage (`spotopt report run coverage`) and refresh with `spotopt collect` or `spotopt import`"
    ]


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
