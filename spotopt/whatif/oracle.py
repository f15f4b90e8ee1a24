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

Progress is continuous, so each (tick, state) keeps one *label* (cost, progress) per bucket of a
grid of ``K`` buckets of ``W/K`` steps; gains are added exactly, buckets only decide which labels
compete. Labels of different progress are compared through an exchange rate λ, a price per step
that extra progress is surely worth:

**Lemma.** Let S be a schedule and ``F(p)`` the cost of S's remaining actions run from progress
``p`` at tick t (gains do not depend on progress, so the run from ``P ≥ p`` stays ``P − p``
ahead and finishes no later, in some tick ``T``). Then ``F(p) − F(P) ≥ λ·(P − p)`` for λ the least
$/step (price ÷ (steps/h × checkpoint efficiency)) of any option at any tick from ``T`` on:
before ``T`` both runs pay the same. If both finish in ``T``, the run from ``p`` bills
``(P − p)/rate`` more hours at ``price ≥ λ·rate``. Otherwise it pays the whole of tick ``T``,
``price/rate·(capacity − rest)`` more, and still has ``rest + (P − p) − saved ≥ (P − p) −
(capacity − rest)`` to do after ``T``, at ``≥ λ`` per step (a tick bills at least ``price/rate``
per step it keeps). Its restarts and egress are the same or more. ``T`` is no earlier than
``t + ⌈(W − P) / (most work of any option in a tick)⌉ − 1``, so per bucket ``k`` the DP uses
λ from that tick for ``P`` = the bucket's upper edge (``_exchange_rates``; λ grows with t).

Two passes:

- **bound**: a cell keeps the *cover* of its labels: progress ``P`` = their most progress and
  cost the least ``c + λ·(P − p)``. Invariant: for every schedule S, at every tick some DP
  label ``L`` (S's state; between instances, the region of S's checkpoint) has ``p_L ≥ p_S``
  and ``c_L + F(p_L) ≤ c_S + F(p_S)``. The DP takes S's action from ``L`` too (equality), a
  merge keeps it by the lemma, and where ``L`` finishes it costs at most what S does. So the
  DP's value is a **lower bound** on the cost of every schedule in this model, in particular of
  every strategy with the same overheads; it is what ``bound_usd`` of ``oracle`` reports. A
  merge only adds progress bought at λ where the schedule pays its own price, so the bound is
  within a fraction of a percent of the schedule (``benchmarks/oracle_gap.py``; merging to
  (least cost, most progress) of different labels, as before, was 2-3 % below it on real data).
- **path**: a cell keeps its real label of least ``c − λ·p`` (the same ranking, ties: more
  progress). Every label is then a real schedule; the cheapest finishing one is replayed through
  the simulator: the oracle's ``cost_usd``, an achievable cost.

Both passes drop a label once ``c + λ(t)·(W − p)``, with λ(t) the least $/step from t on (no
finish can cost less), reaches the cheapest finish found so far, or when the fastest option
could not finish its work by the horizon; the scan ends when no label is left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotopt.decide.egress import entry_usd
from spotopt.price import per_slot
from spotopt.whatif.engine import tick_terms
from spotopt.whatif.jobs import SimJobs
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]

DEFAULT_GRID = 2000
"""Progress buckets per job. On the bundled AWS trace the bound's gap to the schedule was 0.32 %
at 1,000 buckets and 0.12 % at 2,000 on a deadline job with a cheap slow and a fast leg (10
starts), for twice the time; 2,000 keeps every job within the 0.5 % the bound is held to."""
MAX_CELLS = 30_000_000
"""Bound on stored back-pointers (ticks × states × grid) of the path pass; its grid shrinks to fit."""


@dataclass
class OraclePath:
    cost_usd: float
    plan: Array
    """Option per tick from the start (-1: idle); -2 after the DP's finish (continue as is)."""
    feasible: bool
    grid: int


@dataclass
class _Labels:
    """One label per (state, bucket): states are options (running) then locations (no instance)."""

    cost: Array
    prog: Array


