"""A causal price forecast per market: the recent low it reverts to, and how soon.

Why: a move pays a restart, a checkpoint and egress once, and saves money for as long as the
price gap it exploits lasts. Real spot prices have long calm stretches and *excursions* (spikes)
that revert within hours or days (thesis §6.3.2; the 2019-20 AWS traces bundled with spotopt).
Valuing a job's remaining work at today's price as if it lasted until the job ends moves jobs
out of short spikes for nothing, and valuing it at a ratio refuses moves whose saving is many
times their cost. So the planner values work against this forecast instead:

- ``baseline[m, t]``: the lowest price of market ``m`` in the ``lookback_h`` hours up to and
  including ``t`` (the level a spike reverts to; a lasting rise becomes the baseline once it is
  older than the lookback);
- ``revert_h[m, t]``: 0 when the price is within ``tolerance`` of its baseline, else the
  expected remaining length of the excursion: its age so far (an excursion that has lasted
  ``a`` hours is expected to last about ``a`` more: the median residual life of a heavy-tailed
  duration, which is what spike lengths in the traces look like), at least ``min_excursion_h``.

Only prices at or before ``t`` are read (tests check that hiding the future changes nothing),
so the what-if engine and the live daemon forecast alike. Parameters: ``FORECAST`` below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.ndimage import minimum_filter1d

Array = np.ndarray[Any, Any]


@dataclass(frozen=True, slots=True)
class ForecastParams:
    lookback_h: float = 72.0
    tolerance: float = 0.02
    min_excursion_h: float = 3.0


FORECAST = ForecastParams()


def forecast(prices: Array, tick_h: float, params: ForecastParams = FORECAST) -> tuple[Array, Array]:
    """``(baseline, revert_h)`` for a markets × ticks price matrix (NaN: no price then).

    Column ``t`` of both depends on columns ``<= t`` of ``prices`` only.
    """
    prices = np.atleast_2d(np.asarray(prices, dtype=float))
    n_ticks = prices.shape[1]
    if n_ticks == 0:
        return prices.copy(), np.zeros_like(prices)
    width = max(1, round(params.lookback_h / tick_h))
    size = 2 * (width // 2) + 1  # odd: the causal window is the centred one shifted left
    filled = np.where(np.isfinite(prices), prices, np.inf)
    low = minimum_filter1d(filled, size=size, axis=1, mode="constant", cval=np.inf, origin=size // 2)
    baseline = np.where(np.isfinite(low), low, np.nan)
    with np.errstate(invalid="ignore"):
        spiking = np.isfinite(prices) & (prices > baseline * (1.0 + params.tolerance))
    idx = np.broadcast_to(np.arange(n_ticks), prices.shape)
    calm_at = np.maximum.accumulate(np.where(spiking, -1, idx), axis=1)
    age_h = (idx - calm_at) * tick_h
    revert = np.where(spiking, np.maximum(age_h, params.min_excursion_h), 0.0)
    return baseline, revert
