"""The price forecast: a causal rolling low and an excursion's expected remaining length."""

from __future__ import annotations

import numpy as np
import pytest

from spotopt.mover.forecast import ForecastParams, forecast


@pytest.mark.parametrize("seed", range(5))
def test_the_baseline_is_the_low_of_the_lookback_and_reads_no_future(seed: int) -> None:
    rng = np.random.default_rng(seed)
    prices = rng.uniform(0.5, 3.0, (4, 60))
    prices[rng.random(prices.shape) < 0.2] = np.nan
    params = ForecastParams(lookback_h=7.0, tolerance=0.02, min_excursion_h=2.0)
    baseline, revert = forecast(prices, 1.0, params)
    for t in range(prices.shape[1]):
        window = prices[:, max(0, t - 6) : t + 1]
        low = np.where(
            np.isfinite(window).any(axis=1),
            np.nanmin(np.where(np.isfinite(window), window, np.inf), axis=1),
            np.nan,
        )
        assert np.allclose(baseline[:, t], low, equal_nan=True)
        cut_base, cut_revert = forecast(prices[:, : t + 1], 1.0, params)
        assert np.allclose(cut_base[:, t], baseline[:, t], equal_nan=True)
        assert np.array_equal(cut_revert[:, t], revert[:, t])


def test_an_excursion_is_expected_to_last_as_long_as_it_has_so_far() -> None:
    prices = np.array([[1.0] * 5 + [3.0] * 6 + [1.0] * 3])
    _, revert = forecast(prices, 1.0, ForecastParams(lookback_h=24, min_excursion_h=2.0))
    assert revert[0].tolist() == [0, 0, 0, 0, 0, 2, 2, 3, 4, 5, 6, 0, 0, 0]


def test_a_lasting_rise_becomes_the_baseline_after_the_lookback() -> None:
    prices = np.array([[1.0] * 3 + [2.0] * 10])
    baseline, revert = forecast(prices, 1.0, ForecastParams(lookback_h=5))
    assert baseline[0, -1] == 2.0 and revert[0, -1] == 0.0
    assert baseline[0, 5] == 1.0 and revert[0, 5] > 0
