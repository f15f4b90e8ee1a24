"""Narrow each job's options to those that can matter for the ``spotopt`` decider, per window.

At scale a job has thousands of options (every market × GPUs per job) but at any moment only a
few are worth looking at: within one region, an option that is dearer *and* no faster than
another can never be the policy's choice nor the planner's. Dropping such options before the
policy and the planner see them makes a tick cost O(frontier) instead of O(options), and it
changes no decision (``tests/test_whatif_frontier.py`` replays random histories both ways).

Rule (exact, per window of ``window`` ticks): option ``e`` of job ``j`` in region ``l`` is
dropped when another option ``e'`` of ``j`` in ``l`` is at least as fast (expected steps/h, and
at the low end of its figure's interval, which deadlines are planned with), priced throughout
the window, and its dearest price in the window is strictly below ``e``'s lowest *forecast
baseline* in it (``spotopt.decide.forecast``; the baseline is never above the price, and every
forecast cost of ``e`` is at least its baseline); an on-demand option is only dropped for
another on-demand one (deadline safety looks at on-demand options alone) and a spot option for
another spot one (the deadline reserve and the planner's affordability look at the job's
fastest spot option: a spot option dropped for an on-demand one could be it). Options without
any price in the window are dropped too.
Then at every tick of the window ``e'`` is strictly cheaper per hour now and over any forecast
horizon, per step, to finish and to enter (same region: same egress; the restart is billed at a
lower price), so

- ``prune_dominated`` would drop ``e`` from the policy's input anyway (``e'`` sorts before it
  and is as fast), so the policy solves the very same problem;
- every choice of the planner among options (cheapest to finish, fastest on-demand then cheapest,
  the budget and the spend-rate cap) prefers ``e'`` to ``e``, and dominance is transitive, so a
  kept option always beats a dropped one.

The decider adds each job's current and target option back every tick: those are compared by
the planner whatever their price.

Speeds are compared at the window start's preemption rates, but the decider learns rates as it
goes (a run's own preemptions and hours). ``dominators(t)`` names, for every dropped option, a
kept option that dominates it at those rates (the cheapest dearest price among the options at
least as fast, itself never dominated); the decider hands a dropped option back when its
dominator is slower than it at the rates of the tick (only possible where one of the two markets'
rate moved), and the rest of the argument holds as it stands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spotopt.price import per_slot
from spotopt.whatif.jobs import SimJobs
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]

DEFAULT_WINDOW = 24
"""Ticks per window: shorter windows keep fewer options but recompute more often. On the scale
benchmark 12 and 24 hourly ticks were equally fast, 6 and 96 about 1.5 times slower."""


class OptionFrontier:
    """The options worth considering at tick ``t`` (``candidates(t)``), one window at a time."""

    def __init__(
        self,
        tl: Timeline,
        sim: SimJobs,
        steps_per_hour: Array,
        floor: Array,
        window: int = DEFAULT_WINDOW,
        *,
        low: Array | None = None,
    ) -> None:
        """``low``: ``steps_per_hour`` at the low end of each figure's interval (None: every
        figure exact). The running minimum finds the cheapest option at least as fast at the
        expected speed; it drops ``e`` only if that option is at least as fast at the low end
        too (else ``e`` is kept: exact, if a little less narrow where estimates cross)."""
        self.tl, self.sim, self.window = tl, sim, max(1, window)
        self.floor = floor
        n = sim.n_options
        # Static layout: options grouped by (job, region), fastest first. Per group the window's
        # "cheapest dearest price among the options at least as fast" is a running minimum along
        # a row of a padded matrix (groups × longest group).
        order = np.lexsort((-steps_per_hour, sim.location, sim.job))
        key = sim.job[order] * (int(sim.location.max(initial=0)) + 1) + sim.location[order]
        starts = np.r_[0, np.flatnonzero(key[1:] != key[:-1]) + 1] if n else np.zeros(0, dtype=np.int64)
        sizes = np.diff(np.r_[starts, n])
        group = np.repeat(np.arange(len(starts)), sizes)
        col = np.arange(n) - np.repeat(starts, sizes)
        speed = steps_per_hour[order]
        # Options as fast as a later one in their group compare against it too: read each
        # running minimum at the end of its block of equal speed.
        block_end = np.empty(n, dtype=np.int64)
        if n:
            last = np.r_[(key[1:] != key[:-1]) | (speed[1:] != speed[:-1]), True]
            ends = np.flatnonzero(last)
            block_end = np.repeat(ends, np.diff(np.r_[-1, ends]))
        self.order, self.group, self.col = order, group, col
        self.group_start = starts
        self.read_col = col[block_end] if n else col
        self.shape = (len(starts), int(sizes.max(initial=0)))
        self.on_demand = sim.on_demand[order].astype(bool)
        self.low = (steps_per_hour if low is None else low)[order]
        self._window_index: int | None = None
        self._keep = self._dropped = self._dominator = np.zeros(0, dtype=np.int64)

    def candidates(self, t: int) -> Array:
        """Sorted option indices not dominated throughout the window holding tick ``t``."""
        self._update(t)
        return self._keep

    def dominators(self, t: int) -> tuple[Array, Array]:
        """The options dropped for another in the window holding tick ``t`` (not those without
        a price) and, per option, a kept one that dominates it at the start's speeds."""
        self._update(t)
        return self._dropped, self._dominator

    def _update(self, t: int) -> None:
        w = t // self.window
        if w != self._window_index:
            self._window_index = w
            self._keep, self._dropped, self._dominator = self._compute(w * self.window)

    def _compute(self, first: int) -> tuple[Array, Array, Array]:
        tl, sim = self.tl, self.sim
        cols = slice(first, min(first + self.window, tl.n_ticks))
        prices = tl.price[:, cols]
        priced = np.isfinite(prices)
        lo_m = np.where(priced, self.floor[:, cols], np.inf).min(axis=1)
        hi_m = np.where(priced.all(axis=1), np.where(priced, prices, -np.inf).max(axis=1), np.inf)
        slots = sim.slots[self.order]
        lo = per_slot(lo_m[sim.market[self.order]], slots)
        hi = per_slot(hi_m[sim.market[self.order]], slots)
        best_od, by_od = self._running_min(np.where(self.on_demand, hi, np.inf))
        best_spot, by_spot = self._running_min(np.where(self.on_demand, np.inf, hi))
        by = np.where(self.on_demand, by_od, by_spot)
        dominated = (np.where(self.on_demand, best_od, best_spot) < lo) & (self.low[by] >= self.low)
        keep = np.isfinite(lo) & ~dominated
        dropped = np.isfinite(lo) & dominated
        dominator = by[dropped]
        return np.sort(self.order[keep]), self.order[dropped], self.order[dominator]

    def _running_min(self, values: Array) -> tuple[Array, Array]:
        """Per option: the least ``values`` over the options of its group at least as fast, and
        the position (in ``order``) of an option holding it."""
        grid = np.full(self.shape, np.inf)
        grid[self.group, self.col] = values
        best = np.minimum.accumulate(grid, axis=1)
        # The last column at or before each one whose value is the running minimum holds it.
        at = np.where(grid == best, np.arange(self.shape[1]), 0)
        np.maximum.accumulate(at, axis=1, out=at)
        rows, cols = self.group, self.read_col
        return best[rows, cols], self.group_start[rows] + at[rows, cols]
