"""Each cloud's billing rule on hand-computed intervals, boundaries first."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from spotopt.errors import InputError
from spotopt.mover.billing import billed_seconds, interval_cost_usd

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("cloud", "ran_s", "interrupted", "billed_s"),
    [
        # AWS: per second, 60 s minimum
        ("aws", 0, False, 60),
        ("aws", 1, False, 60),
        ("aws", 59, False, 60),
        ("aws", 60, False, 60),
        ("aws", 61, False, 61),
        ("aws", 61.5, False, 61.5),
        ("aws", 3725, False, 3725),
        # AWS spot reclaimed by AWS: free inside the first hour, per second after it
        ("aws", 30, True, 0),
        ("aws", 3599, True, 0),
        ("aws", 3600, True, 3600),
        ("aws", 5400, True, 5400),
        # GCP: per second, one minute minimum; no interruption refund
        ("gcp", 0, False, 60),
        ("gcp", 59, False, 60),
        ("gcp", 60, False, 60),
        ("gcp", 61, False, 61),
        ("gcp", 59, True, 60),
        ("gcp", 7200, True, 7200),
        # Azure: whole minutes only, the seconds after the last full minute are free
        ("azure", 0, False, 0),
        ("azure", 59, False, 0),
        ("azure", 60, False, 60),
        ("azure", 61, False, 60),
        ("azure", 119, False, 60),
        ("azure", 120, False, 120),
        ("azure", 6 * 60 + 45, False, 360),  # Azure's own FAQ example: 6 min 45 s -> 6 min
        ("azure", 6 * 60 + 45, True, 360),
    ],
)
def test_billed_seconds_per_cloud(cloud: str, ran_s: float, interrupted: bool, billed_s: float) -> None:
    ended = T0 + timedelta(seconds=ran_s)
    assert billed_seconds(cloud, T0, ended, interrupted_by_cloud=interrupted) == billed_s


@pytest.mark.parametrize(
    ("cloud", "usd_per_hour", "ran_s", "interrupted", "cost"),
    [
        ("aws", 3.6, 30, False, 0.06),  # 60 s minimum at $3.60/h = $0.001/s
        ("aws", 3.6, 90, False, 0.09),
        ("aws", 3.6, 1800, True, 0.0),  # reclaimed by AWS in the first hour
        ("aws", 3.6, 3900, True, 3.9),
        ("gcp", 7.2, 10, False, 0.12),
        ("gcp", 7.2, 3600, False, 7.2),
        ("azure", 1.2, 150, False, 0.04),  # 2 full minutes at $0.02/min
        ("azure", 1.2, 59, False, 0.0),
        ("aws", 0.0, 600, False, 0.0),
    ],
)
def test_interval_cost(cloud: str, usd_per_hour: float, ran_s: float, interrupted: bool, cost: float) -> None:
    ended = T0 + timedelta(seconds=ran_s)
    got = interval_cost_usd(cloud, usd_per_hour, T0, ended, interrupted_by_cloud=interrupted)
    assert got == pytest.approx(cost, abs=1e-12)


def test_times_in_other_zones_are_the_same_instants() -> None:
    cet = timezone(timedelta(hours=1))
    ended = datetime(2026, 3, 1, 14, 1, 1, tzinfo=cet)  # 13:01:01 UTC
    assert billed_seconds("gcp", T0, ended) == 3661
    assert billed_seconds("azure", T0, ended) == 3660


def test_unknown_cloud_is_an_input_error_naming_it() -> None:
    with pytest.raises(InputError, match=r"cloud: 'oracle' has no billing rule; use one of aws, gcp, azure"):
        billed_seconds("oracle", T0, T0 + timedelta(minutes=5))
    with pytest.raises(InputError, match="'AWS'"):
        interval_cost_usd("AWS", 1.0, T0, T0 + timedelta(minutes=5))


def test_interval_ending_before_it_starts_is_refused() -> None:
    with pytest.raises(InputError, match=r"ended_at: .* is before started_at"):
        billed_seconds("aws", T0, T0 - timedelta(seconds=1))


def test_naive_times_are_refused() -> None:
    with pytest.raises(InputError, match="time zone"):
        billed_seconds("aws", T0.replace(tzinfo=None), T0)


@pytest.mark.parametrize("price", [-0.01, float("nan"), float("inf")])
def test_bad_price_is_refused(price: float) -> None:
    with pytest.raises(InputError, match="usd_per_hour"):
        interval_cost_usd("gcp", price, T0, T0 + timedelta(hours=1))
