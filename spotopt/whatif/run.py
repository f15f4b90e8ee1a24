"""Run strategies over start times and summarise: the what-if library entry point.

``run_whatif`` replays every requested strategy (plus ``spot``, the baseline of every ratio) from
every start tick on one timeline and one preemption table; ``summarise`` turns the runs into the
``results`` rows the CLI prints (means over starts), ``placements`` into where each job ran.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from spotopt.decide.core import DEFAULT_HORIZON_HOURS, set_aside
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.options import work_steps
from spotopt.jobspec import JobSpec
from spotopt.registry import Registry
from spotopt.throughput import JobThroughput
from spotopt.whatif.engine import Decider, RunResult, simulate
from spotopt.whatif.jobs import SimJobs
from spotopt.whatif.oracle import solve_job
from spotopt.whatif.spotopt_decider import SpotoptDecider
from spotopt.whatif.strategies import (
    DEADLINE_RULES,
    FIXED,
    PERIODIC,
    DeadlineRuleDecider,
    ScheduleDecider,
    rule_decider,
)
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]
BASELINE = "spot"


@dataclass
class StrategyRun:
    strategy: str
    result: RunResult
    lower_bound_usd: Array | None = None
    notes: list[str] = field(default_factory=list)
    policy_solves: int | None = None
    """How many times the spotopt strategy's policy solved (a cost figure, not a note)."""

    @property
    def start_tick(self) -> int:
        return self.result.start_tick


def set_aside_jobs(spec: JobSpec, start: datetime) -> tuple[list[str], list[str]]:
    """The names of ``spec``'s jobs a replay from ``start`` keeps, and why each other one is left
    out: the jobs the decision core sets aside (``spotopt.decide.core.set_aside``: one that cannot
    finish within the planning horizon even alone on its fastest figure, or one too short to
    plan). No strategy can place them, and the window of 1e-6 steps/s on 1e15 steps would span
    3e17 h of history (it was a decade replayed hour by hour, minutes of solving for nothing)."""
    names = [job.name for job in spec.jobs]
    fastest = []
    for job in spec.jobs:
        book = JobThroughput(job)
        rates = [f.steps_per_s for g in job.throughput if (f := book.single(g)) is not None]
        fastest.append(work_steps(job, book) / (max(rates) * 3600.0) if rates else 0.0)
    deadlines = [h for job in spec.jobs if (h := job.deadline_hours(start)) is not None and math.isfinite(h)]
    horizon = max([DEFAULT_HORIZON_HOURS, *deadlines])
    placeable = np.flatnonzero(np.asarray(fastest) > 0)
    aside = set_aside(names, placeable, np.asarray(fastest)[placeable], horizon)
    return [n for j, n in enumerate(names) if j not in aside], list(aside.values())


def window_hours(spec: JobSpec, start: datetime, starts: int, every_h: float) -> float:
    """Hours of history a replay needs: the last start plus the longest job's horizon.

    A job's horizon is its deadline, else 1.5 times its run on its slowest GPU figure (room
    for preemptions and slow-but-cheap choices), plus a day. A job the decision core sets aside
    is not replayed (``set_aside_jobs``).
    """
    longest = 0.0
    for job in spec.jobs:
        book = JobThroughput(job)
        steps = work_steps(job, book)
        rates = [f.steps_per_s for g in job.throughput if (f := book.single(g)) is not None]
        # A slow figure beside a usable one (1e-6 and 100 steps/s) stretches the window no further
        # than 1.5 times the planning horizon or the run on the fastest figure.
        longest_run = max(steps / (max(rates) * 3600.0), DEFAULT_HORIZON_HOURS) if rates else 0.0
        slowest = 1.5 * min(steps / (min(rates) * 3600.0), longest_run) if rates else 24.0 * 30
        deadline = job.deadline_hours(start + timedelta(hours=(starts - 1) * every_h))
        longest = max(longest, (deadline if deadline is not None and deadline > 0 else slowest) + 24.0)
    return (starts - 1) * every_h + longest


def run_whatif(
    tl: Timeline,
    sim: SimJobs,
    events: Array,
    transfer: Array,
    strategies: Sequence[str],
    start_ticks: Sequence[int],
    guard: Guardrails | None = None,
    policy: str | None = None,
    on_step: Callable[[str, int], None] | None = None,
) -> list[StrategyRun]:
    """Every strategy from every start; ``spot`` is always run (it is every ratio's baseline)."""
    guard = guard or Guardrails()
    wanted = list(dict.fromkeys([*strategies, BASELINE]))
    runs = []
    for start in start_ticks:
        for name in wanted:
            runs.append(run_strategy(name, tl, sim, events, transfer, start, guard, policy))
            if on_step is not None:
                on_step(name, start)
    return runs


@dataclass(frozen=True)
class RunInputs:
    """What every strategy of one replay shares: the market, the jobs, the preemptions, the
    egress prices, and the ``spotopt`` strategy's guardrails and policy."""

    tl: Timeline
    sim: SimJobs
    events: Array
    transfer: Array
    guard: Guardrails = field(default_factory=Guardrails)
    policy: str | None = None

    def simulate(self, decider: Decider, start: int, free_moves: bool = False) -> RunResult:
        return simulate(self.tl, self.sim, self.events, self.transfer, decider, start, free_moves)


Runner = Callable[[RunInputs, int], StrategyRun]
"""``runner(inputs, start_tick) -> StrategyRun``."""

STRATEGIES: Registry[Runner] = Registry("strategy", "strategies")
"""Every strategy by name, in the order the what-if shows them (``spotopt.whatif.strategies``)."""


def _rule(name: str) -> Runner:
    def run(r: RunInputs, start: int) -> StrategyRun:
        decider = rule_decider(name, r.tl, r.sim, start)
        return StrategyRun(name, r.simulate(decider, start, free_moves=name == "dynamic"))

    return run