def undominated(tl: Timeline, sim: SimJobs, events: Array, eo: Array, start: int) -> Array:
    """Drop options another option of the job beats at every tick from ``start`` on (exact).

    ``e2`` dominates ``e`` when both are in the same region (same egress to and from anywhere),
    ``e2`` advances at least as fast and never costs more, is available whenever ``e`` is, is
    never preempted where ``e`` is available, and ``e`` itself is never preempted: swapping
    ``e2`` for ``e`` in any schedule then costs no more and progresses no less in every tick.
    (A preempted ``e`` bills only part of its tick, which a never-preempted ``e2`` cannot match:
    such an ``e`` is kept.) Of two identical options the first is kept.
    """
    price = per_slot(tl.price[sim.market[eo], start:], sim.slots[eo][:, None])
    price = np.where(np.isfinite(price), price, np.inf)
    avail = np.isfinite(price)
    pre = np.isfinite(events[sim.market[eo], start:]) & avail
    rate = sim.steps_per_hour[eo] * sim.checkpoint_eff[eo]
    never: Array = ~np.any(pre, axis=1)
    loc = sim.location[eo]
    keep = np.ones(len(eo), dtype=bool)
    for a in np.flatnonzero(never).tolist():
        rivals = np.flatnonzero(keep & (loc == loc[a]) & (rate >= rate[a]))
        rivals = rivals[rivals != a]
        if len(rivals) == 0:
            continue
        cheaper = np.all(price[rivals] <= price[a], axis=1) & ~np.any(pre[rivals] & avail[a], axis=1)
        same = (rate[rivals] == rate[a]) & np.all(price[rivals] == price[a], axis=1) & never[rivals]
        if np.any(cheaper & (~same | (rivals < a))):
            keep[a] = False
    return eo[keep]


def _egress_matrix(sim: SimJobs, j: int, transfer: Array, dest: Array) -> Array:
    """Dollars to enter each destination location from each source location (last row: nowhere),
    by the one egress rule (``spotopt.decide.egress.entry_usd``)."""
    n_src = transfer.shape[0]
    src = np.arange(n_src)
    here = np.where(src == n_src - 1, -1, src)[:, None]
    return entry_usd(
        transfer,
        here,
        dest[None, :],
        sim.checkpoint_gb[j],
        sim.dataset_gb[j],
        sim.dataset_location[j],
    )


