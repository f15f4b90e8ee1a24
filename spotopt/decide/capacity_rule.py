"""The capacity rule: when a job with a deadline waits for spot, takes it, or pays for on-demand.

It decides the jobs whose spot options include a market with learnt capacity
(``Options.availability``), first of the decision core's rules (``spotopt.decide.rules``):
capacity, not price, is what such a market's decisions turn on. Per job:

- the *pool*: its fastest spot options (``POOL_SPREAD``; Uniform Progress's spot is as fast as
  its on-demand); the pool is available when one of its markets is, as far as the job knows (a
  market it was refused on just now is out; one without observations is taken as available);
- the chain of the pool's capacity and of the market a spot instance would run on, learnt from
  what was seen (``spotopt.decide.waiting.chain_from_history``);
- ``spotopt.decide.waiting.decide`` on its ticks and slack left (the planning period is the
  tick), what it runs on and the restart it still pays: spot (stay, or the pool's option
  cheapest per step now), on-demand (stay, or the fastest on-demand option, cheapest of those),
  or wait (a job on a slower on-demand instance than that is as one without an instance: it
  restarts to run on either leg). No fallback is permanent: a job on on-demand goes back to
  spot when its slack is worth more than the restart, which the tables weigh. A job the
  tables keep on spot is left to the price rules with its options narrowed to its pool: which
  spot market of the pool it runs on is a question of price (a job with a deadline still moves
  to a cheaper zone).

A job is placed only within the spend-rate cap and the round's budget (``Round.fits``); a job
that cannot be placed waits, as with the price rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spotopt.decide import waiting
from spotopt.decide.fleet import Availability
from spotopt.decide.rules import Round, Rule

Array = np.ndarray[Any, Any]

POOL_SPREAD = 0.05
"""Spot options within this fraction of the job's fastest spot option form its pool (their
expected speeds differ by their markets' preemption discounts, not by their GPUs)."""


def _capacity(rnd: Round) -> None:
    """Decide the undecided jobs with a deadline whose pool has learnt capacity (docstring)."""
    state, opts, guard = rnd.state, rnd.opts, rnd.guard
    av = opts.availability
    if av is None or not av.observed.any():
        return
    keep = np.ones(opts.n_options, dtype=bool)
    on_demand = opts.on_demand.astype(bool)
    for j in rnd.undecided():
        if not np.isfinite(state.deadline_h[j]):
            continue
        mine = rnd.options_of(j)
        od = mine[rnd.eligible[mine] & on_demand[mine]]
        if not len(od):
            continue
        speed = opts.steps_per_hour[od]
        od = od[speed >= speed.max()]
        od_pick = int(od[np.argmin(opts.usd_per_hour[od])])
        od_speed = float(opts.steps_per_hour[od_pick])
        spot = mine[rnd.eligible[mine] & ~on_demand[mine]]
        if not len(spot):
            continue
        # Expected speeds carry each market's preemption discount: the pool is the fast leg.
        pool = spot[opts.steps_per_hour[spot] >= opts.steps_per_hour[spot].max() * (1 - POOL_SPREAD)]
        if not len(pool) or not av.observed[opts.market[pool]].any():
            continue
        c = int(rnd.cur[j])
        live = c >= 0 and not state.notice[j] and not state.lost[j]
        # The tables' on-demand is the fastest: a job on a slower on-demand instance restarts
        # to run on either of their legs, as one without an instance does (left on it, it missed
        # deadlines the fastest on-demand made).
        mode = waiting.IDLE if not live else (waiting.ON_DEMAND if on_demand[c] else waiting.SPOT)
        if mode == waiting.ON_DEMAND and c not in set(od.tolist()):
            mode = waiting.IDLE
        open_pool = pool[~av.refused[opts.market[pool]]]
        tick_h = waiting.table_tick_h(guard.period_h, float(state.deadline_h[j]), float(state.restart_h[j]))
        history = _pool_history(av, opts.market[pool])
        learnt = _learnt_steps(history.shape[0], state.clock_h, av.step_h)
        spot_pick = _spot_pick(open_pool, opts.usd_per_hour, opts.market, av, learnt, tick_h)
        market = int(opts.market[c]) if mode == waiting.SPOT else int(opts.market[max(spot_pick, pool[0])])
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
            keep[mine] = False
            keep[pool[_move_targets(pool, c, opts.usd_per_hour, opts.market, av)]] = True
            keep[c] = True
            continue
        to = {waiting.SPOT: spot_pick, waiting.ON_DEMAND: od_pick, waiting.IDLE: -1}[action]
        if to < 0 or (live and action == mode) or not rnd.fits(j, to):
            rnd.settle(j)
            continue
        reason = (
            "start"
            if state.option[j] < 0
            else ("preempted" if not live else ("price" if action == waiting.SPOT else "deadline"))
        )
        rnd.take(j, to, reason)
    if not keep.all():
        rnd.narrow(keep)


