"""The oracle against every schedule: exhaustive enumeration on tiny histories, and its exchange rate."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotopt.decide.egress import entry_usd, transfer_matrix
from spotopt.history.capacity import Capacity
from spotopt.jobspec import parse_jobs
from spotopt.whatif.engine import simulate, tick_outcome, tick_terms
from spotopt.whatif.jobs import SimJobs, build_jobs
from spotopt.whatif.oracle import _least_per_cell, solve_job, step_price_floor
from spotopt.whatif.preemptions import model_preemptions, with_capacity
from spotopt.whatif.strategies import ScheduleDecider
from spotopt.whatif.timeline import Timeline, build_timeline
from tests.test_whatif_engine import T0, job, quotes

Array = np.ndarray[Any, Any]
HOURS = 7


def exhaustive(tl: Timeline, sim: SimJobs, events: Array, transfer: Array, j: int) -> tuple[float, Array]:
    """The cheapest of all schedules of job ``j`` from tick 0 (an option or idle per tick) and its plan.

    Every prefix is one row, advanced a tick at a time by the engine's own rule exactly as
    ``simulate`` applies it (``tick_terms``, ``tick_outcome``, ``entry_usd``). A job without a
    deadline may idle only while none of its options can launch; one with a deadline may idle
    and must finish by it. Only finished schedules count. A restart longer than a tick carries
    over while the job stays on its option.
    """
    lo, hi = sim.bounds()[j : j + 2]
    work, deadline = float(sim.work[j]), float(sim.deadline_h[j])
    cost, prog = np.zeros(1), np.zeros(1)
    option, location = np.full(1, -1), np.full(1, -1)
    alive, started = np.zeros(1, dtype=bool), np.zeros(1, dtype=bool)
    restart_left = np.zeros(1)
    plans = np.zeros((1, 0), dtype=np.int64)
    best, best_plan = math.inf, np.zeros(0, dtype=np.int64)
    for t in range(tl.n_ticks):
        priced = np.flatnonzero(tl.launchable(t)[sim.market[lo:hi]]) + lo
        choices = np.concatenate([priced, [-1] if math.isfinite(deadline) or len(priced) == 0 else []])
        row = np.repeat(np.arange(len(cost)), len(choices))
        opt = np.tile(choices.astype(np.int64), len(cost))
        run = opt >= 0
        safe = np.where(run, opt, lo)
        entering = ~alive[row] | (started[row] & (safe != option[row]))
        jobs = np.full(len(row), j)
        out = tick_outcome(
            terms := tick_terms(
                tl, sim, events, t, jobs, safe, np.where(entering, sim.restart_h[jobs], restart_left[row])
            ),
            work - prog[row],
        )
        egress = entry_usd(
            transfer,
            location[row],
            sim.location[safe],
            sim.checkpoint_gb[jobs],
            sim.dataset_gb[jobs],
            sim.dataset_location[jobs],
        )
        paid = out.cost_usd + np.where(entering, egress, 0.0)
        cost = cost[row] + np.where(run, paid, 0.0)
        prog = prog[row] + np.where(run, out.gained, 0.0)
        plans = np.column_stack([plans[row], opt])
        done = run & out.finished & (t * tl.tick_h + out.used_h <= deadline + 1e-9)
        if done.any() and cost[done].min() < best:
            k = np.flatnonzero(done)[int(np.argmin(cost[done]))]
            best, best_plan = float(cost[k]), plans[k]
        on = run & ~out.finished
        option = np.where(run, safe, option[row])
        location = np.where(run, sim.location[safe], location[row])
        started = started[row] | run
        alive = on & ~out.preempted
        restart_left = np.where(alive, terms.carry_h, 0.0)
        keep = on | ~run
        cost, prog, option, location = cost[keep], prog[keep], option[keep], location[keep]
        alive, started, plans, restart_left = alive[keep], started[keep], plans[keep], restart_left[keep]
    return best, best_plan


def tiny(
    seed: int, deadline: str | None, capacity: bool = False, tick_h: float = 1.0
) -> tuple[Timeline, SimJobs, Array, Array]:
    """Seven hours of random prices on five markets in two clouds, preempted often; with
    ``capacity`` the spot markets' capacity comes and goes (random observations) and restarts
    run up to two and a half ticks."""
    rng = np.random.default_rng(seed)
    prices = {
        mid: [(h, float(base * rng.uniform(0.3, 1.0))) for h in range(int(rng.integers(0, 3)), HOURS)]
        for mid, base in ((1, 2.0), (3, 0.6), (4, 7.0), (5, 0.5))
    }
    prices[2] = [(0, float(rng.uniform(1.5, 3.06)))]
    spec = job(
        "j",
        throughput={"K80": 1.0, "V100": float(rng.uniform(1.5, 4.0))},
        work={"steps": int(rng.integers(9_000, 16_000))},
        restart_s=int(rng.integers(0, 9000 * tick_h)) if capacity else int(rng.integers(0, 900)),
        checkpoint_s=int(rng.integers(10, 200)),
        checkpoint_gb=float(rng.uniform(0.5, 20.0)),
        deadline=deadline,
    )
    tl = build_timeline(quotes(prices), T0, HOURS, tick_h)
    tl.rate[~tl.on_demand] = rng.uniform(0.1, 0.5, int((~tl.on_demand).sum()))
    events = model_preemptions(tl, seed)
    if capacity:
        spot = np.flatnonzero(~tl.on_demand)
        market = np.repeat(spot, 6)
        at_h = rng.uniform(-1.0, HOURS, len(market))
        tl.capacity = Capacity.from_observations(
            tl.n_markets, tl.n_ticks, tick_h, market, at_h, rng.random(len(market)) < 0.6
        )
        events = with_capacity(tl, events)
    sim = build_jobs(parse_jobs({"jobs": [spec]}), tl)
    return tl, sim, events, transfer_matrix(tl.locations, T0)


@pytest.mark.parametrize("capacity", [False, True])
@pytest.mark.parametrize("deadline", [None, "6h"])
@pytest.mark.parametrize("seed", range(6))
def test_the_bound_is_below_every_schedule_and_the_path_is_one(
    seed: int, deadline: str | None, capacity: bool
) -> None:
    """With capacity replayed too: launches only where available, preemptions when a market
    turns unavailable, restarts carried over several ticks."""
    tl, sim, events, transfer = tiny(seed, deadline, capacity)
    best, plan = exhaustive(tl, sim, events, transfer, 0)
    assert math.isfinite(best)
    replayed = simulate(tl, sim, events, transfer, ScheduleDecider(plan[None, :], 0))
    assert replayed.cost_usd[0] == pytest.approx(best, rel=1e-12)  # the enumeration is the engine's rule
    for grid in (2, 3, 10, 1000):  # coarse grids merge labels far apart: λ must hold there too
        bound = solve_job(tl, sim, events, transfer, 0, 0, grid=grid)
        path = solve_job(tl, sim, events, transfer, 0, 0, grid=grid, bound=False)
        assert bound.feasible and path.feasible
        assert bound.cost_usd <= best + 1e-9, grid
        assert path.cost_usd >= best - 1e-9, grid
        run = simulate(tl, sim, events, transfer, ScheduleDecider(path.plan[None, :], 0))
        assert run.cost_usd[0] == pytest.approx(path.cost_usd, rel=1e-9)
        assert run.finish_h[0] <= sim.deadline_h[0] + 1e-9
    # A fine grid makes both exact here: few labels differ by less than a bucket.
    assert bound.cost_usd == pytest.approx(best, rel=1e-3)
    assert path.cost_usd == pytest.approx(best, rel=1e-9)


def test_the_exchange_rate_is_the_least_price_per_step_from_each_tick_on() -> None:
    tl, sim, _, _ = tiny(0, None)
    eo = np.arange(*sim.bounds()[:2])
    floor = step_price_floor(tl, sim, eo, 2, tl.n_ticks)
    per_step = tl.price[sim.market[eo]] / sim.slots[eo][:, None]
    per_step /= (sim.steps_per_hour[eo] * sim.checkpoint_eff[eo])[:, None]
    naive = [np.nanmin(np.where(np.isfinite(per_step[:, t:]), per_step[:, t:], np.nan)) for t in range(2, 7)]
    assert floor.tolist() == pytest.approx([*naive, math.inf])
    assert np.all(np.diff(floor) >= 0)


@given(
    st.lists(
        st.tuples(
            st.integers(0, 5), st.sampled_from([0.0, 1.0, 2.5, -1.0]), st.sampled_from([0.0, 1.0, 3.0])
        ),
        max_size=40,
    )
)
def test_the_path_pass_keeps_the_first_label_of_a_stable_sort(rows: list[tuple[int, float, float]]) -> None:
    """Per cell, the candidate of least key, then most progress, then first given: the label the
    path pass keeps is the one a stable sort by (cell, key, −progress) puts first (ties are the
    rule here: few distinct values)."""
    cell = np.array([r[0] for r in rows], dtype=np.int64)
    key = np.array([r[1] for r in rows])
    prog = np.array([r[2] for r in rows])
    order = np.lexsort((-prog, key, cell))
    first = np.ones(len(order), dtype=bool)
    first[1:] = cell[order][1:] != cell[order][:-1]
    assert _least_per_cell(cell, key, prog, 6).tolist() == order[first].tolist()
