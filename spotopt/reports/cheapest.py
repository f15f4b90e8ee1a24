"""``cheapest``: the cheapest $/GPU-hour per GPU model over time, per cloud and over all clouds.

Per time bucket, each market's price is its time-weighted mean over the part of the bucket it
had a price (price points are step functions); the cheapest market is the one with the lowest
such mean, i.e. where one would have paid least by staying put for the whole bucket.
``lowest_usd_per_gpu_hour`` is the lowest price in effect at any instant of the bucket.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from spotopt.reports import frames, history, params, plots
from spotopt.reports.base import AnySelect, Args, Report, ReportResult
from spotopt.reports.sql import markets_stmt, points_stmt

GROUP = ["bucket", "gpu_model", "market", "cloud"]
COLUMNS = [
    "bucket",
    "gpu_model",
    "market",
    "cloud",
    "usd_per_gpu_hour",
    "lowest_usd_per_gpu_hour",
    "region",
    "zone",
    "instance_type",
    "markets",
]


def statements(args: Args) -> dict[str, AnySelect]:
    return {"markets": markets_stmt(args), "points": points_stmt(args)}


def bucket_means(window: history.Window, args: Args) -> pd.DataFrame:
    """Per (bucket, market): time-weighted mean and minimum $/GPU-hour inside the bucket."""
    iv = window.intervals
    priced = iv[iv["usd_per_gpu_hour"].notna()]
    pieces = frames.split_buckets(priced, params.BUCKETS[args["bucket"]])
    dur = (pieces["end"] - pieces["start"]).to_numpy(dtype=float)
    pieces = pieces.assign(_w=dur, _wv=dur * pieces["usd_per_gpu_hour"].to_numpy())
    grouped = pieces.groupby(["bucket", "market_id"], sort=True)
    out = grouped[["_w", "_wv"]].sum()
    out["mean"] = out["_wv"] / out["_w"]
    out["lowest"] = grouped["usd_per_gpu_hour"].min()
    out = out.drop(columns=["_w", "_wv"]).reset_index()
    return history.attach(
        out, window.markets, ["gpu_model", "market", "cloud", "region", "zone", "instance_type"]
    )


def _cheapest_of(means: pd.DataFrame, group: list[str]) -> pd.DataFrame:
    # Ties on price go to the lower market id, so both databases pick the same market.
    ordered = means.sort_values([*group, "mean", "market_id"], kind="stable")
    best = ordered.groupby(group, sort=True).head(1).set_index(group)
    grouped = means.groupby(group, sort=True)
    return pd.DataFrame(
        {
            "usd_per_gpu_hour": best["mean"],
            "lowest_usd_per_gpu_hour": grouped["lowest"].min(),
            "region": best["region"],
            "zone": best["zone"],
            "instance_type": best["instance_type"],
            "markets": grouped["market_id"].nunique(),
        }
    ).reset_index()


def compute(results: dict[str, pd.DataFrame], args: Args) -> ReportResult:
    window = history.load(results, args)
    means = bucket_means(window, args)
    parts = [_cheapest_of(means, GROUP)]
    if not args.get("cloud"):
        overall = _cheapest_of(means.assign(cloud="all"), GROUP)
        parts.append(overall)
    table = pd.concat(parts, ignore_index=True).sort_values(GROUP, kind="stable").reset_index(drop=True)
    table["bucket"] = frames.from_us(table["bucket"].to_numpy(dtype=np.int64))
    return ReportResult(
        {"cheapest": table[COLUMNS]},
        args["since"],
        args["until"],
        window.sources,
        f"Cheapest $/GPU-hour per {args['bucket']}",
    )


def plot(result: ReportResult, args: Args, path: Path) -> None:
    table = result.sections["cheapest"]
    fig, ax = plots.figure()
    series = table.groupby(["gpu_model", "market", "cloud"], sort=True)
    for (gpu, kind, cloud), rows in list(series)[: plots.MAX_SERIES]:
        ax.plot(
            rows["bucket"],
            rows["usd_per_gpu_hour"],
            drawstyle="steps-post",
            marker="o",
            markersize=3,
            linewidth=2.5 if cloud == "all" else 1.2,
            label=f"{gpu} {kind} {cloud}",
        )
    ax.set_xlabel(f"time (UTC), {args['bucket']} buckets")
    ax.set_ylabel("cheapest price (USD per GPU-hour, time-weighted)")
    ax.set_ylim(bottom=0)
    plots.finish(fig, ax, result, f"Cheapest $/GPU-hour per {args['bucket']}", path)


REPORT = Report(
    name="cheapest",
    summary="cheapest $/GPU-hour per GPU model over time (hour/day/week), per cloud and overall",
    params=(
        params.gpu(),
        params.cloud(),
        params.region(),
        params.market("all"),
        params.bucket(),
        params.since(),
        params.until(),
    ),
    statements=statements,
    compute=compute,
    plot=plot,
    resolve=params.window,
)
