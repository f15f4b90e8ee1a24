"""The decision core: one ``decide`` for ``spotopt plan``, the what-if engine and the daemon.

``decide(state, options, guardrails, memory) -> list[Move]`` owns every decision:

1. **The policy input** (``policy_input``, the one builder): the available options of unfinished
   jobs, each priced at its forecast average price over finishing the job there
   (``spotopt.decide.forecast``) plus its move cost (``spotopt.decide.costs.move_cost_usd``)
   amortised over the job's remaining work, so the policy already prefers staying put. The
   horizon is ``max(DEFAULT_HORIZON_HOURS, deadlines)``; capacity is the options' own.
2. **When to re-solve**: the policy is solved again only when the set of unfinished or placed
   jobs changed, some job's best forecast $/step moved by more than ``RESOLVE_CHANGE``, a
   target lost its price, or, with deadlines, every ``RESOLVE_DEADLINE_H`` hours. Otherwise the
   remembered targets stand.
3. **Fallback**: ``min-cost-slo`` (the default with deadlines, else ``min-cost``) may be
   infeasible at some moment; then ``min-cost`` gives the targets and the planner's deadline
   safety decides (noted once in ``memory.notes``). A job no policy can plan on its own numbers
   (more work than the horizon holds even on its fastest option, or done in milliseconds:
   ``set_aside``) is left out of the policy input and placed by the move test alone, noted
   once, so one bad job never stops the others; if the policy still finds no solution, there
   are no targets and the move test places every job.
4. **Targets**: per job, among the options the policy gives time, the one it runs on, else the
   cheapest per step (``targets``).
5. **The rules, in order** (``RULES``, over one ``spotopt.decide.rules.Round``): the capacity
   rule (``spotopt.decide.capacity_rule``) decides the jobs whose spot markets have learnt
   capacity (wait for spot, take it, or pay for on-demand; a job it keeps on spot goes on with
   its options narrowed to its pool); then deadline safety, replacement, catch-up, dwell and
   price (``spotopt.decide.rules``). A caller may hand ``decide`` another sequence of rules.

``Memory`` is plain data (``to_dict``/``from_dict``), so a daemon restarted from its journal
decides exactly as before. Nothing here reads a clock, a database or the future: the caller
hands in the state, the options priced now and the forecast drawn from the past.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from spotopt.decide.capacity_rule import CAPACITY
from spotopt.decide.costs import forecast_usd, round_costs
from spotopt.decide.fleet import FleetState, Move, Options
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.rules import PRICE_RULES, Round, Rule, apply_rules
from spotopt.errors import InfeasibleError
from spotopt.policies.base import Allocation, PolicyInput, get_policy
from spotopt.policies.prune import prune_dominated, select_options

Array = np.ndarray[Any, Any]

DEFAULT_HORIZON_HOURS = 720.0
RESOLVE_DEADLINE_H = 6.0
RESOLVE_CHANGE = 0.05
"""Re-solve when a job's best forecast $/step moved by more than this fraction since the last
solve; a smaller change shifts the amortised costs the policy compares by less than the margin
any move needs."""

RULES: tuple[Rule, ...] = (CAPACITY, *PRICE_RULES)
"""The decision's rules in order: capacity first, then the price and deadline rules."""


@dataclass
class Memory:
    """What ``decide`` remembers between calls; plain data (see the module docstring)."""

    target: dict[str, int] = field(default_factory=dict)
    """Per job name, the key of the policy's option for it."""
    fingerprint: str = ""
    best_usd_per_step: dict[str, float] = field(default_factory=dict)
    last_solve_h: float | None = None
    solves: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": dict(self.target),
            "fingerprint": self.fingerprint,
            "best_usd_per_step": dict(self.best_usd_per_step),
            "last_solve_h": self.last_solve_h,
            "solves": self.solves,
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Memory:
        return cls(
            target={str(k): int(v) for k, v in data["target"].items()},
            fingerprint=str(data["fingerprint"]),
            best_usd_per_step={str(k): float(v) for k, v in data["best_usd_per_step"].items()},
            last_solve_h=None if data["last_solve_h"] is None else float(data["last_solve_h"]),
            solves=int(data["solves"]),
            notes=[str(n) for n in data["notes"]],
        )


MIN_PLAN_HOURS = 1e-6
"""A job that finishes sooner than this (3.6 ms) on its fastest option is set aside: the
solver's hours and tolerances cannot tell its options apart (1e9 steps/s on a few steps gave it
no hours at all: it vanished from the plan)."""


