"""Wait for spot or pay for on-demand: the value of a job's slack when capacity comes and goes.

A job with a deadline and ``s`` hours of slack (time left less the work left) can run on spot
when spot capacity is there, on on-demand at any time, or wait. Waiting costs nothing but
slack; every (re)start costs its restart, in slack and in money; on-demand keeps the slack and
costs the price difference. Uniform Progress answers with a fixed line; here the answer is the
policy of least expected cost for the capacity the job has seen, by backward induction over
(ticks left, slack, what runs and how much of its restart is left, whether spot is there, and
for how long it has been so):

- spot capacity of the job's *pool* (its spot markets: one is enough) is a semi-Markov chain:
  the chance that it turns within a tick depends on how long it has been up or out (its *age*,
  in ``AGE_EDGES`` buckets). Real outages and runs are heavy-tailed (most outages last minutes,
  a few last half a day; a market that just came back often goes again): a memoryless chain
  waits too long in a long outage and restarts onto blips. The hazards per age are learnt from
  the runs seen (``chain_from_history``), shrunk towards the memoryless rate where few were seen;
- a spot instance whose pool stays up can still be lost (``p_switch``: its own market went
  while another stayed; the job restarts);
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
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]

UNITS_PER_TICK = 4
"""Slack and restarts are counted in quarters of a tick (150 s for CBL's 10-minute tick)."""
PRIOR_UP_H = 24.0
PRIOR_DOWN_H = 1.0
PRIOR_WEIGHT = 1.0
"""A market that has shown nothing yet is taken as available for a day at a time and out for
an hour, with the weight of one observed run of each (the observations soon dominate)."""
AGE_EDGES = (0, 1, 2, 4, 8, 16, 32, 64)
"""Age buckets in ticks: bucket ``b`` holds ages ``[AGE_EDGES[b], AGE_EDGES[b + 1])``, the last
one every age from 64 ticks on (ten hours and more at a 10-minute tick). Octaves: a hazard
changes with the order of magnitude of the age, and each bucket then holds enough runs."""
SHRINK_EVENTS = 1.0
"""Each age bucket's hazard is shrunk towards the memoryless rate by this many pseudo-events at
that rate: a bucket seen little (the long ages) falls back on the mean run length."""

GRID_PER_DECADE = 10

IDLE, SPOT, ON_DEMAND = 0, 1, 2
N_AGES = len(AGE_EDGES)


@dataclass(frozen=True)
class Chain:
    """Per-tick hazards of the job's spot pool by age bucket (see the module docstring):
    ``lose[b]`` the chance an available pool goes within the tick at an age in bucket ``b``,
    ``back[b]`` the chance an unavailable one returns, ``p_switch`` the chance a running
    instance's own market goes while the pool stays."""

    lose: tuple[float, ...]
    back: tuple[float, ...]
    p_switch: float

    def rounded(self) -> Chain:
        """On a grid of ``GRID_PER_DECADE`` steps per decade: a cache key that changes only when
        an estimate moves by more than its own noise (a tenth of a decade is 26 %)."""

        def snap(p: float) -> float:
            if p <= 1e-6:
                return 0.0
            return float(min(10 ** (round(math.log10(p) * GRID_PER_DECADE) / GRID_PER_DECADE), 1.0))

        return Chain(tuple(map(snap, self.lose)), tuple(map(snap, self.back)), snap(self.p_switch))


def chain_from_history(pool: Array, market: Array, step_h: float, tick_h: float) -> Chain:
    """The chain from the capacity seen so far: ``pool[k]`` is 1 when some market of the pool
    was seen available at step ``k`` (0 none, NaN unknown), ``market`` the same for the market
    a spot instance would run on; steps ``step_h`` apart, hazards per tick of ``tick_h``."""
    runs = _runs(pool)
    mean_up, mean_down = _mean_runs(runs, step_h)
    lose = _hazards(runs, True, step_h, tick_h, mean_up)
    back = _hazards(runs, False, step_h, tick_h, mean_down)
    own_up = _mean_runs(_runs(market), step_h)[0] if len(market) else mean_up
    p_switch = max((1.0 - math.exp(-tick_h / own_up)) - (1.0 - math.exp(-tick_h / mean_up)), 0.0)
    return Chain(lose, back, p_switch)


def age_bucket(series: Array, up: bool, step_h: float, tick_h: float) -> int:
    """The age bucket of the pool's current state ``up``: how long ``series`` (as in
    ``chain_from_history``) has shown it, 0 when its last known state is the other.

    The age is counted as ``_hazards`` counts it: a state seen at ``n`` steps in a row has
    lived ``n - 1`` of them before the one now, so one seen at a single step is in its first
    tick and takes the first bucket's hazard (the blips a market that just came back often
    makes). Counting it one tick older gave a pool that had just come back the hazard of one
    that had already held a tick."""
    known = series[np.isfinite(series)] > 0.5
    if not len(known) or known[-1] != up:
        return 0
    flips = np.flatnonzero(known != up)
    steps = len(known) - (int(flips[-1]) + 1 if len(flips) else 0)
    return _bucket((steps - 1) * step_h / tick_h)


def _bucket(age_ticks: float) -> int:
    return int(np.searchsorted(AGE_EDGES, age_ticks, side="right") - 1)


def _runs(series: Array) -> tuple[Array, Array, Array]:
    """The runs of a 0/1/NaN series: state, length in steps and whether it ended by turning
    (a run cut by an unknown step or by the series' end is censored)."""
    finite = np.isfinite(series)
    code = np.where(finite, series > 0.5, -1).astype(np.int8)
    if not len(code):
        empty = np.zeros(0)
        return empty.astype(bool), empty, empty.astype(bool)
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
    lengths = np.diff(np.r_[starts, len(code)])
    state = code[starts]
    turned = np.r_[(state[:-1] >= 0) & (state[1:] >= 0), False]
    keep = state >= 0
    return state[keep] == 1, lengths[keep].astype(float), turned[keep]


def _mean_runs(runs: tuple[Array, Array, Array], step_h: float) -> tuple[float, float]:
    """Mean up-run and down-run lengths (hours) of a series' ``_runs``, with the prior."""
    state, length, turned = runs
    up_h = float(length[state].sum()) * step_h
    down_h = float(length[~state].sum()) * step_h
    downs, ups = int(turned[state].sum()), int(turned[~state].sum())
    mean_up = (up_h + PRIOR_UP_H * PRIOR_WEIGHT) / (downs + PRIOR_WEIGHT)
    mean_down = (down_h + PRIOR_DOWN_H * PRIOR_WEIGHT) / (ups + PRIOR_WEIGHT)
    return mean_up, mean_down


def _hazards(
    runs: tuple[Array, Array, Array], up: bool, step_h: float, tick_h: float, mean_h: float
) -> tuple[float, ...]:
    """Per age bucket, the chance per tick that a run of state ``up`` ends (``runs``: a
    series' ``_runs``): its ends over its exposure (ticks lived at those ages), shrunk towards
    the memoryless ``mean_h``."""
    state, length, turned = runs
    ticks = length[state == up] * step_h / tick_h
    ended = turned[state == up]
    lo = np.asarray(AGE_EDGES, dtype=float)
    hi = np.r_[lo[1:], np.inf]
    exposure = np.clip(ticks[:, None] - lo[None, :], 0.0, hi - lo).sum(axis=0)
    # A run of L ticks turned in the tick that started at age just under L.
    at = np.searchsorted(lo, ticks[ended], side="left") - 1
    events = np.bincount(np.clip(at, 0, N_AGES - 1), minlength=N_AGES).astype(float)
    q = 1.0 - math.exp(-tick_h / mean_h)
    prior = SHRINK_EVENTS / q
    return tuple(float(x) for x in np.clip((events + SHRINK_EVENTS) / (exposure + prior), 0.0, 1.0))


MAX_TICKS = 384
MAX_RESTART_TICKS = 2
MAX_SLACK_UNITS = 384
"""A table covers at most this many ticks, ticks of restart and units of slack (17 MB at most,
12 MB for Can't Be Late's setting); a job with more slack than a table holds decides as one
with that much (more slack only ever favours waiting for spot).

A longer restart coarsens the tick (``table_tick_h``). Keeping the planning period for restarts
of up to 8 periods was tried in session 15: on the 2023 traces at 5-minute probes it helped on
some settings and zones and cost on others (docs/benchmarks.md), so the bound stayed where it was."""


def restart_units(r: int) -> Array:
    """The restart units an instance can have left at a tick boundary, ascending, when a
    (re)start costs ``r``: ``r``, then ``UNITS_PER_TICK`` fewer at each tick it runs, down to 0.

    Only these are ever reached, so the tables keep one state per tick of restart, not one per
    unit: Can't Be Late's 0.2 h changeover at a 10-minute tick is 5 units and 3 states (it was
    6), and a table solves in about half the time."""
    return np.unique(np.maximum(r - UNITS_PER_TICK * np.arange(-(-r // UNITS_PER_TICK) + 1), 0))


def table_tick_h(period_h: float, deadline_h: float, restart_h: float) -> float:
    """The tables' tick: the planning period, or a power-of-two multiple of it where the time to
    the deadline is more than ``MAX_TICKS`` periods or the restart more than
    ``MAX_RESTART_TICKS`` periods long (a daemon polling every few seconds decides on a 30-day
    job with a tick of hours).

    In octaves, not the exact quotient: the tick is part of a table's cache key, and a tick
    that followed the time left changed at every decision as the deadline neared, so every
    decision solved a new table (on 5-minute probe traces a 60 h job solved one per decision
    for its first 28 h: hundreds of seconds a job). In octaves it changes a few times in a
    job's life."""
    need = max(deadline_h / MAX_TICKS, restart_h / MAX_RESTART_TICKS)
    if need <= period_h:
        return period_h
    return period_h * 2.0 ** math.ceil(math.log2(need / period_h) - 1e-9)


@dataclass(frozen=True)
class Job:
    """One job's terms for the tables: its tick, restart and the two prices per tick of work."""

    tick_h: float
    restart_h: float
    spot_usd_per_h: float
    od_usd_per_h: float


def decide(
    job: Job,
    chain: Chain,
    ticks_left: int,
    slack_h: float,
    mode: int,
    restart_left_h: float,
    spot_up: bool,
    age: int = 0,
) -> int:
    """``IDLE``, ``SPOT`` or ``ON_DEMAND`` for a job now (``mode`` what it runs on, ``age`` the
    bucket of how long the pool has been as ``spot_up`` says)."""
    unit = job.tick_h / UNITS_PER_TICK
    slack = math.floor(slack_h / unit + 1e-9)
    r = max(math.ceil(job.restart_h / unit - 1e-9), 0)
    if ticks_left <= 0 or (slack < r and mode == IDLE) or slack < 0:
        return ON_DEMAND  # no slack left for waiting or a spot restart: finish as soon as it can
    slack = min(slack, MAX_SLACK_UNITS - 1)
    ticks_left = min(ticks_left, MAX_TICKS)
    table = _tables(job, chain.rounded(), ticks_left, slack)
    # A restart left between two reachable ones is taken as the longer (it is mid-tick).
    left = restart_units(r)
    i = int(np.searchsorted(left, min(math.ceil(restart_left_h / unit - 1e-9), r)))
    state = 0 if mode == IDLE else (1 + i if mode == SPOT else len(left) + 1 + i)
    return int(table[ticks_left - 1, slack, state, int(spot_up), min(max(age, 0), N_AGES - 1)])


BLOCK = 32
CACHED_TABLES = 4
_cache: OrderedDict[tuple[Job, Chain], Array] = OrderedDict()


def _tables(job: Job, chain: Chain, ticks: int, slack: int) -> Array:
    """The action table for at least ``ticks`` ticks left and ``slack`` units: the cached one of
    this job and chain when it covers them (a job's later decisions have fewer ticks and less
    slack), else a new one rounded up to blocks of ``BLOCK``; the last ``CACHED_TABLES`` kept."""
    key = (job, chain)
    table = _cache.pop(key, None)
    if table is None or table.shape[0] < ticks or table.shape[1] <= slack:
        t_cap = min(-(-max(ticks, 1) // BLOCK) * BLOCK, MAX_TICKS)
        s_cap = min(-(-(slack + 1) // BLOCK) * BLOCK, MAX_SLACK_UNITS)
        table = _solve(job, chain, t_cap, s_cap)
    _cache[key] = table
    while len(_cache) > CACHED_TABLES:
        _cache.popitem(last=False)
    return table


LATE_FACTOR = 1e4
"""A unit of work past the deadline weighs this many units of on-demand: the tables meet every
deadline they can, and finish as soon as they can where none can be met."""


def _solve(job: Job, chain: Chain, n_ticks: int, n_slack: int) -> Array:
    """Backward induction: ``action[τ - 1, S, state, up, age]`` for τ ticks left and ``S``
    units of slack.

    States: 0 idle; ``1 + i`` on spot with ``ρ = restart_units(r)[i]`` units of restart left;
    ``n + 1 + i`` on on-demand (``n`` such ``ρ``). With τ ticks left and ``S`` units of slack,
    ``τ·k − S`` units of work are left; running a tick spends ``min(ρ, k)`` units of slack on
    the restart and leaves the next ``ρ`` down (``i - 1``), waiting spends ``k``.
    Values are kept per (up, age); a state on spot is only ever reached with the pool up.
    """
    k = UNITS_PER_TICK
    unit = job.tick_h / k
    r = max(math.ceil(job.restart_h / unit - 1e-9), 0)
    rho = restart_units(r)[:, None]
    n = len(rho)
    n_states = 2 * n + 1
    slack = np.arange(n_slack)
    spent = np.minimum(rho, k)
    after = np.maximum(np.arange(n) - 1, 0)[:, None]  # restart_units(r)[i - 1] is ρ − k, or 0
    on_spot, on_od = 1 + after, n + 1 + after
    lose, back = np.asarray(chain.lose), np.asarray(chain.back)
    switch = np.minimum(chain.p_switch, 1.0 - lose)
    width = np.diff(np.r_[AGE_EDGES, np.inf])
    advance = 1.0 / width  # an age in a bucket ``w`` ticks wide moves on with chance 1/w
    late = LATE_FACTOR * job.od_usd_per_h * unit

    def aged(v: Array) -> Array:
        """``v[..., age]`` one tick older, without turning."""
        return v * (1.0 - advance) + np.concatenate([v[..., 1:], v[..., -1:]], axis=-1) * advance

    def turn(v: Array) -> Array:
        """The expected value a tick on of ``v[..., up, age]`` for each (up, age) now."""
        out = np.empty_like(v)
        out[..., 1, :] = (1.0 - lose) * aged(v[..., 1, :]) + lose * v[..., 0, :1]
        out[..., 0, :] = (1.0 - back) * aged(v[..., 0, :]) + back * v[..., 1, :1]
        return out

    labels = np.full((n_states, 3), IDLE, dtype=np.int8)
    labels[IDLE] = [IDLE, SPOT, ON_DEMAND]
    labels[1 : n + 1, :2] = [SPOT, ON_DEMAND]
    labels[n + 1 :, :2] = [ON_DEMAND, SPOT]
    value = np.zeros((n_slack, n_states, 2, N_AGES))  # no tick left and no slack missing: done
    actions = np.zeros((n_ticks, n_slack, n_states, 2, N_AGES), dtype=np.int8)
    for tau in range(1, n_ticks + 1):
        work = tau * k - slack

        def later(s_after: Array, state: Array | int, work: Array = work, value: Array = value) -> Array:
            """Values one tick on at slack ``s_after`` per (up, age); below 0 the deadline is missed."""
            missed = np.maximum(-s_after, 0) * late + np.maximum(work - k, 0) * job.od_usd_per_h * unit
            kept = value[np.clip(s_after, 0, n_slack - 1), state]
            return np.where((s_after >= 0)[..., None, None], kept, missed[..., None, None])

        def run(usd_per_h: float, then: Array, work: Array = work) -> Array:
            """Cost of a tick on an instance (per ρ, slack, up, age) given the value after it."""
            price = usd_per_h * unit
            finish = (rho + work[None, :] <= k)[..., None, None]
            done = (price * (rho + np.maximum(work, 0)[None, :]))[..., None, None]
            return np.where(finish, done, price * k + then)

        s_run = slack[None, :] - spent
        gone = later(s_run, IDLE)  # (ρ, S, up, age)
        stays = later(s_run, on_spot)
        spot_then = (1.0 - lose - switch) * aged(stays[..., 1, :]) + switch * aged(gone[..., 1, :])
        spot_then = spot_then + lose * gone[..., 0, :1]
        spot = run(job.spot_usd_per_h, np.stack([spot_then, spot_then], axis=-2))
        spot[..., 0, :] = np.inf  # no spot to run on while the pool is out
        od = run(job.od_usd_per_h, turn(later(s_run, on_od)))
        wait = turn(later(slack - k, IDLE))  # (S, up, age)
        costs = np.full((n_states, 3, n_slack, 2, N_AGES), np.inf)
        costs[IDLE] = [wait, spot[-1], od[-1]]
        costs[1 : n + 1, 0], costs[1 : n + 1, 1] = spot, od[-1]
        costs[n + 1 :, 0], costs[n + 1 :, 1] = od, spot[-1]
        pick = np.argmin(costs, axis=1)
        best = np.take_along_axis(costs, pick[:, None], axis=1)[:, 0]
        value = np.where((work <= 0)[None, :, None, None], 0.0, best).transpose(1, 0, 2, 3)
        # A state on spot with the pool out is never reached; keep its value finite.
        value = np.where(np.isfinite(value), value, 0.0)
        actions[tau - 1] = np.take_along_axis(
            np.broadcast_to(labels[:, :, None, None, None], costs.shape), pick[:, None], axis=1
        )[:, 0].transpose(1, 0, 2, 3)
    return actions
