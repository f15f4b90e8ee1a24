"""How close can a rule that knows capacity *statistics* come to the hindsight optimum?

    python benchmarks/capacity_limits.py --traces ../shared/data/spot-traces-dev [--only NAME,…]

The availability benchmark (``benchmarks/availability.py``) leaves ``spotopt`` a few per cent
under Uniform Progress on the low-capacity traces, and the oracle well under both. This asks
whether better estimates could close that gap: it runs the capacity tables
(``spotopt.decide.waiting``, what the decision core's capacity rule decides by) on chains that
know more than any decider can, and compares them with Uniform Progress and the exact
hindsight optimum. One zone at a time, in Can't Be Late's setting (``availability.py``), and in
a world simpler than the what-if engine's, so that the optimum is exact and each run takes
seconds: ticks of the trace's gap; an instance launched in a tick runs the whole tick (the
restart first); a spot instance whose zone is out at the next probe ends at the tick's end and
keeps its work; a launch on an out zone is refused and the job may decide again in the tick.

Columns (cost as a fraction of on-demand's, mean over the starts):

- ``UP``, uniform progress: Can't Be Late's rule (as ``spotopt.whatif.strategies``).
- ``causal``: the tables on the chain learnt from what was seen before now, as the
  capacity rule learns it (the last whole day; the prior before).
- ``whole trace``: the tables on the chain learnt from the whole trace, the future included.
- ``own window``: the tables on the chain learnt from the job's own window, the future included.
- ``optimum``: the least cost with the whole trace known (backward induction over work left).

The trace's path is read, never copied (it has no license).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from availability import ON_DEMAND_USD, Setting, read_traces

from spotopt.decide import capacity_rule, waiting

Array = np.ndarray[Any, Any]
CBL = Setting()
WORK_H, DEADLINE_H, RESTART_H, SPOT_USD = CBL.work_h, CBL.deadline_h, CBL.restart_h, CBL.spot_usd
IDLE, SPOT, OD = waiting.IDLE, waiting.SPOT, waiting.ON_DEMAND
Policy = Callable[[Array, int, int, float, int, float, bool], int]
"""(trace, absolute tick, ticks since the start, hours of work done, what runs, restart left
in hours, refused in this tick) -> IDLE, SPOT or OD."""


def uniform_progress(gap_h: float) -> Policy:
    """Can't Be Late's Uniform Progress with its safety net (``DeadlineRuleDecider``)."""

    def decide(up: Array, t: int, k: int, done: float, mode: int, restart_left: float, refused: bool) -> int:
        elapsed, d = k * gap_h, RESTART_H
        has_spot = mode == SPOT or not refused
        want = SPOT if has_spot else IDLE
        if done < WORK_H * elapsed / DEADLINE_H:
            want = SPOT if has_spot else OD
        if mode == OD and (not has_spot or done <= WORK_H * (elapsed + 2 * d) / DEADLINE_H):
            want = OD
        left = math.floor((DEADLINE_H - elapsed) / gap_h + 1e-9) * gap_h
        if math.ceil((WORK_H - done + 2 * d) / gap_h - 1e-9) * gap_h >= left and mode != SPOT:
            want = OD
        if math.ceil((WORK_H - done + d) / gap_h - 1e-9) * gap_h >= left:
            want = SPOT if mode == SPOT and restart_left < 1e-3 else OD
        return want

    return decide


def tables(gap_h: float, learn: Callable[[Array, int, int], Array]) -> Policy:
    """The capacity tables on the chain learnt from ``learn(trace, tick, start tick)``'s
    series; the slack, the reserve and the pool's state and age as the capacity rule has them."""
    chains: dict[tuple[int, int, int], waiting.Chain] = {}  # learnt once per series and start
    job = waiting.Job(gap_h, RESTART_H, float(f"{SPOT_USD:.3g}"), float(f"{ON_DEMAND_USD:.3g}"))

    def decide(up: Array, t: int, k: int, done: float, mode: int, restart_left: float, refused: bool) -> int:
        seen = np.r_[np.nan, up[:t].astype(float)]  # what a probe recorded before each tick
        if refused:
            seen[-1] = 0.0
        if mode == SPOT:
            seen[-1] = 1.0
        series = learn(up, t, t - k)
        key = (id(up), len(series), t - k)
        if key not in chains:
            chains[key] = waiting.chain_from_history(series, series, gap_h, gap_h)
        spot_up = mode == SPOT or not refused
        age = waiting.age_bucket(seen, spot_up, gap_h, gap_h)
        ticks = int(np.floor((DEADLINE_H - k * gap_h) / gap_h + 1e-9))
        slack = ticks * gap_h - (WORK_H - done) - (gap_h + RESTART_H)
        left = restart_left if mode != IDLE else 0.0
        return waiting.decide(job, chains[key], ticks, slack, mode, left, spot_up, age)

    return decide


def causal(gap_h: float) -> Callable[[Array, int, int], Array]:
    def learn(up: Array, t: int, start: int) -> Array:
        seen = np.r_[np.nan, up[:t].astype(float)]
        return seen[: capacity_rule._learnt_steps(len(seen), t * gap_h, gap_h)]

    return learn