@dataclass(frozen=True)
class PolicyProblem:
    """A policy input built from a fleet state, and where its options sit in the ``Options``."""

    input: PolicyInput
    positions: Array
    jobs: Array
    """Fleet job index of each of the input's jobs."""
    set_aside: dict[int, str] = field(default_factory=dict)
    """Per fleet job left out of the input, why (``set_aside``): one line naming the job."""


def set_aside(names: Sequence[str], jobs: Array, fastest_h: Array, horizon_h: float) -> dict[int, str]:
    """The jobs (of ``jobs``, fleet indices; ``fastest_h``: each one's hours on its fastest
    option) no policy can plan, and why: one that cannot finish within the planning horizon even
    alone on its fastest option (every policy's wall time is bounded by it; 1e-6 steps/s on 1e15
    steps needs 3e17 h, which made the solve fail for every job or overflow the plan's dates),
    or one that finishes in under ``MIN_PLAN_HOURS``. They are left out so that every other job
    is still planned; the caller says so (``spotopt plan``) or places them by the move test
    alone (the decision core)."""
    out = {}
    for j, hours in zip(jobs.tolist(), fastest_h.tolist(), strict=True):
        if hours > horizon_h:
            out[j] = (
                f"job {names[j]!r} set aside: it needs {hours:.4g} h even on its fastest option, "
                f"beyond the planning horizon of {horizon_h:g} h; check its throughput and work "
                "(or give a longer --horizon)"
            )
        elif not hours >= MIN_PLAN_HOURS:
            out[j] = (
                f"job {names[j]!r} set aside: it finishes in {hours * 3600:.3g} s on its fastest "
                f"option, under the {MIN_PLAN_HOURS * 3600:g} s a plan resolves; check its throughput "
                "and work"
            )
    return out


def fresh_first(opts: Options, max_age_h: float, working: Array | None = None) -> Options:
    """``opts`` with the stale-priced options of every job that has a fresh priced one made
    unavailable (NaN price), so neither the policy nor a rule picks a price the history may have
    stopped recording over one observed lately (a 941-day-old price got 96 % of a job).

    Stale: ``price_age_h`` over ``max_age_h`` (the guardrail, from the setting
    ``price_max_age_days``). A job whose priced options are all stale keeps them (the caller
    says so). ``working``: positions of the options jobs run on now (-1: none); those keep their
    price, since an old record is no reason to stop a running instance.
    """
    if opts.price_age_h is None or opts.n_options == 0:
        return opts
    stale = opts.price_age_h > max_age_h
    usable = np.isfinite(opts.usd_per_hour) & (opts.steps_per_hour > 0)
    drop = stale & np.isin(opts.job, opts.job[usable & ~stale])
    if working is not None:
        drop[working[working >= 0]] = False
    if not drop.any():
        return opts
    return replace(opts, usd_per_hour=np.where(drop, np.nan, opts.usd_per_hour))


def default_policy(deadline_h: Array) -> str:
    return "min-cost-slo" if bool(np.isfinite(deadline_h).any()) else "min-cost"


