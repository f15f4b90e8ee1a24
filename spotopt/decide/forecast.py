"""A causal price forecast per market: the recent low it may revert to, and how soon.

Why: a move pays a restart, a checkpoint and egress once, and saves money for as long as the
price gap it exploits lasts. Valuing a job's remaining work at today's price as if it lasted
until the job ends moves jobs out of short spikes for nothing; refusing moves by a price ratio
leaves money on the table when a small gap lasts. So the planner values work against this
forecast, learnt from the history the caller hands in (the what-if engine: the replayed window up
to now; the daemon: the stored history up to now):

- ``baseline[m, t]``: the lowest price of market ``m`` in the ``lookback_h`` hours up to and
  including ``t``;
- an *excursion* is a stretch where the price is more than ``tolerance`` above its baseline;
- ``revert_h[m, t]``: how long today's price is expected to hold before returning to the
  baseline: ``inf`` when market ``m`` is not in an excursion at ``t`` (its price is within
  ``tolerance`` of the baseline, and holds); in an excursion, its expected remaining length given
  how long it has lasted (``age``): the mean of
  ``length - age`` over the excursions of *every* market that ended at or before ``t`` and lasted
  longer than ``age`` (their empirical mean residual life), at least ``min_excursion_h``. With
  fewer than ``min_excursions`` such excursions there is no evidence that prices revert, and
  ``revert_h`` is ``inf``: today's price is expected to last.

So on a market whose rises revert within hours a job rides spikes out, and on one whose price
changes persist (AWS's since 2017, in the bundled 2019-20 traces) the forecast is today's price.
Only prices at or before ``t`` are read: tests check that hiding the future changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class ForecastParams:
    lookback_h: float = 72.0
    tolerance: float = 0.02
    min_excursion_h: float = 1.0
    min_excursions: int = 10


FORECAST = ForecastParams()


def step_prices(times: Array, values: Array, ticks: Array) -> Array:
    """Sample one market's step function (sorted ``times``) at ``ticks``; NaN before the first point."""
    idx = np.searchsorted(times, ticks, side="right") - 1
    out = np.where(idx >= 0, values[np.maximum(idx, 0)], np.nan)
    return out


def forecast(prices: Array, tick_h: float, params: ForecastParams = FORECAST) -> tuple[Array, Array]:
    """``(baseline, revert_h)`` for a markets × ticks price matrix (NaN: no price then).

    Column ``t`` of both depends on columns ``<= t`` of ``prices`` only.
    """
    prices = np.atleast_2d(np.asarray(prices, dtype=float))
    n_ticks = prices.shape[1]
    if n_ticks == 0:
        return prices.copy(), np.zeros_like(prices)
    from scipy.ndimage import minimum_filter1d  # here: 0.2 s to import, for every command otherwise

    width = max(1, round(params.lookback_h / tick_h))
    size = 2 * (width // 2) + 1  # odd: the causal window is the centred one shifted left
    filled = np.where(np.isfinite(prices), prices, np.inf)
    low = minimum_filter1d(filled, size=size, axis=1, mode="constant", cval=np.inf, origin=size // 2)
    baseline = np.where(np.isfinite(low), low, np.nan)
    with np.errstate(invalid="ignore"):
        spiking = np.isfinite(prices) & (prices > baseline * (1.0 + params.tolerance))
    idx = np.broadcast_to(np.arange(n_ticks), prices.shape)
    calm_at = np.maximum.accumulate(np.where(spiking, -1, idx), axis=1)
    age = idx - calm_at  # ticks into the excursion, counting this one (0 when calm)
    return baseline, _remaining_h(spiking, age, tick_h, params)


def _remaining_h(spiking: Array, age: Array, tick_h: float, params: ForecastParams) -> Array:
    """Expected remaining excursion hours per (market, tick), from excursions ended by then."""
    n_ticks = spiking.shape[1]
    # An excursion of L ticks that ends at tick t (calm again at t) is known from tick t on.
    ended = np.zeros_like(spiking)
    ended[:, 1:] = spiking[:, :-1] & ~spiking[:, 1:]
    lengths = np.where(ended[:, 1:], age[:, :-1], 0)
    out = np.full(spiking.shape, np.inf)
    counts = np.zeros(n_ticks + 1)
    residual = np.full(n_ticks + 1, np.inf)
    for t in range(n_ticks):
        done = lengths[:, t - 1][ended[:, t]] if t > 0 else np.zeros(0, dtype=np.int64)
        if len(done):
            np.add.at(counts, done, 1.0)
            residual = _mean_residual(counts, params.min_excursions)
        live = spiking[:, t]
        if live.any():
            out[live, t] = np.maximum(residual[age[live, t]] * tick_h, params.min_excursion_h)
    return out


def _mean_residual(counts: Array, min_excursions: int) -> Array:
    """``r[a] = mean(L - a | L > a)`` over lengths with ``counts[L]``; ``inf`` with too few."""
    lengths = np.arange(len(counts))
    above = np.cumsum(counts[::-1])[::-1]  # number with L >= a
    total = np.cumsum((counts * lengths)[::-1])[::-1]  # sum of L over L >= a
    n_gt = np.r_[above[1:], 0.0]
    sum_gt = np.r_[total[1:], 0.0]
    with np.errstate(invalid="ignore", divide="ignore"):
        r = sum_gt / n_gt - lengths
    return np.where(n_gt >= min_excursions, r, np.inf)
