"""``spotopt plan``: the fleet's policy input, solved, and back to a readable plan.

A report over the decision core (``spotopt.decide``):

- ``build_problem(...) -> PlanProblem``: the policy input for the fleet before any job runs,
  built by the decision core's one builder (``spotopt.decide.core.policy_input``) over the
  options of ``spotopt.decide.options``, dominated options pruned (exactly, see
  ``spotopt.policies.prune``).
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

from spotopt.agent.steady import WARMUP_STEPS
from spotopt.decide.core import policy_input
from spotopt.decide.egress import entry_usd
from spotopt.decide.fleet import FleetState
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.options import Excluded, OptionInfo, enumerate_options, initial_state, price_age_h
from spotopt.errors import InputError
from spotopt.history.market import MarketState
from spotopt.jobspec import Job, JobSpec
from spotopt.policies.base import Allocation, Array, PolicyInput, get_policy
from spotopt.policies.prune import prune_dominated, select_options
from spotopt.render import usd
from spotopt.throughput import (
    StoredFigure,
)


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
    fleet_jobs: Array | None = None
    """Index in ``state`` of each of ``jobs`` (None: the same order)."""
    set_aside: list[str] = field(default_factory=list)
    """Why each job left out of the plan was (``spotopt.decide.core.set_aside``), one line each."""
    max_price_age_h: float = math.inf
    """A price older than this at ``at`` is stale (``Guardrails.max_price_age_h``): the core
    plans a job on stale prices only when it has no fresh one, and the report says so."""
    excluded: list[list[Excluded]] = field(default_factory=list)
    """Per job of ``jobs``, the GPU models and counts its memory rules out."""


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
    if table.no_option:
        raise InputError("; ".join(table.no_option.values()))
    state, opts = initial_state(spec, table, markets, at)
    opts = dataclasses.replace(opts, capacity=np.full(len(markets), capacity, dtype=float))
    guard = Guardrails(period_h=period_h, budget_usd=budget_usd).with_jobs(spec.jobs)
    built = policy_input(state, opts, guard, horizon_h=horizon_hours, prune=False, every_job=True)
    aside = list(built.set_aside.values())
    if not len(built.jobs):
        raise InputError(f"{'; '.join(aside)}: no job left to plan")
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
        inp,
        infos,
        [spec.jobs[j] for j in built.jobs.tolist()],
        at,
        list(markets),
        _ranked(inp, infos),
        state=state,
        billing=billing,
        fleet_jobs=built.jobs,
        set_aside=aside,
        max_price_age_h=guard.max_price_age_h,
        excluded=[table.excluded[j] for j in built.jobs.tolist()],
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


def _hours(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


PROFILE_STEPS = 100
"""Steps a profile run measures where a plan's warning names one (``spotopt throughput
profile``'s default): enough for a steady rate after the warm-up."""


def plan_report(problem: PlanProblem, alloc: Allocation, jobs_file: str = "JOBS.yaml") -> dict[str, Any]:
    """The plan as a JSON-ready dict (schema in docs/guides/plan.md); ``jobs_file`` is named in
    the profile a warning suggests."""
    inp = problem.input
    jobs = []
    settle: list[str] = []
    for j, job in enumerate(problem.jobs):
        picked = [e for e in np.flatnonzero(inp.job == j) if alloc.share[e] > 1e-6]
        picked.sort(key=lambda e: inp.usd_per_hour[e] / inp.steps_per_hour[e])  # the order they run in
        wall = float(alloc.wall_hours[j])
        fleet_j = j if problem.fleet_jobs is None else int(problem.fleet_jobs[j])
        deadline = float(problem.state.deadline_h[fleet_j]) if problem.state else float(inp.deadline_hours[j])
        steps = float(inp.work_steps[j])
        cost = float(alloc.cost_usd[j])
        chosen = {id(problem.options[e]) for e in picked}
        runner = next((r for r in problem.ranked.get(j, []) if id(r[1]) not in chosen), None)
        if picked and runner is not None:
            first = float(inp.usd_per_hour[picked[0]] / inp.steps_per_hour[picked[0]])
            why = spanning_estimate(job, (first, problem.options[picked[0]]), runner, jobs_file)
            if why is not None:
                settle.append(why)
        allocation = [
            {
                **_market_fields(problem, problem.options[e]),
                "share": float(alloc.share[e]),
                "hours": float(alloc.hours[e]),
                "usd_per_step": float(inp.usd_per_hour[e] / inp.steps_per_hour[e]),
            }
            for e in picked
        ]
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
                "stale": any(item["stale"] for item in allocation),
                "runner_up": None
                if runner is None
                else {**_market_fields(problem, runner[1]), "usd_per_step": runner[0]},
                "allocation": allocation,
                "excluded": [dataclasses.asdict(x) for x in problem.excluded[j]] if problem.excluded else [],
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
        "price_max_age_days": problem.max_price_age_h / 24.0,
        "total_cost_usd": alloc.total_cost_usd,
        "makespan_hours": _hours(alloc.makespan_hours),
        "options": inp.n_options,
        "pruned_options": problem.pruned,
        "jobs": jobs,
        "set_aside": problem.set_aside,
        "warnings": [
            *problem.set_aside,
            *stale_price_warnings(problem.at, jobs, problem.max_price_age_h / 24.0),
            *settle,
        ],
    }