def policy_input(
    state: FleetState,
    opts: Options,
    guard: Guardrails,
    cur: Array | None = None,
    *,
    horizon_h: float | None = None,
    prune: bool = True,
    every_job: bool = False,
    move_usd: Array | None = None,
    reserve_h: Array | None = None,
) -> PolicyProblem:
    """The one policy-input builder (see the module docstring); ``cur`` as ``opts.position(state.option)``.

    Deadlines are planned ``deadline_reserve_h`` early: the planner's deadline safety falls back
    to on-demand when less slack than a period, the margin and a restart is left, and preemption
    losses spread around their expectation; a policy that planned to use the reserve up would
    hand the job to on-demand at the first bad luck.
    ``every_job``: keep unfinished jobs without an available option (the policy then says which
    job cannot be planned; ``spotopt plan`` wants that), else they wait for the next decision.
    Jobs no policy can plan (``set_aside``) are left out, with why, so the others still are.
    A job's stale-priced options give way to its fresh ones (``fresh_first``).
    """
    cur = opts.position(state.option) if cur is None else cur
    opts = fresh_first(opts, guard.max_price_age_h, _working(state, cur))
    active = state.active
    idx = np.flatnonzero(np.isfinite(opts.usd_per_hour) & active[opts.job] & (opts.steps_per_hour > 0))
    if move_usd is None or reserve_h is None:
        move_usd, reserve_h = round_costs(state, opts, guard, cur)
    due = np.maximum(state.deadline_h - reserve_h, 1e-6)
    live = np.flatnonzero(active) if every_job else np.unique(opts.job[idx])
    finite = due[live][np.isfinite(due[live])]
    horizon = horizon_h if horizon_h is not None else max([DEFAULT_HORIZON_HOURS, *finite.tolist()])
    fastest = _fastest(opts, idx, state.n_jobs)
    placeable = live[fastest[live] > 0]  # a job with no option: the policy names it
    aside = set_aside(
        state.names, placeable, state.remaining_steps[placeable] / fastest[placeable], float(horizon)
    )
    if aside:
        idx = idx[~np.isin(opts.job[idx], list(aside))]
        live = live[~np.isin(live, list(aside))]
    job_of = opts.job[idx]
    remaining = state.remaining_steps[job_of]
    # The policy sees each option at the pessimistic end of its figure (its deadlines and wall
    # times), priced so that a step costs what it is expected to (the expected figure's cost
    # spread over the pessimistic hours): deadlines with ``low``, costs with the expected value.
    tput = opts.low[idx]
    hours = remaining / opts.steps_per_hour[idx]
    move = move_usd[idx]
    staying = (cur[job_of] == idx) & ~state.notice[job_of] & ~state.lost[job_of]
    move = np.where(staying, 0.0, move)
    usd = (forecast_usd(opts, idx, hours) + move) / (remaining / tput)
    remap = np.full(state.n_jobs, -1, dtype=np.int64)
    remap[live] = np.arange(len(live))
    deadline = due[live]
    inp = PolicyInput(
        job=remap[job_of],
        market=opts.market[idx],
        steps_per_hour=tput,
        usd_per_hour=usd,
        instances_per_hour=opts.instances_per_hour[idx],
        work_steps=state.remaining_steps[live],
        deadline_hours=deadline,
        capacity=opts.capacity,
        horizon_hours=float(horizon),
        budget_usd=guard.budget_usd,
        job_names=tuple(state.names[j] for j in live),
    )
    if prune and inp.n_options:
        keep = prune_dominated(inp)
        inp, idx = select_options(inp, keep), idx[keep]
    return PolicyProblem(inp, idx, live, aside)


def _fastest(opts: Options, idx: Array, n_jobs: int) -> Array:
    """Per job, the highest steps per hour among options ``idx`` (0: none)."""
    best = np.zeros(n_jobs)
    np.maximum.at(best, opts.job[idx], opts.steps_per_hour[idx])
    return best


def solve_policy(name: str, inp: PolicyInput, notes: list[str] | None = None) -> Allocation:
    """Solve ``name``; an infeasible ``min-cost-slo`` falls back to ``min-cost`` (noted in ``notes``)."""
    try:
        return get_policy(name)(inp)
    except InfeasibleError:
        if name != "min-cost-slo" or notes is None:
            raise
        note = "min-cost-slo infeasible at some moment: used min-cost; deadline safety decides"
        if note not in notes:
            notes.append(note)
        return get_policy("min-cost")(inp)


def targets(problem: PolicyProblem, alloc: Allocation, cur: Array) -> dict[int, int]:
    """Per fleet job, the position (in the ``Options``) of the option it should run on now.

    Among the job's options with a positive share the cheapest per step, unless the policy gives
    time to the one the job runs on (``cur``: its working instance's option, -1 for none) or to
    an option of the same speed: then that one. A job whose instance is lost or warned has none
    to stay on, so its target is the policy's own pick: taken as "the leg it is on", its dead
    instance's market drew every recovery back to it (issue 36, item 2).
    ``min-cost-slo`` may mix a cheap slow option with a fast one; run in this
    order, the job switches once, when the policy gives its current option no more time (the
    policy is solved again as time passes, and the planner moves a job whose option can no
    longer finish in time).
    """
    inp = problem.input
    used = alloc.share > 1e-9
    per_step = inp.usd_per_hour / inp.steps_per_hour
    fleet_job = problem.jobs[inp.job]
    running = problem.positions == cur[fleet_job]
    # The leg the job is on: the policy may give its time to a twin (another zone at the same
    # speed); the job stays and the move test decides whether the twin is worth a move.
    speed_now = np.full(len(cur), np.nan)
    on = np.flatnonzero(running)
    speed_now[fleet_job[on]] = inp.steps_per_hour[on]
    same_leg = np.zeros(len(cur), dtype=bool)
    same_leg[fleet_job[used & np.isclose(inp.steps_per_hour, speed_now[fleet_job])]] = True
    order = np.lexsort((per_step, inp.job))
    order = order[used[order]]
    first = np.ones(len(order), dtype=bool)
    first[1:] = inp.job[order][1:] != inp.job[order][:-1]
    pick = order[first]
    out = {int(fleet_job[e]): int(problem.positions[e]) for e in pick}
    for e in on.tolist():
        if same_leg[fleet_job[e]]:
            out[int(fleet_job[e])] = int(problem.positions[e])
    return out


