"""Wait for spot or pay for on-demand: the value of a job's slack when capacity comes and goes.

A job with a deadline and ``s`` hours of slack (time left less the work left) can run on spot
when spot capacity is there, on on-demand at any time, or wait. Waiting costs nothing but
slack; every (re)start costs its restart, in slack and in money; on-demand keeps the slack and
costs the price difference. Uniform Progress answers with a fixed line; here the answer is the
policy of least expected cost for the capacity the job has seen, by backward induction over
(ticks left, slack, what runs and how much of its restart is left, whether spot is there):

- spot capacity of the job's *pool* (its spot markets: one is enough) is a two-state Markov
  chain per tick, with ``p_lose`` (up → down) and ``p_back`` (down → up) learnt from the
  capacity seen so far (``chain_from_history``); a spot instance whose pool stays up can
  still be lost (``p_switch``: its own market went while another stayed; the job restarts);
- a spot instance ends only at a tick boundary, keeping its work (the emergency checkpoint of
  the engine's notice rule), and on-demand never ends;
- a job may not stop a running instance to wait (the daemon has no such move), and a job
  whose slack cannot absorb its restarts any more finishes on on-demand.

Work and slack are counted in hours on the job's on-demand option (its spot pool is as fast,
as in Uniform Progress). The tables are cached per rounded chain and prices, so a what-if
replay solves each a handful of times; a decision is a table lookup. Pure: no clock, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]

UNITS_PER_TICK = 6
"""Slack and restarts are counted in sixths of a tick (100 s for CBL's 10-minute tick)."""
PRIOR_UP_H = 24.0
PRIOR_DOWN_H = 1.0
PRIOR_WEIGHT = 1.0
"""A market that has shown nothing yet is taken as available for a day at a time and out for
an hour, with the weight of one observed run of each (the observations soon dominate)."""

GRID_PER_DECADE = 10

IDLE, SPOT, ON_DEMAND = 0, 1, 2


@dataclass(frozen=True)
class Chain:
    """Per-tick probabilities of the job's spot pool (see the module docstring)."""

    p_lose: float
    p_back: float
    p_switch: float

    def rounded(self) -> Chain:
        """On a grid of ``GRID_PER_DECADE`` steps per decade: a cache key that changes only when
        the estimate moves by more than its own noise (a tenth of a decade is 26 %)."""

        def snap(p: float) -> float:
            if p <= 1e-6:
                return 0.0
            return float(min(10 ** (round(math.log10(p) * GRID_PER_DECADE) / GRID_PER_DECADE), 1.0))

        return Chain(snap(self.p_lose), snap(self.p_back), snap(self.p_switch))


def chain_from_history(pool: Array, market: Array, step_h: float, tick_h: float) -> Chain:
    """The chain from the capacity seen so far: ``pool[k]`` is 1 when some market of the pool
    was seen available at step ``k`` (0 none, NaN unknown), ``market`` the same for the market
    a spot instance would run on; steps ``step_h`` apart. Mean run lengths with a prior
    (``PRIOR_*``), turned into probabilities per tick of ``tick_h``."""
    lose = _rate(pool, step_h)
    own = _rate(market, step_h) if len(market) else lose
    p_lose = 1.0 - math.exp(-tick_h / lose[0])
    p_back = 1.0 - math.exp(-tick_h / lose[1])
    p_own = 1.0 - math.exp(-tick_h / own[0])
    return Chain(p_lose, p_back, max(p_own - p_lose, 0.0))


def _rate(series: Array, step_h: float) -> tuple[float, float]:
    """Mean up-run and down-run lengths (hours) of a 0/1/NaN series, with the prior."""
    known = series[np.isfinite(series)] > 0.5
    up_h = float(known.sum()) * step_h
    down_h = float((~known).sum()) * step_h
    flips = np.diff(known.astype(np.int8))
    ups, downs = int((flips == 1).sum()), int((flips == -1).sum())
    mean_up = (up_h + PRIOR_UP_H * PRIOR_WEIGHT) / (downs + PRIOR_WEIGHT)
    mean_down = (down_h + PRIOR_DOWN_H * PRIOR_WEIGHT) / (ups + PRIOR_WEIGHT)
    return mean_up, mean_down


MAX_TICKS = 512
MAX_RESTART_UNITS = 16
MAX_SLACK_UNITS = 1024
"""A table covers at most this many ticks, units of restart and units of slack (about 37 MB at
most, a few MB for Can't Be Late's setting); a job with more slack than a table holds decides
as one with that much (more slack only ever favours waiting for spot)."""


def table_tick_h(period_h: float, deadline_h: float, restart_h: float) -> float:
    """The tables' tick: the planning period, coarser where the deadline is more than
    ``MAX_TICKS`` periods away or the restart more than ``MAX_RESTART_UNITS`` units long (a
    daemon polling every few seconds decides on a 30-day job with a tick of hours)."""
    return max(period_h, deadline_h / MAX_TICKS, restart_h * UNITS_PER_TICK / MAX_RESTART_UNITS)


@dataclass(frozen=True)
class Job:
    """One job's terms for the tables: its tick, restart and the two prices per tick of work."""

    tick_h: float
    restart_h: float
    spot_usd_per_h: float
    od_usd_per_h: float


def decide(
    job: Job, chain: Chain, ticks_left: int, slack_h: float, mode: int, restart_left_h: float, spot_up: bool
) -> int:
    """``IDLE``, ``SPOT`` or ``ON_DEMAND`` for a job now (``mode`` what it runs on)."""
    unit = job.tick_h / UNITS_PER_TICK
    slack = math.floor(slack_h / unit + 1e-9)
    r = max(math.ceil(job.restart_h / unit - 1e-9), 0)
    if ticks_left <= 0 or (slack < r and mode == IDLE) or slack < 0:
        return ON_DEMAND  # no slack left for waiting or a spot restart: finish as soon as it can
    slack = min(slack, MAX_SLACK_UNITS - 1)
    ticks_left = min(ticks_left, MAX_TICKS)
    table = _tables(job, chain.rounded(), ticks_left, slack)
    rho = min(math.ceil(restart_left_h / unit - 1e-9), r)
    state = 0 if mode == IDLE else (1 + rho if mode == SPOT else r + 2 + rho)
    return int(table[ticks_left - 1, slack, state, int(spot_up)])


def _tables(job: Job, chain: Chain, ticks: int, slack: int) -> Array:
    """The action table for up to ``ticks`` ticks left and ``slack`` units (cached in blocks)."""
    t_cap = 1 << max(math.ceil(math.log2(max(ticks, 1))), 4)
    s_cap = 1 << max(math.ceil(math.log2(max(slack + 1, 1))), 4)
    return _solve(job, chain, t_cap, s_cap)


LATE_FACTOR = 1e4
"""A unit of work past the deadline weighs this many units of on-demand: the tables meet every
deadline they can, and finish as soon as they can where none can be met."""


@lru_cache(maxsize=8)
def _solve(job: Job, chain: Chain, n_ticks: int, n_slack: int) -> Array:
    """Backward induction: ``action[τ - 1, S, state, up]`` for τ ticks left and ``S`` units of slack.

    States: 0 idle; ``1 + ρ`` on spot with ``ρ`` restart units left; ``r + 2 + ρ`` on
    on-demand. With τ ticks left and ``S`` units of slack, ``τ·k − S`` units of work are left;
    running a tick spends ``min(ρ, k)`` units of slack on the restart, waiting spends ``k``.
    """
    k = UNITS_PER_TICK
    unit = job.tick_h / k
    r = max(math.ceil(job.restart_h / unit - 1e-9), 0)
    n_states = 2 * r + 3
    slack = np.arange(n_slack)
    rho = np.arange(r + 1)[:, None]
    spent = np.minimum(rho, k)
    rho_after = np.maximum(rho - k, 0)
    on_spot, on_od = 1 + rho_after, r + 2 + rho_after
    p_lose, p_back, p_switch = chain.p_lose, chain.p_back, chain.p_switch
    late = LATE_FACTOR * job.od_usd_per_h * unit
    # What each state's choices are, in the order ``costs`` holds them below.
    labels = np.full((n_states, 3), IDLE, dtype=np.int8)
    labels[IDLE] = [IDLE, SPOT, ON_DEMAND]
    labels[1 : r + 2, :2] = [SPOT, ON_DEMAND]
    labels[r + 2 :, :2] = [ON_DEMAND, SPOT]
    labels = np.broadcast_to(labels[:, :, None], (n_states, 3, n_slack))
    value = np.zeros((n_slack, n_states, 2))  # no tick left and no slack missing: done
    actions = np.zeros((n_ticks, n_slack, n_states, 2), dtype=np.int8)
    for tau in range(1, n_ticks + 1):
        work = tau * k - slack

        def later(
            s_after: Array, state: Array | int, up: int, work: Array = work, value: Array = value
        ) -> Array:
            """Value one tick on at slack ``s_after``; below 0 the deadline is missed."""
            missed = np.maximum(-s_after, 0) * late + np.maximum(work - k, 0) * job.od_usd_per_h * unit
            return np.where(s_after >= 0, value[np.clip(s_after, 0, n_slack - 1), state, up], missed)

        def moved(up: int, state: Array | int, s_after: Array) -> Array:
            stay = 1.0 - p_lose if up else p_back
            return stay * later(s_after, state, 1) + (1.0 - stay) * later(s_after, state, 0)

        def run(usd_per_h: float, then: Array, work: Array = work) -> Array:
            """Cost of a tick on an instance (per ρ, slack) given the value after it."""
            price = usd_per_h * unit
            finish = rho + work[None, :] <= k
            return np.where(finish, price * (rho + np.maximum(work, 0)[None, :]), price * k + then)

        s_run = slack[None, :] - spent
        spot_then = (1.0 - p_lose - p_switch) * later(s_run, on_spot, 1)
        spot_then += p_lose * later(s_run, IDLE, 0) + p_switch * later(s_run, IDLE, 1)
        spot = run(job.spot_usd_per_h, spot_then)  # (ρ, S): spot is up while it runs
        new = np.empty((n_slack, n_states, 2))
        act = np.empty((n_slack, n_states, 2), dtype=np.int8)
        for up in (0, 1):
            od = run(job.od_usd_per_h, moved(up, on_od, s_run))
            enter_spot = spot[r] if up else np.full(n_slack, np.inf)
            costs = np.full((n_states, 3, n_slack), np.inf)
            costs[IDLE] = [moved(up, IDLE, slack - k), enter_spot, od[r]]
            costs[1 : r + 2, 0], costs[1 : r + 2, 1] = spot, od[r]
            costs[r + 2 :, 0], costs[r + 2 :, 1] = od, enter_spot
            pick = np.argmin(costs, axis=1)
            best = np.take_along_axis(costs, pick[:, None, :], axis=1)[:, 0, :]
            new[:, :, up] = np.where(work <= 0, 0.0, best).T
            act[:, :, up] = np.take_along_axis(labels, pick[:, None, :], axis=1)[:, 0, :].T
        value = new
        actions[tau - 1] = act
    return actions
