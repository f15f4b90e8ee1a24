"""The capacity rule: when a job with a deadline waits for spot, takes it, or pays for on-demand.

It decides the jobs whose spot options include a market with learnt capacity
(``Options.availability``), before the price rules of ``spotopt.mover.planner`` see the others:
capacity, not price, is what such a market's decisions turn on. Per job:

- the *pool*: its fastest spot options (``POOL_SPREAD``; Uniform Progress's spot is as fast as
  its on-demand); the pool is available when one of its markets is, as far as the job knows (a
  market it was refused on just now is out; one without observations is taken as available);
- the chain of the pool's capacity and of the market a spot instance would run on, learnt from
  what was seen (``spotopt.mover.waiting.chain_from_history``);
- ``spotopt.mover.waiting.decide`` on its ticks and slack left (the planning period is the
  tick), what it runs on and the restart it still pays: spot (stay, or the pool's option
  cheapest per step now), on-demand (stay, or the fastest on-demand option, cheapest of those),
  or wait. No fallback is permanent: a job on on-demand goes back to spot when its slack is
  worth more than the restart, which the tables weigh. A job the tables keep on spot may still
  move to a cheaper market of its pool: the price rules decide that, within the pool.

A job is placed only within the spend-rate cap and the budget (spent plus the expected cost to
finish on the option); a job that cannot be placed waits, as in the planner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from spotopt.mover import waiting
from spotopt.mover.fleet import Availability, FleetState, Move, Options
from spotopt.mover.guardrails import Guardrails

Array = np.ndarray[Any, Any]

POOL_SPREAD = 0.05
"""Spot options within this fraction of the job's fastest spot option form its pool (their
expected speeds differ by their markets' preemption discounts, not by their GPUs)."""


@dataclass(frozen=True)
class CapacityDecision:
    """What the rule decided: its ``moves``; ``decided``, the jobs it took (a mask over jobs);
    ``pools``, for each job it keeps on spot, its pool's options (a mask over options): which
    spot market of the pool the job runs on is a question of price, which the price rules
    answer within the pool (a job with a deadline still moves to a cheaper zone)."""

    moves: list[Move]
    decided: Array
    pools: Array