def spanning_estimate(
    job: Job, chosen: tuple[float, OptionInfo], runner: tuple[float, OptionInfo], jobs_file: str
) -> str | None:
    """Why ``job``'s choice (``chosen`` over the ``runner`` up, each with its expected $/step)
    rests on an estimate, or None: at the chosen option's low end and the runner-up's high end
    the runner-up is the cheaper per step. Names the profile run that would settle it (of the
    estimated one, the chosen first) and what it costs at that option's market price (the
    job's start-up, the warm-up and ``PROFILE_STEPS`` at the low end)."""
    (usd_c, c), (usd_r, r) = chosen, runner
    if not (c.figure.estimated or r.figure.estimated):
        return None
    worst_c = usd_c * c.figure.steps_per_s / c.figure.interval[0]
    best_r = usd_r * r.figure.steps_per_s / r.figure.interval[1]
    if worst_c <= best_r:
        return None
    o = c if c.figure.estimated else r
    low, high = o.figure.interval
    seconds = job.restart_s + (WARMUP_STEPS + PROFILE_STEPS) / low
    cost = o.market.quote.usd_per_hour * seconds / 3600.0
    counts = f" --counts {o.gpus}" if o.gpus != 1 else ""
    return (
        f"job {job.name!r}: the choice of {c.market.quote.gpu} x{c.gpus} over {r.market.quote.gpu} x{r.gpus} "
        f"rests on an estimate ({o.market.quote.gpu} x{o.gpus}: {o.figure.steps_per_s:.3g} steps/s, "
        f"80 % interval {low:.3g}-{high:.3g}) whose interval spans it; "
        f"`spotopt throughput profile {jobs_file} --gpu {o.market.quote.gpu}{counts} "
        f"--steps {PROFILE_STEPS}` "
        f"would settle it for about {usd(cost)} at {usd(o.market.quote.usd_per_hour)}/h"
    )


def stale_price_warnings(at: datetime, jobs: list[dict[str, Any]], max_age_days: float) -> list[str]:
    """Say which jobs are planned on stale prices (``"stale"``: they had no fresh one, or the core
    would have preferred it): a point holds until the next one, so an old point is the price "at"
    t as far as the history knows, but the history may simply have stopped."""
    stale_jobs = [job for job in jobs if job["stale"]]
    if not stale_jobs:
        return []
    items = [item for job in stale_jobs for item in job["allocation"] if item["stale"]]
    oldest = max(items, key=lambda item: item["price_age_days"])
    aws_spot = any(item["cloud"] == "aws" and item["market"] == "spot" for item in items)
    why = (
        "AWS records a spot price only when it changes, so an old point may still hold, but "
        if aws_spot
        else ""
    )
    names = ", ".join(repr(job["name"]) for job in stale_jobs[:3]) + (", ..." if len(stale_jobs) > 3 else "")
    return [
        f"{len(stale_jobs)} of the {len(jobs)} planned jobs ({names}) have no price observed within "
        f"{max_age_days:g} days of {at:%Y-%m-%d %H:%M} UTC (setting price_max_age_days) and are planned "
        f"on stale ones (oldest {oldest['price_observed_at']:%Y-%m-%d}, {oldest['price_age_days']:,.0f} "
        f"days old); {why}check coverage (`spotopt report run coverage`) and refresh with "
        "`spotopt collect` or `spotopt import`"
    ]


def _market_fields(problem: PlanProblem, o: OptionInfo) -> dict[str, Any]:
    q = o.market.quote
    age_h = price_age_h(q.observed_at, problem.at)
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
        "price_age_days": age_h / 24.0,
        "stale": age_h > problem.max_price_age_h,
        "steps_per_s": o.figure.steps_per_s * o.efficiency,
        "throughput_source": o.figure.source,
        "throughput_low": o.figure.interval[0] * o.efficiency,
        "throughput_high": o.figure.interval[1] * o.efficiency,
        "preemptions_per_hour": o.market.preemptions_per_hour,
        "rate_source": o.market.rate_source,
        "checkpoint_interval_s": o.checkpoint_interval_s,
        "egress_usd": o.egress_usd,
    }
