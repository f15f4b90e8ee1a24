"""The hindsight oracle: the cheapest schedule knowing every future price and this run's preemptions.

Formulation: a shortest path per job over the time-expanded state graph

    (tick t, state s, progress k)   s ∈ {running on option e} ∪ {no instance, checkpoint at region l}

with the engine's own tick rule (``spotopt.whatif.engine.tick_terms``): entering an option pays
the restart and egress (checkpoint from the checkpoint's region, dataset where the region holds
no copy), a preemption keeps the work up to the last checkpoint and leaves the job without an
instance, the last tick bills only the time used. Jobs run on one option at a time, so jobs are
independent (the history has no capacity limits) and each gets its own DP. A job without a
deadline may not idle while any of its options has a price; a job with a deadline may, and must
finish by it.

Progress is continuous; the DP puts it on a grid of ``K`` steps of ``W/K`` and rounds every
tick's gain *up* to the grid. The DP state then never lags the true progress of the same
decisions, so its value is a **lower bound** on the cost of every schedule in this model, in
particular of every strategy with the same overheads (that is what ``cost_usd`` of ``oracle``
reports). Its decisions are then replayed through the simulator, which gives an achievable
cost (``schedule_usd``); the two differ by the grid's rounding, reported as the gap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotopt.whatif.engine import TickTerms, tick_terms
from spotopt.whatif.jobs import SimJobs
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]

DEFAULT_GRID = 2000
MAX_CELLS = 60_000_000
"""Bound on stored back-pointers (ticks × states × grid) per job; the grid shrinks to fit."""


@dataclass
class OraclePath:
    cost_usd: float
    plan: Array
    """Option per tick from the start (-1: idle); -2 after the DP's finish (continue as is)."""
    feasible: bool
    grid: int


@dataclass
class _Back:
    inc: Array  # (E, 2, 2): [option, entering, preempted] → grid increment
    pred_a: Array  # (E, K) int8: 1 = entered, 0 = stayed
    pred_ent: Array  # (Ld, K) int16: source location of the entry
    src_s: Array  # (L+1, K) int16: option the location's best source ran on, -1: no instance
    pred_b: Array  # (L+1, K) int32: -1 idle, -2-e paused from e, 2e+entering preempted on e


def _egress_matrix(sim: SimJobs, j: int, transfer: Array, dest: Array) -> Array:
    """Dollars to enter each destination location from each source location (last row: nowhere)."""
    n_src = transfer.shape[0]
    src = np.arange(n_src)[:, None]
    ckpt = sim.checkpoint_gb[j] * transfer[:, dest]
    home = int(sim.dataset_location[j])
    if home < 0:
        return ckpt
    needs = (dest[None, :] != home) & (dest[None, :] != np.where(src == n_src - 1, -1, src))
    return ckpt + np.where(needs, sim.dataset_gb[j] * transfer[home, dest][None, :], 0.0)