for _name in (*FIXED, *PERIODIC):
    STRATEGIES.add(_name, _rule(_name))


def _deadline_rule(name: str) -> Runner:
    def run(r: RunInputs, start: int) -> StrategyRun:
        return StrategyRun(name, r.simulate(DeadlineRuleDecider(r.tl, r.sim, name), start))

    return run


for _name in DEADLINE_RULES:
    STRATEGIES.add(_name, _deadline_rule(_name))


@STRATEGIES.register("spotopt")
def _spotopt(r: RunInputs, start: int) -> StrategyRun:
    spot = SpotoptDecider(r.tl, r.sim, r.transfer, r.guard, r.policy)
    result = r.simulate(spot, start)
    return StrategyRun("spotopt", result, notes=list(spot.notes), policy_solves=spot.solves)


@STRATEGIES.register("oracle")
def _oracle(r: RunInputs, start: int) -> StrategyRun:
    tl, sim = r.tl, r.sim
    plan = np.full((sim.n_jobs, tl.n_ticks - start), -1, dtype=np.int64)
    bound = np.full(sim.n_jobs, np.inf)
    notes = []
    for j in range(sim.n_jobs):
        bound[j] = solve_job(tl, sim, r.events, r.transfer, j, start).cost_usd
        path = solve_job(tl, sim, r.events, r.transfer, j, start, bound=False)
        plan[j, : len(path.plan)] = path.plan
        plan[j, len(path.plan) :] = -2
        if not path.feasible:
            notes.append(
                f"{sim.names[j]}: no schedule meets the deadline; the oracle minimised cost without it"
            )
    return StrategyRun("oracle", r.simulate(ScheduleDecider(plan, start), start), bound, notes)


def run_strategy(
    name: str,
    tl: Timeline,
    sim: SimJobs,
    events: Array,
    transfer: Array,
    start: int,
    guard: Guardrails | None = None,
    policy: str | None = None,
) -> StrategyRun:
    """Run the registered strategy ``name`` (did-you-mean ``InputError`` for an unknown one)."""
    return STRATEGIES.lookup(name)(RunInputs(tl, sim, events, transfer, guard or Guardrails(), policy), start)


def _mean(values: list[float]) -> float | None:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def summarise(runs: Sequence[StrategyRun], sim: SimJobs, strategies: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (job, strategy): means over starts (the ``results`` of the JSON output).

    ``throughput_source``: where the figures of the options the job ran on came from (``spec``,
    ``measured``, ``imported``, ``estimated``; several joined by ``, ``; None: it never ran), so
    a result that rests on an estimate says so."""
    rows = []
    for j, name in enumerate(sim.names):
        per: dict[str, dict[str, list[Any]]] = {}
        for run in runs:
            d = per.setdefault(
                run.strategy, {k: [] for k in ("cost", "bound", "finish", "met", "moves", "pre", "source")}
            )
            res = run.result
            d["source"].extend(sim.figure_source[e] for e in np.unique(res.trace[j]).tolist() if e >= 0)
            finished = math.isfinite(res.finish_h[j])
            cost = res.cost_usd[j] if finished else math.inf
            if run.lower_bound_usd is not None:
                d["bound"].append(float(run.lower_bound_usd[j]))
            d["cost"].append(cost)
            d["finish"].append(res.finish_h[j] if finished else math.inf)
            deadline = sim.deadline_h[j]
            d["met"].append(
                None if not math.isfinite(deadline) else bool(finished and res.finish_h[j] <= deadline + 1e-6)
            )
            d["moves"].append(int(res.moves[j]))
            d["pre"].append(int(res.preemptions[j]))
        base = _mean(per.get(BASELINE, {}).get("cost", []))
        for strategy in strategies:
            d = per[strategy]
            cost = _mean(d["cost"])
            unfinished = sum(1 for f in d["finish"] if not math.isfinite(f))
            met = [m for m in d["met"] if m is not None]
            row: dict[str, Any] = {
                "job": name,
                "strategy": strategy,
                "cost_usd": cost,
                "ratio_vs_spot": cost / base if cost is not None and base else None,
                "finish_hours": _mean(d["finish"]),
                "deadline_met": None if not met else (sum(met) / len(met) if len(met) > 1 else met[0]),
                "moves": float(np.mean(d["moves"])),
                "preemptions": float(np.mean(d["pre"])),
                "unfinished_starts": unfinished,
                "throughput_source": ", ".join(sorted(set(d["source"]))) or None,
            }
            if d["bound"]:
                row["bound_usd"] = _mean(d["bound"])
            rows.append(row)
    return rows


def placements(run: StrategyRun, tl: Timeline, sim: SimJobs) -> list[dict[str, Any]]:
    """Where each job ran and when: one row per stretch on one option (idle stretches omitted)."""
    rows = []
    trace = run.result.trace
    for j, name in enumerate(sim.names):
        k = 0
        row = trace[j]
        while k < len(row):
            e = int(row[k])
            end = k
            while end < len(row) and row[end] == e:
                end += 1
            if e >= 0:
                q = tl.markets[int(sim.market[e])].quote
                rows.append(
                    {
                        "job": name,
                        "strategy": run.strategy,
                        "from": tl.time(run.start_tick + k),
                        "to": tl.time(run.start_tick + end),
                        "cloud": q.cloud,
                        "region": q.region,
                        "zone": q.zone,
                        "instance_type": q.instance_type,
                        "market": q.market,
                        "gpu": sim.gpu[e],
                        "gpus": int(sim.gpus[e]),
                        "jobs_per_instance": int(sim.slots[e]),
                        "throughput_source": sim.figure_source[e],
                    }
                )
            k = end
    return rows
