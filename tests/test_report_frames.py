"""Properties of the interval and bucket arithmetic every time-weighted report relies on."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from spotopt.reports import frames

HOUR = frames.US_PER_HOUR
WIDTHS = [timedelta(hours=1), timedelta(days=1), timedelta(weeks=1)]

spans = st.lists(
    st.tuples(st.integers(0, 20 * 24 * HOUR), st.integers(1, 9 * 24 * HOUR)), min_size=1, max_size=30
)


@settings(max_examples=80, deadline=None)
@given(spans, st.sampled_from(WIDTHS))
def test_split_buckets_keeps_time_and_stays_inside_buckets(
    pairs: list[tuple[int, int]], width: timedelta
) -> None:
    iv = pd.DataFrame(
        {"start": [s for s, _ in pairs], "end": [s + d for s, d in pairs], "id": range(len(pairs))}
    )
    pieces = frames.split_buckets(iv, width)
    w = int(width.total_seconds()) * frames.US_PER_S
    assert ((pieces["end"] - pieces["start"]) > 0).all()
    assert (pieces["start"] >= pieces["bucket"]).all() and (pieces["end"] <= pieces["bucket"] + w).all()
    total = pieces.assign(d=pieces["end"] - pieces["start"]).groupby("id")["d"].sum()
    assert total.to_numpy().tolist() == (iv["end"] - iv["start"]).tolist()
    assert (frames.bucket_of(pieces["bucket"].to_numpy(), width) == pieces["bucket"].to_numpy()).all()


def test_weeks_start_on_monday() -> None:
    wednesday = frames.dt_us(pd.Timestamp("2024-05-01 13:00", tz="UTC").to_pydatetime())
    monday = frames.dt_us(pd.Timestamp("2024-04-29", tz="UTC").to_pydatetime())
    assert frames.bucket_of(np.array([wednesday]), timedelta(weeks=1))[0] == monday


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 3), st.integers(0, 100), st.floats(0.1, 10)), min_size=1, max_size=40),
    st.integers(0, 60),
    st.integers(61, 120),
)
def test_intervals_match_the_price_at_every_hour(
    pts: list[tuple[int, int, float]], since_h: int, until_h: int
) -> None:
    raw = pd.DataFrame(pts, columns=["market_id", "h", "usd_per_hour"]).drop_duplicates(["market_id", "h"])
    # As SQLite returns them: naive UTC text.
    stamps = (pd.Timestamp("2024-01-01") + pd.to_timedelta(raw["h"], unit="h")).dt.strftime(
        "%Y-%m-%d %H:%M:%S.%f"
    )
    frame = pd.DataFrame(
        {
            "market_id": raw["market_id"],
            "observed_at": stamps,
            "usd_per_hour": raw["usd_per_hour"],
            "source": "s",
        }
    )
    origin = frames.dt_us(pd.Timestamp("2024-01-01", tz="UTC").to_pydatetime())
    iv = frames.intervals(frames.points(frame), origin + since_h * HOUR, origin + until_h * HOUR)
    for hour in range(since_h, until_h):
        t = origin + hour * HOUR
        for market in raw["market_id"].unique():
            seen = raw[(raw["market_id"] == market) & (raw["h"] <= hour)]
            expected = seen.sort_values("h")["usd_per_hour"].iloc[-1] if len(seen) else None
            hit = iv[(iv["market_id"] == market) & (iv["start"] <= t) & (iv["end"] > t)]
            assert len(hit) == (expected is not None)
            if expected is not None:
                assert hit["usd_per_hour"].item() == expected
