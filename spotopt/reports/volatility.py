"""``volatility``: how much each market's price moves over the window.

Per market: price changes per day (points whose price differs from the one before, per day the
market had a price), the lowest, time-weighted median, time-weighted mean and highest $/h, the
coefficient of variation (time-weighted standard deviation ÷ mean), and for spot markets the
share of time the spot price was at or above the on-demand price of the same instance type in
the same region (AWS caps spot at on-demand; a share near 1 means "spot buys nothing here").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from spotopt.reports import frames, history, params, plots
from spotopt.reports.base import AnySelect, Args, Report, ReportResult
from spotopt.reports.sql import MARKET_COLUMNS, markets_stmt, points_stmt

COLUMNS = [
    *MARKET_COLUMNS,
    "changes",
    "changes_per_day",
    "min_usd_per_hour",
    "median_usd_per_hour",
    "mean_usd_per_hour",
    "max_usd_per_hour",
    "cv",
    "share_at_or_above_on_demand",
    "hours",
]


def statements(args: Args) -> dict[str, AnySelect]:
    return {
        "markets": markets_stmt(args, with_on_demand=True),
        "points": points_stmt(args, with_on_demand=True),
    }


def _changes(iv: pd.DataFrame, since_us: int | None) -> pd.Series:
    """Per market, points inside the window whose price differs from the previous point's."""
    prev = iv.groupby("market_id")["usd_per_hour"].shift(1)
    inside = iv["t"] > since_us if since_us is not None else pd.Series(True, index=iv.index)
    changed = inside & prev.notna() & (iv["usd_per_hour"] != prev)
    return changed.groupby(iv["market_id"]).sum()


def _share_at_or_above(segments: pd.DataFrame) -> pd.Series:
    dur = (segments["end"] - segments["start"]).astype(float)
    above = dur.where(segments["spot"] >= segments["on_demand"], 0.0)
    grouped = pd.DataFrame({"market_id": segments["market_id"], "dur": dur, "above": above})
    sums = grouped.groupby("market_id")[["dur", "above"]].sum()
    return sums["above"] / sums["dur"]


def compute(results: dict[str, pd.DataFrame], args: Args) -> ReportResult:
    window = history.load(results, args)
    iv = window.intervals
    stats = frames.weighted_stats(iv, ["market_id"], "usd_per_hour").set_index("market_id")
    table = window.markets.set_index("market_id").join(stats, how="inner")
    if args.get("market"):
        table = table[table["market"] == args["market"]]
    table["changes"] = _changes(iv, window.since_us).reindex(table.index).fillna(0).astype(np.int64)
    table["changes_per_day"] = table["changes"] / (table["hours"] / 24.0)
    table["cv"] = table["std"] / table["mean"]
    share = _share_at_or_above(frames.spot_vs_on_demand(iv, window.markets, window.until_us))
    table["share_at_or_above_on_demand"] = share.reindex(table.index)
    table = table.rename(
        columns={
            "min": "min_usd_per_hour",
            "median": "median_usd_per_hour",
            "mean": "mean_usd_per_hour",
            "max": "max_usd_per_hour",
        }
    )
    table = table.reset_index().sort_values(["cv", "market_id"], ascending=[False, True], kind="stable")
    return ReportResult(
        {"volatility": table[COLUMNS].reset_index(drop=True)},
        args["since"],
        args["until"],
        window.sources,
        "Price volatility per market",
    )


def plot(result: ReportResult, args: Args, path: Path) -> None:
    table = result.sections["volatility"].head(20).iloc[::-1]
    fig, ax = plots.figure()
    if len(table):
        labels = history.market_label(table)
        ax.barh(labels, table["cv"] * 100.0, color="tab:blue", label="coefficient of variation")
        ax.scatter(
            table["changes_per_day"],
            labels,
            color="tab:orange",
            zorder=3,
            label="price changes per day",
        )
    ax.set_xlabel("coefficient of variation (% of mean price, time-weighted) / price changes per day")
    ax.set_ylabel("market (20 most volatile)")
    ax.tick_params(axis="y", labelsize=8)
    plots.finish(fig, ax, result, "Most volatile markets", path)


REPORT = Report(
    name="volatility",
    summary="per market: price changes per day, min/median/max, coefficient of variation, "
    "share of time at or above on-demand",
    params=(
        params.gpu(),
        params.cloud(),
        params.region(),
        params.market("spot"),
        params.since(),
        params.until(),
    ),
    statements=statements,
    compute=compute,
    plot=plot,
    resolve=params.window,
)