def solve_job(
    tl: Timeline,
    sim: SimJobs,
    events: Array,
    transfer: Array,
    j: int,
    start_tick: int,
    grid: int = DEFAULT_GRID,
    respect_deadline: bool = True,
    optimistic: bool = True,
) -> OraclePath:
    """The DP for job ``j`` from ``start_tick`` (see the module docstring).

    ``optimistic`` rounds each tick's gain up (the value is a lower bound); otherwise down (the
    path is feasible in the simulator: its true progress never lags the DP's, so it finishes no
    later than the DP says, deadline included; the value is then an achievable cost).
    """
    lo, hi = sim.bounds()[j : j + 2]
    eo = np.arange(lo, hi)
    n_opt = len(eo)
    n_loc = transfer.shape[0] - 1
    nowhere = n_loc
    work = float(sim.work[j])
    deadline = float(sim.deadline_h[j]) if respect_deadline else math.inf
    end = tl.n_ticks
    if math.isfinite(deadline):
        end = min(end, start_tick + math.ceil(deadline / tl.tick_h - 1e-9))
    n_ticks = max(end - start_tick, 0)
    states = n_opt + 3 * (n_loc + 1)
    k_grid = int(max(50, min(grid, MAX_CELLS // max(1, n_ticks * states))))
    q = work / k_grid
    loc_e = sim.location[eo]
    dests = np.unique(loc_e)
    dest_of = np.searchsorted(dests, loc_e)
    egress = _egress_matrix(sim, j, transfer, dests)  # (L+1, Ld)
    remaining = work - np.arange(k_grid) * q  # optimistic: what is left if progress is exactly k·q
    jobs = np.full(n_opt, j)
    a = np.full((n_opt, k_grid), np.inf)
    b = np.full((n_loc + 1, k_grid), np.inf)
    b[nowhere, 0] = 0.0
    best, best_at = math.inf, None
    backs: list[_Back] = []
    for t in range(start_tick, end):
        elapsed = (t - start_tick) * tl.tick_h
        avail = np.isfinite(tl.price[sim.market[eo], t])
        s = b.copy()
        src_s = np.full((n_loc + 1, k_grid), -1, dtype=np.int16)
        for e in range(n_opt):
            better = a[e] < s[loc_e[e]]
            s[loc_e[e]] = np.where(better, a[e], s[loc_e[e]])
            src_s[loc_e[e]][better] = e
        through = s[:, None, :] + egress[:, :, None]
        pred_ent = through.argmin(axis=0).astype(np.int16)
        ent = through.min(axis=0)
        a_next = np.full_like(a, np.inf)
        b_next = np.full_like(b, np.inf)
        pred_a = np.zeros((n_opt, k_grid), dtype=np.int8)
        pred_b = np.full((n_loc + 1, k_grid), -1, dtype=np.int32)
        inc = np.zeros((n_opt, 2, 2), dtype=np.int64)
        for entering in (0, 1):
            terms = tick_terms(tl, sim, events, t, jobs, eo, np.full(n_opt, bool(entering)))
            for e in np.flatnonzero(avail).tolist():
                src = ent[dest_of[e]] if entering else a[e]
                if not np.isfinite(src).any():
                    continue
                best, best_at = _finish(
                    terms, e, src, remaining, elapsed, deadline, best, best_at, (t, e, entering)
                )
                cap = terms.capacity[e]
                open_k = remaining > cap + 1e-9 * max(work, 1.0)
                step = int(
                    math.ceil(terms.saved[e] / q - 1e-9)
                    if optimistic
                    else math.floor(terms.saved[e] / q + 1e-9)
                )
                pre = bool(terms.preempted[e])
                inc[e, entering, int(pre)] = step
                cost = terms.price[e] * terms.run_h[e]
                val = np.where(open_k, src + cost, np.inf)
                over = val[max(k_grid - step, 0) :]
                if step > 0 and np.isfinite(over).any():
                    k_over = max(k_grid - step, 0) + int(np.argmin(over))
                    if (
                        not math.isfinite(deadline) or elapsed + terms.run_h[e] <= deadline + 1e-9
                    ) and over.min() < best:
                        best, best_at = float(over.min()), (t, e, entering, k_over)
                if step >= k_grid:
                    continue
                shifted = np.full(k_grid, np.inf)
                shifted[step:] = val[: k_grid - step]
                if pre:
                    dst, row = b_next, loc_e[e]
                    better = shifted < dst[row]
                    dst[row] = np.where(better, shifted, dst[row])
                    pred_b[row][better] = 2 * e + entering
                else:
                    better = shifted < a_next[e]
                    a_next[e] = np.where(better, shifted, a_next[e])
                    pred_a[e][better] = entering
        if math.isfinite(deadline) or not avail.any():
            better = b < b_next
            b_next = np.where(better, b, b_next)
            pred_b[better] = -1
            for e in range(n_opt):
                row = loc_e[e]
                better = a[e] < b_next[row]
                b_next[row] = np.where(better, a[e], b_next[row])
                pred_b[row][better] = -2 - e
        backs.append(_Back(inc, pred_a, pred_ent, src_s, pred_b))
        a, b = a_next, b_next
        if min(a.min(initial=np.inf), b.min()) >= best:
            break
    if best_at is None:
        if math.isfinite(deadline):
            path = solve_job(tl, sim, events, transfer, j, start_tick, grid, False, optimistic)
            return OraclePath(path.cost_usd, path.plan, False, path.grid)
        return OraclePath(math.inf, np.full(n_ticks, -1, dtype=np.int64), False, k_grid)
    plan = _backtrack(backs, best_at, start_tick, dest_of, eo, n_ticks)
    return OraclePath(best, plan, True, k_grid)


def _finish(
    terms: TickTerms,
    e: int,
    src: Array,
    remaining: Array,
    elapsed: float,
    deadline: float,
    best: float,
    best_at: tuple[int, ...] | None,
    where: tuple[int, int, int],
) -> tuple[float, tuple[int, ...] | None]:
    """Best way to finish within this tick on option ``e`` from the values ``src``."""
    cap = terms.capacity[e]
    rate = terms.rate[e]
    if rate <= 0:
        return best, best_at
    ok = remaining <= cap + 1e-9 * max(float(remaining[0]), 1.0)
    used = terms.restart_h[e] + remaining / rate
    if math.isfinite(deadline):
        ok &= elapsed + used <= deadline + 1e-9
    val = np.where(ok, src + terms.price[e] * used, np.inf)
    k = int(np.argmin(val))
    if val[k] < best:
        return float(val[k]), (*where, k)
    return best, best_at


def _backtrack(
    backs: list[_Back],
    best_at: tuple[int, ...],
    start: int,
    dest_of: Array,
    eo: Array,
    n_ticks: int,
) -> Array:
    """Options per tick of the optimal path, from the finishing transition back to the start."""
    plan = np.full(n_ticks, -2, dtype=np.int64)
    t, e, entering, k = best_at
    plan[t - start] = eo[e]
    kind, idx = _arrival(backs[t - start], dest_of, e, entering, k)
    while t > start:
        t -= 1
        back = backs[t - start]
        if kind == "a":
            e = idx
            entering = int(back.pred_a[e, k])
            k -= int(back.inc[e, entering, 0])
            plan[t - start] = eo[e]
            kind, idx = _arrival(back, dest_of, e, entering, k)
            continue
        code = int(back.pred_b[idx, k])
        if code == -1:
            plan[t - start] = -1
        elif code <= -2:
            plan[t - start] = -1
            kind, idx = "a", -2 - code
        else:
            e, entering = code // 2, code % 2
            k -= int(back.inc[e, entering, 1])
            plan[t - start] = eo[e]
            kind, idx = _arrival(back, dest_of, e, entering, k)
    return plan


def _arrival(back: _Back, dest_of: Array, e: int, entering: int, k: int) -> tuple[str, int]:
    """The state (at the start of the tick) a transition onto option ``e`` at grid ``k`` came from."""
    if not entering:
        return "a", e
    loc = int(back.pred_ent[dest_of[e], k])
    src = int(back.src_s[loc, k])
    return ("a", src) if src >= 0 else ("b", loc)