def whole_trace(up: Array, t: int, start: int) -> Array:
    return np.asarray(up, dtype=float)


def own_window(gap_h: float) -> Callable[[Array, int, int], Array]:
    def learn(up: Array, t: int, start: int) -> Array:
        window = up[start : start + round(DEADLINE_H / gap_h)].astype(float)
        return window

    return learn


def run(up: Array, start: int, gap_h: float, policy: Policy) -> tuple[float, bool]:
    """One job from tick ``start``: its cost and whether it met its deadline."""
    done, mode, restart_left, cost = 0.0, IDLE, 0.0, 0.0
    for k in range(round(DEADLINE_H / gap_h)):
        t = start + k
        if done >= WORK_H - 1e-9:
            break
        if mode == SPOT and not up[t]:
            mode, restart_left = IDLE, 0.0
        act = policy(up, t, k, done, mode, restart_left, False)
        if act == SPOT and mode != SPOT and not up[t]:  # refused: decide again, knowing it
            act = policy(up, t, k, done, mode, restart_left, True)
        if act == IDLE:
            mode = IDLE if mode == OD else mode  # neither rule stops a spot instance to wait
        elif act != mode:
            mode, restart_left = act, RESTART_H
        if mode == IDLE:
            continue
        spent = min(restart_left, gap_h)
        restart_left -= spent
        work = min(gap_h - spent, WORK_H - done)
        done += work
        cost += (SPOT_USD if mode == SPOT else ON_DEMAND_USD) * (spent + work)
    return cost, done >= WORK_H - 1e-6


def optimum(up: Array, start: int, gap_h: float, units_per_tick: int = 4) -> float:
    """The least cost of one job from tick ``start`` with the trace known, in this world, work
    counted in quarters of a tick (the restart rounded up to them)."""
    unit = gap_h / units_per_tick
    n_work = round(WORK_H / unit)
    r_units = math.ceil(RESTART_H / unit - 1e-9)
    work = np.arange(n_work + 1)
    inf = np.inf
    final = np.where(work == 0, 0.0, inf)
    # value[(mode, restart units left)] over work left, at a tick boundary
    states = [(IDLE, 0)] + [(m, r) for m in (SPOT, OD) for r in range(r_units + 1)]
    value = {s: final for s in states}
    for k in range(round(DEADLINE_H / gap_h) - 1, -1, -1):
        t = start + k
        new = {}
        for mode, rho in states:
            best = value[(IDLE, 0)].copy()
            for act, price in ((SPOT, SPOT_USD), (OD, ON_DEMAND_USD)):
                if act == SPOT and not up[t]:
                    continue
                r = rho if mode == act else r_units
                spent = min(r, units_per_tick)
                progress = units_per_tick - spent
                finish = work <= progress
                used = np.where(finish, spent + work, units_per_tick) * unit
                lost = act == SPOT and not up[t + 1]
                after = value[(IDLE, 0)] if lost else value[(act, r - spent)]
                cost = price * used + np.where(finish, 0.0, after[np.maximum(work - progress, 0)])
                best = np.minimum(best, cost)
            best[0] = 0.0
            new[(mode, rho)] = best
        value = new
    return float(value[(IDLE, 0)][n_work])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma-separated substrings of the trace names")
    ap.add_argument("--starts", type=int, default=45)
    ap.add_argument("--every", type=float, default=13.0)
    ap.add_argument("--offset", type=float, default=2.0)
    args = ap.parse_args(argv)
    traces = [t for t in read_traces(args.traces) if any(w in t.path.stem for w in args.only.split(","))]
    if not traces:
        print(f"error: no availability/1-node/*/*.json under {args.traces}", file=sys.stderr)
        return 2
    print("cost / on-demand's (share of deadlines met where below 100 %)")
    print(f"{'trace':20}{'UP':>12}{'causal':>12}{'whole trace':>12}{'own window':>12}{'optimum':>12}")
    for trace in traces:
        gap_h = trace.gap_s / 3600.0
        up = trace.up
        window = round(DEADLINE_H / gap_h)
        starts = [round((args.offset + i * args.every) / gap_h) for i in range(args.starts)]
        starts = [s for s in starts if s + window < len(up)]
        od_cost = (WORK_H + RESTART_H) * ON_DEMAND_USD
        policies = {
            "uniform-progress": uniform_progress(gap_h),
            "tables, causal": tables(gap_h, causal(gap_h)),
            "tables, whole trace": tables(gap_h, whole_trace),
            "tables, own window": tables(gap_h, own_window(gap_h)),
        }
        cells = []
        for policy in policies.values():
            cost, met = zip(*(run(up, s, gap_h, policy) for s in starts), strict=True)
            cells.append(
                f"{np.mean(cost) / od_cost:.3f}" + (f" ({np.mean(met):.0%})" if min(met) < 1 else "")
            )
        cells.append(f"{np.mean([optimum(up, s, gap_h) for s in starts]) / od_cost:.3f}")
        print(f"{trace.name:20}" + "".join(f"{c:>12}" for c in cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
