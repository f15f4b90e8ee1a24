"""The window of price history most reports start from: markets, intervals and per-GPU prices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from spotopt.reports import frames


@dataclass
class Window:
    """Markets and their price intervals over [since, until), from the ``markets``/``points`` results."""

    markets: pd.DataFrame
    """One row per market: market_id, instance_type_id, cloud, region, zone, instance_type,
    market, gpu_model, gpu_count."""
    intervals: pd.DataFrame
    """market_id, t, start, end (µs), usd_per_hour and ``usd_per_gpu_hour`` (NaN when the GPU
    count is unknown). Deliberately narrow: group by ``market_id`` and ``attach`` the market's
    columns to the (much smaller) aggregate; grouping 10⁵ rows by strings is what is slow."""
    since_us: int | None
    until_us: int
    sources: list[str]

    @property
    def first_us(self) -> int | None:
        """Where the data starts: ``since`` or, without one, the first interval."""
        if self.since_us is not None:
            return self.since_us
        return int(self.intervals["start"].min()) if len(self.intervals) else None


def load(results: Mapping[str, pd.DataFrame], args: Mapping[str, Any]) -> Window:
    since = args.get("since")
    since_us = frames.dt_us(since) if since is not None else None
    until_us = frames.dt_us(args["until"])
    markets = results["markets"].copy()
    markets["zone"] = markets["zone"].fillna("")
    pts = frames.points(results["points"])
    iv = frames.intervals(pts, since_us, until_us)
    iv = iv[iv["market_id"].isin(markets["market_id"])].reset_index(drop=True)
    count = iv["market_id"].map(markets.set_index("market_id")["gpu_count"]).to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_gpu = np.where(count > 0, iv["usd_per_hour"].to_numpy(dtype=float) / count, np.nan)
    iv["usd_per_gpu_hour"] = per_gpu
    return Window(markets, iv, since_us, until_us, sorted(pd.unique(iv["source"].to_numpy(dtype=object))))


def attach(frame: pd.DataFrame, markets: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """``frame`` with the named market columns joined on ``market_id``."""
    return frame.merge(markets[["market_id", *columns]], on="market_id", how="left")


def market_label(frame: pd.DataFrame) -> pd.Series:
    """``aws us-east-1a p3.2xlarge spot`` for legends and plot labels."""
    zone_or_region = frame["zone"].where(frame["zone"] != "", frame["region"])
    return frame["cloud"] + " " + zone_or_region + " " + frame["instance_type"] + " " + frame["market"]
