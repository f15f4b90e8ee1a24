"""pandas/numpy building blocks: price points -> intervals -> time buckets -> time-weighted statistics.

All arithmetic runs on int64 microseconds since the epoch (UTC): SQLite returns text and
PostgreSQL ``datetime`` objects, and after ``to_us`` both are the same integers, so every
report gives identical numbers on both databases. A price point holds from its time until the
next point of its market; the last one holds until the window's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

import numpy as np
import pandas as pd

from spotopt.errors import InputError

US_PER_S = 1_000_000
US_PER_HOUR = 3600 * US_PER_S
US_PER_DAY = 24 * US_PER_HOUR
# 1970-01-05 was a Monday: weeks start on Mondays (ISO 8601), hours and days at the epoch.
_MONDAY_US = 4 * US_PER_DAY


def to_us(values: pd.Series | Sequence[object]) -> np.ndarray:
    """Driver times (naive-UTC text from SQLite, aware datetimes from PostgreSQL) -> int64 µs."""
    series = values if isinstance(values, pd.Series) else pd.Series(list(values), dtype=object)
    if series.empty:
        return np.empty(0, dtype=np.int64)
    parsed = pd.to_datetime(series, utc=True, format="ISO8601")
    return parsed.dt.as_unit("us").astype("int64").to_numpy()


def dt_us(value: datetime) -> int:
    """An aware datetime -> int64 µs since the epoch (exact)."""
    delta = value - datetime(1970, 1, 1, tzinfo=value.tzinfo)
    return (delta.days * 86400 + delta.seconds) * US_PER_S + delta.microseconds


def from_us(values: np.ndarray | pd.Series, index: pd.Index | None = None) -> pd.Series:
    """int64 µs -> tz-aware UTC timestamps (for output), on ``index`` if given."""
    stamps = pd.to_datetime(np.asarray(values, dtype=np.int64), unit="us", utc=True)
    return pd.Series(stamps, index=index)


def points(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``sql.points_stmt`` -> market_id, t (µs), usd_per_hour, source; sorted, one per instant.

    Two sources may observe the same market at the same instant; like ``db.queries`` the
    alphabetically first source wins, so every consumer sees one price per instant.
    """
    out = pd.DataFrame(
        {
            "market_id": frame["market_id"].to_numpy(dtype=np.int64),
            "t": to_us(frame["observed_at"]),
            "usd_per_hour": frame["usd_per_hour"].to_numpy(dtype=float),
            "source": frame["source"].to_numpy(dtype=object),
        }
    )
    order = np.lexsort((out["t"].to_numpy(), out["market_id"].to_numpy()))
    out = out.iloc[order]
    mid, t = out["market_id"].to_numpy(), out["t"].to_numpy()
    if ((mid[1:] == mid[:-1]) & (t[1:] == t[:-1])).any():  # rare: sort by source only then
        out = out.sort_values(["market_id", "t", "source"], kind="stable")
        out = out.drop_duplicates(["market_id", "t"], keep="first")
    return out.reset_index(drop=True)


def intervals(pts: pd.DataFrame, since_us: int | None, until_us: int) -> pd.DataFrame:
    """Points (from ``points``) -> [start, end) intervals clipped to [since, until).

    Keeps ``t`` (when the point was observed) so callers can tell a change inside the window
    from the opening point that was in effect at ``since``.
    """
    mid = pts["market_id"].to_numpy()
    t = pts["t"].to_numpy()
    nxt = np.empty_like(t)
    if len(t):
        nxt[:-1] = t[1:]
        nxt[-1] = until_us
        last = np.ones(len(t), dtype=bool)
        last[:-1] = mid[1:] != mid[:-1]
        nxt[last] = until_us
    start = t if since_us is None else np.maximum(t, since_us)
    end = np.minimum(nxt, until_us)
    out = pts.assign(start=start, end=end)
    return out[out["end"] > out["start"]].reset_index(drop=True)


def bucket_origin(width: timedelta) -> int:
    return _MONDAY_US if width == timedelta(weeks=1) else 0


