"""The price forecast: a causal rolling low and an excursion's expected remaining length."""

from __future__ import annotations

import numpy as np
import pytest

from spotopt.decide.forecast import ForecastParams, forecast


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


def test_an_excursion_is_expected_to_last_as_long_as_past_ones_did() -> None:
    # Twelve markets each had one 5-tick spike that ended by tick 10; a 13th spikes from tick 20.
    past = np.ones((12, 30))
    past[:, 3:8] = 3.0
    now = np.ones((1, 30))
    now[0, 20:] = 3.0
    params = ForecastParams(lookback_h=24, min_excursion_h=0.5, min_excursions=10)
    _, revert = forecast(np.vstack([past, now]), 1.0, params)
    # ages 1, 2, 3, 4 ticks: mean(5 - age) = 4, 3, 2, 1 hours; from age 5 on no excursion lasted
    # longer, so there is no evidence it will end: inf
    assert revert[12, 20:25].tolist() == [4.0, 3.0, 2.0, 1.0, np.inf]
    # before any spike had ended, a spike is not expected to revert
    assert np.isinf(revert[:12, 3]).all()
    assert np.isinf(revert[:12, 10:]).all()  # calm: today's price holds


def test_too_few_past_excursions_mean_prices_persist() -> None:
    prices = np.array([[1.0] * 3 + [2.0] * 3 + [1.0] * 3 + [2.0] * 5])
    _, revert = forecast(prices, 1.0, ForecastParams(lookback_h=24, min_excursions=2))
    assert np.isinf(revert[0, 9:]).all()  # one past excursion only


def test_a_lasting_rise_becomes_the_baseline_after_the_lookback() -> None:
    prices = np.array([[1.0] * 3 + [2.0] * 10])
    baseline, revert = forecast(prices, 1.0, ForecastParams(lookback_h=5))
    assert baseline[0, -1] == 2.0 and np.isinf(revert[0, -1])
    assert baseline[0, 5] == 1.0
