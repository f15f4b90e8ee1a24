"""``regional-spread``: the cheapest and the most expensive region per GPU model and cloud over time.

A region's price in a bucket is its cheapest market's time-weighted mean $/GPU-hour there
(the best one could do in that region); the report then names the cheapest and the priciest
region and their ratio (thesis fig. 6.3: where to run matters, and the order changes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from spotopt.reports import cheapest, frames, history, params, plots
from spotopt.reports.base import AnySelect, Args, Report, ReportResult
from spotopt.reports.sql import markets_stmt, points_stmt

GROUP = ["bucket", "gpu_model", "market", "cloud"]
COLUMNS = [
    *GROUP,
    "cheapest_region",
    "cheapest_usd_per_gpu_hour",
    "priciest_region",
    "priciest_usd_per_gpu_hour",
    "spread_x",
    "regions",
]


def statements(args: Args) -> dict[str, AnySelect]:
    return {"markets": markets_stmt(args), "points": points_stmt(args)}


def compute(results: dict[str, pd.DataFrame], args: Args) -> ReportResult:
    window = history.load(results, args)
    means = cheapest.bucket_means(window, args)
    regions = means.groupby([*GROUP, "region"], sort=True)["mean"].min().reset_index()
    # Ties go to the alphabetically first region, so both databases name the same one.
    low = regions.sort_values([*GROUP, "mean", "region"], kind="stable").groupby(GROUP).head(1)
    high = (
        regions.sort_values([*GROUP, "mean", "region"], ascending=[True] * 4 + [False, True], kind="stable")
        .groupby(GROUP)
        .head(1)
    )
    table = low.rename(columns={"region": "cheapest_region", "mean": "cheapest_usd_per_gpu_hour"}).merge(
        high.rename(columns={"region": "priciest_region", "mean": "priciest_usd_per_gpu_hour"}), on=GROUP
    )
    table = table.merge(regions.groupby(GROUP).size().rename("regions").reset_index(), on=GROUP)
    table["spread_x"] = table["priciest_usd_per_gpu_hour"] / table["cheapest_usd_per_gpu_hour"]
    table = table.sort_values(GROUP, kind="stable").reset_index(drop=True)
    table["bucket"] = frames.from_us(table["bucket"].to_numpy(dtype=np.int64))
    return ReportResult(
        {"regional-spread": table[COLUMNS]},
        args["since"],
        args["until"],
        window.sources,
        f"Cheapest vs priciest region per {args['bucket']}",
    )


def plot(result: ReportResult, args: Args, path: Path) -> None:
    table = result.sections["regional-spread"]
    fig, ax = plots.figure()
    colors = iter(plots.colors())
    for (gpu, kind, cloud), rows in list(table.groupby(["gpu_model", "market", "cloud"]))[: plots.MAX_SERIES]:
        color = next(colors)
        label = f"{gpu} {kind} {cloud}"
        ax.plot(
            rows["bucket"],
            rows["cheapest_usd_per_gpu_hour"],
            color=color,
            marker="o",
            markersize=3,
            drawstyle="steps-post",
            label=f"{label}: cheapest region",
        )
        ax.plot(
            rows["bucket"],
            rows["priciest_usd_per_gpu_hour"],
            color=color,
            linestyle="--",
            drawstyle="steps-post",
            label=f"{label}: priciest region",
        )
        ax.fill_between(
            rows["bucket"],
            rows["cheapest_usd_per_gpu_hour"],
            rows["priciest_usd_per_gpu_hour"],
            step="post",
            color=color,
            alpha=0.15,
        )
    ax.set_xlabel(f"time (UTC), {args['bucket']} buckets")
    ax.set_ylabel("price (USD per GPU-hour, time-weighted, best market in the region)")
    ax.set_ylim(bottom=0)
    plots.finish(fig, ax, result, "Cheapest vs priciest region", path)


REPORT = Report(
    name="regional-spread",
    summary="cheapest vs most expensive region per GPU model and cloud over time",
    params=(
        params.gpu(),
        params.cloud(),
        params.market("spot"),
        params.bucket(),
        params.since(),
        params.until(),
    ),
    statements=statements,
    compute=compute,
    plot=plot,
    resolve=params.window,
)