def decide(
    state: FleetState,
    opts: Options,
    guard: Guardrails,
    memory: Memory,
    policy: str | None = None,
    rules: Sequence[Rule] = RULES,
) -> list[Move]:
    """The moves to make now (see the module docstring); updates ``memory`` in place."""
    if opts.n_options == 0:  # nothing priced that any job may use: nothing to decide
        return []
    cur = opts.position(state.option)
    opts = fresh_first(opts, guard.max_price_age_h, _working(state, cur))
    move_usd, reserve_h = round_costs(state, opts, guard, cur)
    _refresh_targets(state, opts, guard, memory, policy, cur, move_usd, reserve_h)
    keys = np.array([memory.target.get(name, -1) for name in state.names], dtype=np.int64)
    target = opts.position(keys)
    rnd = Round(state, opts, guard, cur, target, move_usd, reserve_h)
    return apply_rules(rnd, rules)


def _fingerprint(state: FleetState) -> str:
    placed = (state.option >= 0) & ~state.notice & ~state.lost
    text = "|".join(
        f"{n}:{int(a)}{int(p)}" for n, a, p in zip(state.names, state.active, placed, strict=True)
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _best_per_step(state: FleetState, opts: Options) -> Array:
    avail = np.isfinite(opts.usd_per_hour) & state.active[opts.job]
    with np.errstate(invalid="ignore", divide="ignore"):
        hours = state.remaining_steps[opts.job] / opts.steps_per_hour
        cost = forecast_usd(opts, np.arange(opts.n_options), hours) / state.remaining_steps[opts.job]
    best = np.full(state.n_jobs, np.inf)
    np.minimum.at(best, opts.job[avail], cost[avail])
    return best


def _refresh_targets(
    state: FleetState,
    opts: Options,
    guard: Guardrails,
    memory: Memory,
    policy: str | None,
    cur: Array,
    move_usd: Array,
    reserve_h: Array,
) -> None:
    active = state.active
    best = _best_per_step(state, opts)
    fingerprint = _fingerprint(state)
    names = state.names
    stale = memory.fingerprint != fingerprint or memory.last_solve_h is None
    if not stale:
        before = np.array([memory.best_usd_per_step.get(n, math.nan) for n in names])
        with np.errstate(invalid="ignore"):
            moved = np.abs(best - before) > before * RESOLVE_CHANGE
        stale = bool(np.any(moved[active] | ~np.isfinite(before[active])))
    if not stale:
        keys = np.array([memory.target.get(n, -1) for n in names], dtype=np.int64)
        pos = opts.position(keys)
        lost = active & ((pos < 0) | ~np.isfinite(opts.usd_per_hour[np.maximum(pos, 0)]))
        stale = bool(np.any(lost & np.isfinite(best)))
    if not stale and bool(np.isfinite(state.deadline_h[active]).any()):
        assert memory.last_solve_h is not None
        stale = state.clock_h - memory.last_solve_h >= RESOLVE_DEADLINE_H - 1e-9
    if not stale:
        return
    memory.fingerprint = fingerprint
    memory.best_usd_per_step = {n: float(b) for n, b in zip(names, best, strict=True) if math.isfinite(b)}
    memory.last_solve_h = state.clock_h
    memory.target = {}
    problem = policy_input(state, opts, guard, cur, move_usd=move_usd, reserve_h=reserve_h)
    for why in problem.set_aside.values():
        note = f"{why}; the move test alone places it"
        if note not in memory.notes:
            memory.notes.append(note)
    if problem.input.n_options == 0:
        return
    name = policy or default_policy(problem.input.deadline_hours)
    try:
        alloc = solve_policy(name, problem.input, memory.notes)
    except InfeasibleError as exc:
        # One job no policy can place (e.g. more work than the horizon holds) must not stop the
        # fleet: without targets the move test places every job on its cheapest option per step.
        note = f"no policy solution ({exc}); the move test alone decides"
        if note not in memory.notes:
            memory.notes.append(note)
        return
    memory.solves += 1
    memory.target = {
        names[j]: int(opts.key[e]) for j, e in targets(problem, alloc, _working(state, cur)).items()
    }


def _working(state: FleetState, cur: Array) -> Array:
    """Per job, the position of the option its working instance runs on (-1: none, or one
    lost or warned: nothing to stay on)."""
    return np.where(state.notice | state.lost, -1, cur)