def step_price_floor(tl: Timeline, sim: SimJobs, eo: Array, start: int, end: int) -> Array:
    """λ per tick from ``start`` to ``end`` (inclusive): the least $/step of ``eo`` from then on.

    Entry ``k`` is the minimum over ticks ``start + k … end − 1`` and options of price per step
    (``inf`` where no option has a price any more, and at ``end``).
    """
    rate = sim.steps_per_hour[eo] * sim.checkpoint_eff[eo]
    price = per_slot(tl.price[sim.market[eo], start:end], sim.slots[eo][:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        per_step = np.where(np.isfinite(price) & (rate[:, None] > 0), price / rate[:, None], np.inf)
    per_tick = per_step.min(axis=0, initial=np.inf)
    return np.append(np.minimum.accumulate(per_tick[::-1])[::-1], np.inf)


def _exchange_rates(floor: Array, work: float, k_grid: int, per_tick: float) -> Array:
    """λ per (tick from the start, bucket): the least $/step from the earliest tick a label can finish.

    A label with progress up to bucket ``k``'s upper edge needs at least ``⌈rest / per_tick⌉``
    ticks (``per_tick``: the most work of any option in a tick), so the steps a schedule saves by
    covering it are paid no earlier than that many ticks on (see the lemma), at no less than the
    floor there. Where no price is left nothing finishes and any rate is valid: 0.
    """
    edge_rest = work - np.arange(1, k_grid + 1) * (work / k_grid)
    wait = np.maximum(np.ceil(edge_rest / per_tick - 1e-9) - 1, 0).astype(np.int64) if per_tick > 0 else 0
    at = np.minimum(np.arange(len(floor))[:, None] + wait, len(floor) - 1)
    lam: Array = np.where(np.isfinite(floor[at]), floor[at], 0.0)
    return lam


def solve_job(
    tl: Timeline,
    sim: SimJobs,
    events: Array,
    transfer: Array,
    j: int,
    start_tick: int,
    grid: int = DEFAULT_GRID,
    respect_deadline: bool = True,
    bound: bool = True,
) -> OraclePath:
    """The DP for job ``j`` from ``start_tick``: the lower bound (``bound``) or a real schedule."""
    lo, hi = sim.bounds()[j : j + 2]
    eo = undominated(tl, sim, events, np.arange(lo, hi), start_tick)
    n_opt = len(eo)
    n_loc = transfer.shape[0] - 1
    work = float(sim.work[j])
    deadline = float(sim.deadline_h[j]) if respect_deadline else math.inf
    end = tl.n_ticks
    if math.isfinite(deadline):
        end = min(end, start_tick + math.ceil(deadline / tl.tick_h - 1e-9))
    n_ticks = max(end - start_tick, 0)
    # A restart longer than a tick carries over: per option, one state per tick still restarting
    # (``carry[k]`` hours left), between the running states and the idle ones.
    restart = float(sim.restart_h[j])
    carry = [restart - k * tl.tick_h for k in range(1, math.ceil(restart / tl.tick_h - 1e-9))]
    n_run = n_opt * (1 + len(carry))
    n_states = n_run + n_loc + 1
    k_grid = grid if bound else int(max(50, min(grid, MAX_CELLS // max(1, n_ticks * n_states))))
    q = work / k_grid
    floor = step_price_floor(tl, sim, eo, start_tick, max(end, start_tick))
    fastest = float(np.max(sim.steps_per_hour[eo] * sim.checkpoint_eff[eo], initial=0.0))
    lam = _exchange_rates(floor, work, k_grid, fastest * tl.tick_h)
    loc_e = sim.location[eo]
    state_loc = np.concatenate([np.tile(loc_e, 1 + len(carry)), np.arange(n_loc + 1)])
    dests = np.unique(loc_e)
    dest_of = np.searchsorted(dests, loc_e)
    by_loc = [np.flatnonzero(state_loc == loc) for loc in range(n_loc + 1)]
    egress = _egress_matrix(sim, j, transfer, dests)  # (L+1, Ld)
    jobs = np.full(n_opt, j)
    lab = _Labels(np.full((n_states, k_grid), np.inf), np.zeros((n_states, k_grid)))
    lab.cost[n_run + n_loc, 0] = 0.0
    best, best_cell, best_tick, best_opt = math.inf, -1, -1, -1
    prev_cells: list[Array] = []
    actions: list[Array] = []
    # Per kind of transition into an option: stay (restart 0), enter (the restart), go on
    # restarting (``carry``); and the state each leads to when the tick ends without a finish.
    restarts = [0.0, restart, *carry]
    opt_ids = np.arange(n_opt)
    after = [
        opt_ids,
        *(opt_ids + n_opt * (1 + c) if c < len(carry) else opt_ids for c in range(len(carry) + 1)),
    ]
    for t in range(start_tick, end):
        elapsed = (t - start_tick) * tl.tick_h
        avail = tl.launchable(t)[sim.market[eo]]
        if not np.isfinite(lab.cost).any():
            break
        now, later = lam[t - start_tick], lam[t + 1 - start_tick]  # per bucket
        sources = _sources(lab, by_loc, k_grid, bound, now)
        ent_c, ent_p, ent_cell = _entries(sources, egress, bound, now)
        own = [
            (opt_ids + n_opt * (1 + c))[:, None] * k_grid + np.arange(k_grid)[None, :]
            for c in range(len(carry))
        ]
        src_c = np.stack(
            [
                lab.cost[:n_opt],
                ent_c[dest_of],
                *(lab.cost[n_opt * (1 + c) : n_opt * (2 + c)] for c in range(len(carry))),
            ]
        )
        src_p = np.stack(
            [
                lab.prog[:n_opt],
                ent_p[dest_of],
                *(lab.prog[n_opt * (1 + c) : n_opt * (2 + c)] for c in range(len(carry))),
            ]
        )
        src_cell = np.stack([opt_ids[:, None] * k_grid + np.arange(k_grid)[None, :], ent_cell[dest_of], *own])
        terms = [tick_terms(tl, sim, events, t, jobs, eo, np.full(n_opt, r)) for r in restarts]
        cap = np.stack([x.capacity for x in terms])[:, :, None]
        rate = np.stack([x.rate for x in terms])[:, :, None]
        restart_k = np.stack([x.restart_h for x in terms])[:, :, None]
        price = np.stack([x.price for x in terms])[:, :, None]
        saved = np.stack([x.saved for x in terms])[:, :, None]
        run_cost = np.stack([x.price * x.run_h for x in terms])[:, :, None]
        usable = np.isfinite(src_c) & avail[None, :, None]
        rest = work - src_p
        fin = usable & (rest <= cap + 1e-9 * max(work, 1.0)) & (rate > 0)
        if fin.any():
            with np.errstate(divide="ignore", invalid="ignore"):
                used = restart_k + rest / rate
            val = np.where(fin, src_c + price * used, np.inf)
            if math.isfinite(deadline):
                val = np.where(elapsed + used <= deadline + 1e-9, val, np.inf)
            flat = int(np.argmin(val))
            if val.flat[flat] < best:
                kind, e, k = np.unravel_index(flat, val.shape)
                best, best_cell, best_tick, best_opt = (
                    float(val.flat[flat]),
                    int(src_cell[kind, e, k]),
                    t,
                    int(e),
                )
        go = usable & ~fin
        pre = terms[0].preempted
        dest_state = np.stack([np.where(pre, n_run + loc_e, a) for a in after])[:, :, None]
        new_p = src_p + saved
        bucket = np.minimum((np.where(go, new_p, 0.0) / q).astype(np.int64), k_grid - 1)
        act = np.broadcast_to(np.arange(n_opt)[None, :, None], go.shape)
        parts = [
            [
                (np.broadcast_to(dest_state, go.shape) * k_grid + bucket)[go],
                (src_c + run_cost)[go],
                new_p[go],
                *(() if bound else (src_cell[go], act[go])),  # back-pointers: the path only
            ]
        ]
        if math.isfinite(deadline) or not avail.any():
            # Idling leaves a job without instance in its checkpoint's region. The bound merges
            # per (region, bucket) anyway, so it idles the regions' merged labels (the same
            # covers, far fewer candidates); the path idles every label.
            idle_cost, idle_prog = (sources[0], sources[1]) if bound else (lab.cost, lab.prog)
            live = np.flatnonzero(np.isfinite(idle_cost.ravel()))
            to = n_run + (live // k_grid if bound else state_loc[live // k_grid])
            idle = [to * k_grid + live % k_grid, idle_cost.ravel()[live], idle_prog.ravel()[live]]
            parts.append(idle if bound else [*idle, live, np.full(len(live), -1)])
        lab, prev, chosen = _reduce(parts, n_states, k_grid, bound, later)
        left_h = min((end - t - 1) * tl.tick_h, deadline - elapsed - tl.tick_h)
        _prune(lab, work, floor[t + 1 - start_tick], best, fastest * max(left_h, 0.0))
        if not bound:
            prev_cells.append(prev)
            actions.append(chosen)
    if not math.isfinite(best):
        if math.isfinite(deadline):
            path = solve_job(tl, sim, events, transfer, j, start_tick, grid, False, bound)
            return OraclePath(path.cost_usd, path.plan, False, path.grid)
        return OraclePath(math.inf, np.full(n_ticks, -1, dtype=np.int64), False, k_grid)
    plan = np.full(n_ticks, -2, dtype=np.int64)
    if not bound:
        plan[best_tick - start_tick] = eo[best_opt]
        cell = best_cell
        for back in range(best_tick - start_tick - 1, -1, -1):
            step = int(actions[back][cell])
            plan[back] = eo[step] if step >= 0 else -1
            cell = int(prev_cells[back][cell])
    return OraclePath(best, plan, True, k_grid)


def _prune(lab: _Labels, work: float, floor: float, best: float, reach: float) -> None:
    """Drop labels that cannot finish below ``best`` (at ``floor`` $/step) or at all (``reach`` steps)."""
    rest = work - lab.prog
    with np.errstate(invalid="ignore"):
        least = lab.cost + np.where(rest > 0, rest * floor, 0.0)
    hopeless = (least >= best) | (rest > reach + 1e-9 * max(work, 1.0))
    lab.cost[hopeless] = np.inf


def _sources(
    lab: _Labels, by_loc: list[Array], k_grid: int, bound: bool, lam: Array
) -> tuple[Array, Array, Array]:
    """Per (checkpoint region, bucket): the label a job leaves from (states grouped by region).

    ``bound`` keeps the cover of the region's labels, else the real label of least ``c − λ·p``
    (ties: the first state); the third array is that label's cell.
    """
    n_src = len(by_loc)
    src_c = np.full((n_src, k_grid), np.inf)
    src_p = np.zeros((n_src, k_grid))
    src_cell = np.full((n_src, k_grid), -1, dtype=np.int64)
    cols = np.arange(k_grid)
    for loc, states in enumerate(by_loc):
        cost = lab.cost[states]
        finite = np.isfinite(cost)
        if not finite.any():
            continue
        prog = np.where(finite, lab.prog[states], 0.0)
        if bound:
            src_p[loc] = prog.max(axis=0)
            src_c[loc] = (cost + (src_p[loc][None, :] - prog) * lam).min(axis=0)
            continue
        pick = (cost - lam * prog).argmin(axis=0)
        src_c[loc] = cost[pick, cols]
        reached = np.isfinite(src_c[loc])
        src_p[loc] = np.where(reached, prog[pick, cols], 0.0)
        src_cell[loc] = np.where(reached, states[pick] * k_grid + cols, -1)
    return src_c, src_p, src_cell


def _entries(
    sources: tuple[Array, Array, Array], egress: Array, bound: bool, lam: Array
) -> tuple[Array, Array, Array]:
    """Per (destination region, bucket): the label to enter from, through egress.

    ``bound`` keeps the cover of the sources' labels, else the real label of least
    ``c + egress − λ·p``; the third array is that source's cell (for the path's back-pointers).
    """
    src_c, src_p, src_cell = sources
    through = src_c[:, None, :] + egress[:, :, None]  # (L+1, Ld, K)
    prog = np.broadcast_to(src_p[:, None, :], through.shape)
    if bound:
        ent_p = np.where(np.isfinite(through), prog, 0.0).max(axis=0)
        ent_c = (through + (ent_p[None] - prog) * lam).min(axis=0)
        return ent_c, np.where(np.isfinite(ent_c), ent_p, 0.0), np.full(ent_c.shape, -1, dtype=np.int64)
    pick = (through - lam * prog).argmin(axis=0)[None]
    ent_c = np.take_along_axis(through, pick, axis=0)[0]
    ent_p = np.take_along_axis(prog, pick, axis=0)[0]
    cells = np.broadcast_to(src_cell[:, None, :], through.shape)
    return ent_c, ent_p, np.take_along_axis(cells, pick, axis=0)[0]


def _reduce(
    parts: list[list[Array]], n_states: int, k_grid: int, bound: bool, lam: Array
) -> tuple[_Labels, Array, Array]:
    """One label per destination cell from all candidate transitions (see the module docstring).

    Each part holds (destination cell, cost, progress) and, for the path, (source cell, action).
    The bound reduces part by part (its cover needs the cell's most progress first, then the
    least cost at λ; no joint sort, nor one large copy).
    """
    out = _Labels(np.full(n_states * k_grid, np.inf), np.zeros(n_states * k_grid))
    prev_cell = np.full(n_states * k_grid, -1, dtype=np.int32)
    action = np.full(n_states * k_grid, -1, dtype=np.int32)
    if bound:
        live = [(d[keep], c[keep], p[keep]) for d, c, p in parts if (keep := np.isfinite(c)).any()]
        for d, _, p in live:
            np.maximum.at(out.prog, d, p)
        for d, c, p in live:
            np.minimum.at(out.cost, d, c + (out.prog[d] - p) * lam[d % k_grid])
    else:
        d, c, p, pv, ac = (np.concatenate(column) for column in zip(*parts, strict=True))
        keep = np.isfinite(c)
        d, c, p, pv, ac = d[keep], c[keep], p[keep], pv[keep], ac[keep]
        pick = _least_per_cell(d, c - lam[d % k_grid] * p, p, n_states * k_grid)
        out.cost[d[pick]] = c[pick]
        out.prog[d[pick]] = p[pick]
        prev_cell[d[pick]] = pv[pick]
        action[d[pick]] = ac[pick]
    shape = (n_states, k_grid)
    return _Labels(out.cost.reshape(shape), out.prog.reshape(shape)), prev_cell, action


def _least_per_cell(cell: Array, key: Array, prog: Array, n_cells: int) -> Array:
    """Per cell that has candidates, the index of its candidate of least ``key``, ties broken by
    most ``prog`` and then by the lowest index: the first per cell of a stable sort by (cell,
    key, −prog). In linear time: a sort of every candidate transition took most of the path
    pass (``whatif --example``'s oracle spent 2.5 of its 6.5 s in it)."""
    least = np.full(n_cells, np.inf)
    np.minimum.at(least, cell, key)
    tied = key == least[cell]  # exact: ``least`` holds one of these very values
    most = np.full(n_cells, -np.inf)
    np.maximum.at(most, cell[tied], prog[tied])
    tied &= prog == most[cell]
    first = np.full(n_cells, len(cell), dtype=np.int64)
    np.minimum.at(first, cell[tied], np.flatnonzero(tied))
    return first[first < len(cell)]