def capacity_moves(state: FleetState, opts: Options, guard: Guardrails) -> CapacityDecision:
    """The rule's decisions for the jobs it takes (see ``CapacityDecision``)."""
    decided = np.zeros(state.n_jobs, dtype=bool)
    pools = np.zeros(opts.n_options, dtype=bool)
    av = opts.availability
    if av is None or not av.observed.any():
        return CapacityDecision([], decided, pools)
    moves: list[Move] = []
    priced = np.isfinite(opts.usd_per_hour)
    if guard.max_usd_per_hour is not None:
        priced &= opts.usd_per_hour <= guard.max_usd_per_hour
    on_demand = opts.on_demand.astype(bool)
    cur = opts.position(state.option)
    spent = float(np.sum(state.spent_usd))
    for j in np.flatnonzero(state.active & np.isfinite(state.deadline_h)).tolist():
        mine = np.flatnonzero(opts.job == j)
        od = mine[priced[mine] & on_demand[mine]]
        if not len(od):
            continue
        speed = opts.steps_per_hour[od]
        od = od[speed >= speed.max()]
        od_pick = int(od[np.argmin(opts.usd_per_hour[od])])
        od_speed = float(opts.steps_per_hour[od_pick])
        spot = mine[priced[mine] & ~on_demand[mine]]
        if not len(spot):
            continue
        # Expected speeds carry each market's preemption discount: the pool is the fast leg.
        pool = spot[opts.steps_per_hour[spot] >= opts.steps_per_hour[spot].max() * (1 - POOL_SPREAD)]
        if not len(pool) or not av.observed[opts.market[pool]].any():
            continue
        decided[j] = True
        c = int(cur[j])
        live = c >= 0 and not state.notice[j] and not state.lost[j]
        mode = waiting.IDLE if not live else (waiting.ON_DEMAND if on_demand[c] else waiting.SPOT)
        open_pool = pool[~av.refused[opts.market[pool]]]
        per_step = opts.usd_per_hour / opts.steps_per_hour
        spot_pick = int(open_pool[np.argmin(per_step[open_pool])]) if len(open_pool) else -1
        market = int(opts.market[c]) if mode == waiting.SPOT else int(opts.market[max(spot_pick, pool[0])])
        tick_h = waiting.table_tick_h(guard.period_h, float(state.deadline_h[j]), float(state.restart_h[j]))
        history = _pool_history(av, opts.market[pool])
        learnt = _learnt_steps(history.shape[0], state.clock_h, av.step_h)
        chain = waiting.chain_from_history(
            history[:learnt],
            av.history[market, :learnt] if av.observed[market] else np.zeros(0),
            av.step_h,
            tick_h,
        )
        spot_up = mode == waiting.SPOT or spot_pick >= 0
        age = waiting.age_bucket(history, spot_up, av.step_h, tick_h)
        # Prices per instance-hour: the tables price the pool's preemptions themselves (the
        # options' expected speeds carry them too, and move with every learnt rate).
        job = waiting.Job(
            tick_h,
            float(state.restart_h[j]),
            float(f"{opts.usd_per_hour[pool].min():.3g}"),
            float(f"{opts.usd_per_hour[od_pick]:.3g}"),
        )
        ticks = int(np.floor(state.deadline_h[j] / tick_h + 1e-9))
        # The tables plan to the last unit of slack; what they do not model (a notice's lost
        # minutes, a decision a tick late, rounding to units) comes out of a reserve of one
        # tick and one restart, as Uniform Progress's safety net keeps one.
        reserve_h = tick_h + float(state.restart_h[j])
        slack_h = ticks * tick_h - float(state.remaining_steps[j]) / od_speed - reserve_h
        restart_left = max(float(state.restart_h[j] - state.dwell_h[j]), 0.0) if live else 0.0
        action = waiting.decide(job, chain, ticks, slack_h, mode, restart_left, spot_up, age)
        if live and mode == action == waiting.SPOT:
            pools[pool] = True
        to = {waiting.SPOT: spot_pick, waiting.ON_DEMAND: od_pick, waiting.IDLE: -1}[action]
        if to < 0 or (live and action == mode) or not _fits(state, opts, guard, spent, j, to):
            continue
        reason = (
            "start"
            if state.option[j] < 0
            else ("preempted" if not live else ("price" if action == waiting.SPOT else "deadline"))
        )
        moves.append(Move(j, int(state.option[j]), int(opts.key[to]), reason, 0.0, 0.0))
    return CapacityDecision(moves, decided, pools)


LEARN_EVERY_H = 24.0
"""The chains are learnt from the capacity seen up to the last whole day on the decider's clock:
capacity statistics move over days, and a chain that holds for a day keeps its tables cached
(a what-if solves a few dozen per trace, not one per observation). The pool's state now and
its age are always read from everything seen."""


def _learnt_steps(n_steps: int, clock_h: float, step_h: float) -> int:
    """How many of a history's ``n_steps`` (the last one now, at ``clock_h``) the chains learn
    from: those before the last multiple of ``LEARN_EVERY_H`` on the clock."""
    return max(n_steps - int(np.floor((clock_h % LEARN_EVERY_H) / step_h + 1e-9)), 0)


def _pool_history(av: Availability, markets: Array) -> Array:
    """The pool's state per step: available if a market was seen available, out if every
    market seen was out, unknown otherwise; markets without observations count as available."""
    rows = av.history[markets]
    rows = np.where(av.observed[markets][:, None], rows, 1.0)
    up = np.any(rows > 0.5, axis=0)
    down = np.all(rows < 0.5, axis=0)
    return np.where(up, 1.0, np.where(down, 0.0, np.nan))


def _fits(state: FleetState, opts: Options, guard: Guardrails, spent: float, j: int, e: int) -> bool:
    if guard.budget_usd is None:
        return True
    finish = opts.usd_per_hour[e] * state.remaining_steps[j] / opts.steps_per_hour[e]
    return bool(spent + finish <= guard.budget_usd + 1e-9)
