"""``spot-discount``: on-demand ÷ spot per GPU model, cloud and region (thesis Table 6.3).

Every spot market is compared with the on-demand market of the same instance type in the same
region, over the segments of time in which both had a price. ``best_x`` is the largest ratio
seen (the thesis's "best-case cost reduction"); ``median_x`` is the time-weighted median ratio
pooled over the region's spot markets, i.e. the discount one got half of the time or more.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from spotopt.reports import frames, history, params, plots
from spotopt.reports.base import AnySelect, Args, Report, ReportResult
from spotopt.reports.sql import markets_stmt, points_stmt

GROUP = ["gpu_model", "cloud", "region"]
COLUMNS = [
    *GROUP,
    "best_x",
    "median_x",
    "best_instance_type",
    "best_zone",
    "best_at",
    "spot_usd_per_gpu_hour",
    "on_demand_usd_per_gpu_hour",
    "spot_markets",
    "hours",
]


def statements(args: Args) -> dict[str, AnySelect]:
    both = {**args, "market": None}
    return {"markets": markets_stmt(both), "points": points_stmt(both)}


def compute(results: dict[str, pd.DataFrame], args: Args) -> ReportResult:
    window = history.load(results, args)
    seg = frames.spot_vs_on_demand(window.intervals, window.markets, window.until_us)
    markets = window.markets.assign(group=window.markets.groupby(GROUP, sort=True).ngroup())
    by_id = markets.set_index("market_id")
    seg = seg.assign(
        group=seg["market_id"].map(by_id["group"]), gpu_count=seg["market_id"].map(by_id["gpu_count"])
    )
    seg = seg[seg["gpu_count"].fillna(0) > 0]
    seg["ratio"] = seg["on_demand"] / seg["spot"]
    stats = frames.weighted_stats(seg, ["group"], "ratio").set_index("group")
    # The best case: highest ratio, earliest time, lowest market id on ties (same on both databases).
    best = (
        seg.sort_values(["group", "ratio", "start", "market_id"], ascending=[True, False, True, True])
        .groupby("group", sort=True)
        .head(1)
        .set_index("group")
    )
    best = best.join(by_id[["instance_type", "zone"]], on="market_id")
    table = pd.DataFrame(
        {
            "best_x": stats["max"],
            "median_x": stats["median"],
            "best_instance_type": best["instance_type"],
            "best_zone": best["zone"],
            "best_at": frames.from_us(best["start"].to_numpy(dtype=np.int64), best.index),
            "spot_usd_per_gpu_hour": best["spot"] / best["gpu_count"],
            "on_demand_usd_per_gpu_hour": best["on_demand"] / best["gpu_count"],
            "spot_markets": seg.groupby("group", sort=True)["market_id"].nunique(),
            "hours": stats["hours"],
        }
    )
    names = markets.drop_duplicates("group").set_index("group")[GROUP]
    table = names.join(table, how="inner").sort_values(GROUP, kind="stable").reset_index(drop=True)
    return ReportResult(
        {"spot-discount": table[COLUMNS]},
        args["since"],
        args["until"],
        window.sources,
        "Spot discount (on-demand ÷ spot)",
    )


def plot(result: ReportResult, args: Args, path: Path) -> None:
    table = result.sections["spot-discount"]
    fig, ax = plots.figure()
    if len(table):
        # Per GPU model and cloud, the region with the deepest best case (as in Table 6.3).
        top = (
            table.sort_values("best_x", ascending=False, kind="stable")
            .groupby(["gpu_model", "cloud"])
            .head(1)
        )
        gpus = sorted(top["gpu_model"].unique())
        clouds = sorted(top["cloud"].unique())
        width = 0.8 / len(clouds)
        x = np.arange(len(gpus))
        for i, cloud in enumerate(clouds):
            rows = top[top["cloud"] == cloud].set_index("gpu_model").reindex(gpus)
            pos = x + (i - (len(clouds) - 1) / 2) * width
            ax.bar(pos, rows["best_x"], width, label=f"{cloud}: best case")
            ax.scatter(pos, rows["median_x"], color="black", marker="_", s=300, zorder=3)
        ax.scatter([], [], color="black", marker="_", s=300, label="time-weighted median")
        ax.set_xticks(x, gpus)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("GPU model (deepest region per cloud)")
    ax.set_ylabel("on-demand price ÷ spot price (×)")
    plots.finish(fig, ax, result, "Spot discount per GPU model and cloud", path)


REPORT = Report(
    name="spot-discount",
    summary="on-demand ÷ spot per GPU model, cloud and region: best case and time-weighted median",
    params=(params.gpu(), params.cloud(), params.region(), params.since(), params.until()),
    statements=statements,
    compute=compute,
    plot=plot,
    resolve=params.window,
)