CAPACITY = Rule("capacity", _capacity)
"""Wait for spot, take it, or pay for on-demand, as the capacity tables say (module docstring)."""


LEARN_EVERY_H = 24.0
"""The chains are learnt from the capacity seen up to the last whole day on the decider's clock:
capacity statistics move over days, and a chain that holds for a day keeps its tables cached
(a what-if solves a few dozen per trace, not one per observation). The pool's state now and
its age are always read from everything seen."""


def _learnt_steps(n_steps: int, clock_h: float, step_h: float) -> int:
    """How many of a history's ``n_steps`` (the last one now, at ``clock_h``) the chains learn
    from: those before the last multiple of ``LEARN_EVERY_H`` on the clock."""
    return max(n_steps - int(np.floor((clock_h % LEARN_EVERY_H) / step_h + 1e-9)), 0)


PRICE_TIE = 0.01
"""Open spot options of a pool priced within this fraction per hour of the cheapest are equals
on price: the one whose capacity is likeliest to hold for the next tick is taken."""


def _spot_pick(
    open_pool: Array, usd_per_hour: Array, market: Array, av: Availability, learnt: int, tick_h: float
) -> int:
    """The pool's spot option to launch on (-1: none open): the cheapest per hour, and among
    options equal on price (``PRICE_TIE``) the one whose market is least likely to lose its
    capacity in the next tick, at the age of its current run of capacity (a market seen out
    last is last). Zones of one GPU are often priced alike; their capacity runs are
    heavy-tailed, so one that has held for long is likelier to hold on than one just back.

    Per hour, not per expected step: the pool's options are one leg (``POOL_SPREAD``), and the
    expected speeds carry each market's learnt preemption rate, which grows only where the job
    has run. Compared per step, a zone the job never ran on (one seen out nearly always) looked
    cheaper than the zone it had been preempted on, drew every launch and lent its short runs
    to the chain's instance loss; the tables price capacity losses themselves."""
    if not len(open_pool):
        return -1
    cost = usd_per_hour[open_pool]
    equal = open_pool[cost <= cost.min() * (1 + PRICE_TIE)]
    if len(equal) == 1:
        return int(equal[0])
    risk = [_loss_hazard(av, int(market[e]), learnt, tick_h) for e in equal.tolist()]
    return int(equal[int(np.argmin(risk))])


def _loss_hazard(av: Availability, market: int, learnt: int, tick_h: float) -> float:
    """The chance that ``market``'s capacity goes within a tick, from its own chain at the age
    of its current run (1 when it was seen out last; the prior's for a market never seen)."""
    series = av.history[market] if av.observed[market] else np.zeros(0)
    if _last_known(series) < 0.5:
        return 1.0
    chain = waiting.chain_from_history(series[:learnt], np.zeros(0), av.step_h, tick_h)
    return float(chain.lose[waiting.age_bucket(series, True, av.step_h, tick_h)])


def _move_targets(pool: Array, c: int, usd_per_hour: Array, market: Array, av: Availability) -> Array:
    """Per option of ``pool``: one the price rules may move a running spot job to from ``c``.

    Only to a market with capacity as far as the job knows (the price rules see prices, not a
    zone that has been out since it was last seen), and only for a lower price per hour, by
    more than ``PRICE_TIE``. Zones equal on price differ in their capacity, which is the
    tables' question, not a price: the price rules compare expected speeds, which carry each
    market's learnt preemption rate, and that rate grows only where the job has run. A job
    preempted a few times on its zone read a twin zone as cheaper per step and moved there, a
    restart paid for nothing, then back when the twin preempted it in turn (the us-west-2 V100
    pair: twice within one 13-hour run of the first zone's capacity)."""
    cheaper = usd_per_hour[pool] < usd_per_hour[c] * (1 - PRICE_TIE)
    return np.asarray(_seen_up(av, market[pool]) & cheaper)


def _seen_up(av: Availability, markets: Array) -> Array:
    """Per market: not refused just now, and available when last seen (or never observed)."""
    last = np.array([_last_known(row) for row in av.history[markets]])
    return np.asarray(~av.refused[markets] & (~av.observed[markets] | (last > 0.5)))


def _last_known(series: Array) -> float:
    """The state a market was last seen in (1 available, 0 out; 1 when never seen)."""
    known = series[np.isfinite(series)]
    return float(known[-1]) if len(known) else 1.0


def _pool_history(av: Availability, markets: Array) -> Array:
    """The pool's state per step: available if a market was seen available, out if every
    market seen was out, unknown otherwise; markets without observations count as available."""
    rows = av.history[markets]
    rows = np.where(av.observed[markets][:, None], rows, 1.0)
    up = np.any(rows > 0.5, axis=0)
    down = np.all(rows < 0.5, axis=0)
    return np.where(up, 1.0, np.where(down, 0.0, np.nan))
