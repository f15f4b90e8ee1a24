"""Spot capacity over a grid of ticks, replayed from the history's capacity observations: what
the what-if engine replays and what the daemon's decider knows of each market (its own window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class Capacity:
    """The spot capacity of a timeline's markets, from capacity observations (probe traces, the
    daemon's own launch attempts): each says the market's state from its time until the next
    observation of the same market, the rule prices follow.

    - ``observed[m]``: market ``m`` has observations; its capacity is replayed (the others are
      taken as always available, their preemptions drawn or replayed from lifetimes).
    - ``up[m, t]``: ``m`` can launch an instance at tick ``t``'s start (what the engine and the
      oracle hold the strategies to; no strategy reads it).
    - ``down_at[m, t]``: position in tick ``t`` (0..1] at which ``m`` turns unavailable, for
      the first time after the tick's start (NaN: it does not): the cloud reclaims its
      instances then (``spotopt.whatif.preemptions`` places the notice before it). A market that
      comes back later in the same tick can be launched again only from the next tick.
    - ``seen[m, t]``: what a collector had recorded before tick ``t``'s start: 1 available, 0
      not, NaN nothing yet. A strategy knows this, what its own instances tell it, and what its
      refused launches tell it; never ``up``.
    """

    observed: Array
    up: Array
    down_at: Array
    seen: Array

    @classmethod
    def unobserved(cls, n_markets: int, n_ticks: int) -> Capacity:
        return cls(
            np.zeros(n_markets, dtype=bool),
            np.ones((n_markets, n_ticks), dtype=bool),
            np.full((n_markets, n_ticks), np.nan),
            np.full((n_markets, n_ticks), np.nan),
        )

    @classmethod
    def from_observations(
        cls, n_markets: int, n_ticks: int, tick_h: float, market: Array, at_h: Array, available: Array
    ) -> Capacity:
        """From observations ``(market index, hours from the window start, available)``; rows
        before the start (the one in effect there) count from hour 0. Of several observations
        of a market at one time the first stands (the history's rule:
        ``spotopt.db.queries.capacity_history`` orders them by source)."""
        out = cls.unobserved(n_markets, n_ticks)
        edges = np.arange(n_ticks + 1) * tick_h
        for m in np.unique(market).tolist():
            rows = market == m
            times, first = np.unique(np.maximum(at_h[rows], 0.0), return_index=True)
            state = available[rows].astype(bool)[first]
            out.observed[m] = True
            # State at each tick start: the last observation at or before it (none yet: unknown,
            # taken as available, as for a market without observations).
            at = np.searchsorted(times, edges[:-1], side="right") - 1
            out.up[m] = np.where(at >= 0, state[np.maximum(at, 0)], True)
            # What had been recorded strictly before each tick start.
            before = np.searchsorted(times, edges[:-1], side="left") - 1
            out.seen[m] = np.where(before >= 0, state[np.maximum(before, 0)].astype(float), np.nan)
            # The first change to unavailable inside (start, end] of each tick.
            prev = np.concatenate([[True], state[:-1]])
            falls = times[~state & prev]
            falls = falls[falls > 0]
            first = np.searchsorted(falls, edges[:-1], side="right")
            has = first < len(falls)
            when = falls[np.minimum(first, max(len(falls) - 1, 0))] if len(falls) else np.zeros(n_ticks)
            inside = has & (when <= edges[1:] + 1e-12)
            out.down_at[m] = np.where(inside, (when - edges[:-1]) / tick_h, np.nan)
        return out