def bucket_of(t_us: np.ndarray, width: timedelta) -> np.ndarray:
    """The start (µs) of the bucket holding each time: floor to the hour, day or ISO week."""
    w = int(width.total_seconds()) * US_PER_S
    origin = bucket_origin(width)
    return ((t_us - origin) // w) * w + origin


MAX_BUCKET_PIECES = 3_000_000
"""At most this many (interval, bucket) rows: about 1 GB of frames. An hourly report over
decades of catalog prices would need hundreds of millions and run for many minutes."""


def split_buckets(iv: pd.DataFrame, width: timedelta) -> pd.DataFrame:
    """Cut intervals at bucket boundaries: one row per (interval, bucket) with the overlap.

    Adds ``bucket`` (start, µs); ``start``/``end`` become the part inside that bucket. The
    number of rows is known before any is built: above ``MAX_BUCKET_PIECES`` an ``InputError``
    says so and how to ask for less.
    """
    w = int(width.total_seconds()) * US_PER_S
    start, end = iv["start"].to_numpy(), iv["end"].to_numpy()
    first = bucket_of(start, width)
    last = bucket_of(end - 1, width)
    counts = ((last - first) // w + 1).astype(np.int64)
    total = int(counts.sum())
    if total > MAX_BUCKET_PIECES:
        raise InputError(
            f"parameter bucket: {len(iv):,} price intervals over this window make {total:,} "
            f"market-buckets, more than {MAX_BUCKET_PIECES:,}; use a wider bucket (day, week) "
            "or a shorter window (since=…, until=…), or filter by gpu/cloud/region"
        )
    rows = np.repeat(np.arange(len(iv)), counts)
    offset = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    bucket = first[rows] + offset * w
    out = iv.iloc[rows].reset_index(drop=True)
    out["bucket"] = bucket
    out["start"] = np.maximum(start[rows], bucket)
    out["end"] = np.minimum(end[rows], bucket + w)
    return out


def weighted_stats(frame: pd.DataFrame, keys: list[str], value: str) -> pd.DataFrame:
    """Per group of ``keys``: time-weighted mean, std, median, plus min and max of ``value``.

    Weights are the interval lengths (``end - start``); the median is the lower weighted median
    (the smallest value at which half the time is reached), so it is always a price that was
    actually in effect.
    """
    dur = (frame["end"] - frame["start"]).to_numpy(dtype=float)
    val = frame[value].to_numpy(dtype=float)
    work = frame[keys].assign(_w=dur, _wv=dur * val, _wvv=dur * val * val, _v=val)
    grouped = work.groupby(keys, sort=True)
    sums = grouped[["_w", "_wv", "_wvv"]].sum()
    mean = sums["_wv"] / sums["_w"]
    var = (sums["_wvv"] / sums["_w"] - mean * mean).clip(lower=0.0)
    ordered = work.sort_values([*keys, "_v"], kind="stable")
    cum = ordered.groupby(keys, sort=False)["_w"].cumsum()
    total = ordered[keys].merge(sums["_w"].rename("_t").reset_index(), on=keys, how="left")["_t"]
    reached = ordered[(cum.to_numpy() >= total.to_numpy() / 2.0)]
    median = reached.groupby(keys, sort=True)["_v"].first()
    return pd.DataFrame(
        {
            "hours": sums["_w"] / US_PER_HOUR,
            "min": grouped["_v"].min(),
            "median": median,
            "mean": mean,
            "max": grouped["_v"].max(),
            "std": np.sqrt(var),
        }
    ).reset_index()


def spot_vs_on_demand(iv: pd.DataFrame, markets: pd.DataFrame, until_us: int) -> pd.DataFrame:
    """Segments of time in which a spot market and its on-demand twin both have a price.

    The twin is the on-demand market of the same instance type in the same region (on-demand
    prices are region-wide). Returns market_id (the spot market), start, end, spot and
    on_demand ($/h); segment boundaries are every change of either price.
    """
    kinds = markets.set_index("market_id")
    key = kinds["instance_type_id"].astype(str) + "|" + kinds["region"]
    spot_ids = kinds.index[kinds["market"] == "spot"]
    od = kinds[kinds["market"] == "on-demand"]
    od_by_key = pd.Series(od.index, index=key[od.index].to_numpy())
    od_by_key = od_by_key[~od_by_key.index.duplicated()]
    twin = pd.Series(od_by_key.reindex(key[spot_ids].to_numpy()).to_numpy(), index=spot_ids).dropna()
    empty = pd.DataFrame(columns=["market_id", "start", "end", "spot", "on_demand"])
    if twin.empty:
        return empty.astype({"market_id": np.int64, "start": np.int64, "end": np.int64})
    twin = twin.astype(np.int64)
    spot_iv = iv[iv["market_id"].isin(twin.index)]
    od_iv = iv[iv["market_id"].isin(twin.to_numpy())]
    # Every spot market sees every change of its twin: map od intervals onto their spot markets.
    pairs = pd.DataFrame({"spot_id": twin.index.to_numpy(), "od_id": twin.to_numpy()})
    od_on_spot = od_iv.merge(pairs, left_on="market_id", right_on="od_id")
    events = pd.concat(
        [
            spot_iv[["market_id", "start"]],
            od_on_spot[["spot_id", "start"]].rename(columns={"spot_id": "market_id"}),
        ]
    ).drop_duplicates()
    events = events.sort_values(["start", "market_id"], kind="stable").reset_index(drop=True)
    spot_side = spot_iv[["market_id", "start", "end", "usd_per_hour"]].sort_values("start", kind="stable")
    od_side = (
        od_on_spot[["spot_id", "start", "end", "usd_per_hour"]]
        .rename(columns={"spot_id": "market_id"})
        .sort_values("start", kind="stable")
    )
    merged = pd.merge_asof(events, spot_side, on="start", by="market_id", direction="backward")
    merged = merged.rename(columns={"end": "spot_end", "usd_per_hour": "spot"})
    merged = pd.merge_asof(merged, od_side, on="start", by="market_id", direction="backward")
    merged = merged.rename(columns={"end": "od_end", "usd_per_hour": "on_demand"})
    merged = merged.sort_values(["market_id", "start"], kind="stable").reset_index(drop=True)
    nxt = merged.groupby("market_id")["start"].shift(-1).fillna(until_us).to_numpy(dtype=np.int64)
    # A segment ends at the next event, or where either interval ends (window end).
    # (A side without a price yet has no end: 0 makes the segment empty, and it is dropped.)
    spot_end = merged["spot_end"].fillna(0).to_numpy(dtype=np.int64)
    od_end = merged["od_end"].fillna(0).to_numpy(dtype=np.int64)
    merged["end"] = np.minimum(nxt, np.minimum(spot_end, od_end))
    ok = merged["spot"].notna() & merged["on_demand"].notna() & (merged["end"] > merged["start"])
    return merged.loc[ok, ["market_id", "start", "end", "spot", "on_demand"]].reset_index(drop=True)
