"""``availability``: how often each spot market had capacity, and how long it went without.

Reads the capacity observations (``capacity_observations``: imported probe traces, the daemon's
launch attempts, collectors) by the step rule prices follow: an observation holds from its time
until the market's next one (any source), the last until ``until``; of two sources at one
instant the first by name wins. Over the window [since, until), per spot market with
observations:

Section ``markets``: the observations inside the window, their sources, the hours the window
covers with a known state (from ``since``, or from the first observation when that is later),
the time-weighted share of those hours the market was available, and its outages (maximal
stretches of unavailability, clipped to the window): how many, mean, median and longest hours.
Section ``outages``: each outage with its start, end and hours.

``--plot``: a heatmap, markets × time, of the share of each time column a market was available
(grey: no observation yet). Markets without an observation inside the window are named in a
note on stderr: their state is carried from before it, however old.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from spotopt.db.models import CapacityObservation
from spotopt.db.queries import capacity_window
from spotopt.reports import frames, history, params, plots
from spotopt.reports.base import AnySelect, Args, Report, ReportResult
from spotopt.reports.sql import MARKET_COLUMNS, MARKET_SELECT, filter_markets, raw

MARKETS_COLUMNS = [
    *MARKET_COLUMNS,
    "observations",
    "sources",
    "first_observed",
    "last_observed",
    "hours",
    "available_share",
    "outages",
    "mean_outage_hours",
    "median_outage_hours",
    "max_outage_hours",
]
OUTAGE_COLUMNS = [*MARKET_COLUMNS, "outage_from", "outage_to", "outage_hours"]
PLOT_ROWS = 40
"""At most this many markets in the heatmap (the least available first): labels stay legible."""
PLOT_COLUMNS = 600
"""Time columns of the heatmap: the window cut in this many equal parts."""


def statements(args: Args) -> dict[str, AnySelect]:
    columns = (
        *MARKET_SELECT,
        raw(CapacityObservation.observed_at).label("observed_at"),
        CapacityObservation.available,
        CapacityObservation.source,
    )
    # Availability needs no GPU count: a market of a type missing from the catalog is shown.
    window = capacity_window(
        columns,
        args["since"],
        args["until"],
        lambda stmt: filter_markets(stmt, {**args, "market": "spot"}, unknown_gpu=True),
    )
    return {"observations": window}


def _observations(rows: pd.DataFrame) -> pd.DataFrame:
    """One state per (market, instant), the first source by name winning, in time order."""
    out = rows.assign(
        zone=rows["zone"].fillna(""),
        t=frames.to_us(rows["observed_at"]),
        available=rows["available"].astype(bool),
    )
    out = out.sort_values(["market_id", "t", "source"], kind="stable")
    return out.drop_duplicates(["market_id", "t"], keep="first").reset_index(drop=True)


def _outages(iv: pd.DataFrame) -> pd.DataFrame:
    """Maximal runs of unavailable intervals per market: market_id, start, end (µs).

    A market's intervals are contiguous (each ends where the next starts), so a run is a
    stretch of consecutive rows of one market that are all unavailable.
    """
    mid, down = iv["market_id"].to_numpy(), ~iv["available"].to_numpy(dtype=bool)
    new_run = np.ones(len(iv), dtype=bool)
    new_run[1:] = (mid[1:] != mid[:-1]) | (down[1:] != down[:-1])
    run = np.cumsum(new_run)
    runs = iv.assign(run=run)[down].groupby("run", sort=True)
    return pd.DataFrame(
        {"market_id": runs["market_id"].first(), "start": runs["start"].min(), "end": runs["end"].max()}
    ).reset_index(drop=True)


def compute(results: dict[str, pd.DataFrame], args: Args) -> ReportResult:
    since_us, until_us = frames.dt_us(args["since"]), frames.dt_us(args["until"])
    rows = results["observations"]
    obs = _observations(rows)
    markets = obs.drop_duplicates("market_id")[["market_id", *MARKET_COLUMNS]].set_index("market_id")
    iv = frames.intervals(obs[["market_id", "t", "available"]], since_us, until_us)
    dur = (iv["end"] - iv["start"]).to_numpy(dtype=np.int64)
    per_market = (
        pd.DataFrame({"market_id": iv["market_id"], "hours": dur, "up": np.where(iv["available"], dur, 0)})
        .groupby("market_id")[["hours", "up"]]
        .sum()
    )
    outages = _outages(iv)
    outages["outage_hours"] = (outages["end"] - outages["start"]) / frames.US_PER_HOUR
    lengths = outages.groupby("market_id")["outage_hours"]

    raw_t = frames.to_us(rows["observed_at"])
    inside = pd.Series(rows["market_id"].to_numpy()[(raw_t >= since_us) & (raw_t < until_us)])
    sources = rows.groupby("market_id")["source"].agg(lambda s: ",".join(sorted(set(s))))
    seen = obs.groupby("market_id")["t"]

    table = markets.copy()
    table["observations"] = inside.value_counts().reindex(table.index).fillna(0).astype(np.int64)
    table["sources"] = sources.reindex(table.index)
    table["first_observed"] = frames.from_us(seen.min().reindex(table.index).to_numpy(), table.index)
    table["last_observed"] = frames.from_us(seen.max().reindex(table.index).to_numpy(), table.index)
    table["hours"] = per_market["hours"].reindex(table.index).fillna(0) / frames.US_PER_HOUR
    with np.errstate(divide="ignore", invalid="ignore"):
        table["available_share"] = per_market["up"].reindex(table.index) / per_market["hours"].reindex(
            table.index
        )
    table["outages"] = lengths.size().reindex(table.index).fillna(0).astype(np.int64)
    table["mean_outage_hours"] = lengths.mean().reindex(table.index)
    table["median_outage_hours"] = lengths.median().reindex(table.index)
    table["max_outage_hours"] = lengths.max().reindex(table.index)
    table = table.reset_index().sort_values("market_id", kind="stable")

    outages = outages.merge(markets.reset_index(), on="market_id", how="left")
    outages["outage_from"] = frames.from_us(outages["start"].to_numpy(), outages.index)
    outages["outage_to"] = frames.from_us(outages["end"].to_numpy(), outages.index)
    sections = {
        "markets": table[MARKETS_COLUMNS].reset_index(drop=True),
        "outages": outages.sort_values(["market_id", "start"], kind="stable")[OUTAGE_COLUMNS].reset_index(
            drop=True
        ),
    }
    notes = _carried_note(table)
    return ReportResult(
        sections,
        args["since"],
        args["until"],
        sorted(set(rows["source"])),
        "Spot capacity availability",
        notes,
    )


def _carried_note(table: pd.DataFrame) -> list[str]:
    """A note when some markets have no observation inside the window: their rows carry the
    state of their last one before it, however old (an imported trace that ended weeks ago
    reads as available all week), so the reader is told, with a window to ask for instead
    (``since`` defaults to a week before ``until``)."""
    carried = table[table["observations"] == 0]
    if carried.empty:
        return []
    latest = carried["last_observed"].max()
    until = (latest + pd.Timedelta(days=1)).strftime("%Y-%m-%d")
    return [
        f"no observation in this window for {len(carried)} of {len(table)} markets: their rows carry "
        f"the state of their last one before it (the latest at {latest:%Y-%m-%d %H:%M} UTC); for the "
        f"week before it, ask for -p until={until}"
    ]


def heatmap(
    sections: Mapping[str, pd.DataFrame], since_us: int, until_us: int, rows: int, columns: int
) -> tuple[pd.Series, np.ndarray]:
    """The labels of the ``rows`` least available markets and, per market and each of
    ``columns`` equal time columns of [since, until), the share of the column it was available
    (NaN where its state was not known yet). ``--plot`` draws it, and so does the dashboard.

    Rebuilt from the sections alone: a market's state is known from ``since`` or its first
    observation, and it was available then except during its outages.
    """
    table = sections["markets"].sort_values("available_share", kind="stable").head(rows)
    labels = history.market_label(table.assign(zone=table["zone"].fillna("")))
    outages = sections["outages"]
    outage_labels = history.market_label(outages.assign(zone=outages["zone"].fillna("")))
    edges = np.linspace(since_us, until_us, columns + 1)
    lo, hi = edges[:-1], edges[1:]
    shares = np.full((len(table), columns), np.nan)
    first = frames.to_us(table["first_observed"])
    for i, label in enumerate(labels):
        known_from = max(since_us, int(first[i]))
        known = np.clip(hi, known_from, None) - np.clip(lo, known_from, None)
        down = np.zeros(columns)
        mine = outages[(outage_labels == label).to_numpy()]
        for start, end in zip(
            frames.to_us(mine["outage_from"]), frames.to_us(mine["outage_to"]), strict=True
        ):
            down += np.clip(np.minimum(hi, end) - np.maximum(lo, start), 0, None)
        with np.errstate(divide="ignore", invalid="ignore"):
            shares[i] = np.where(known > 0, 1.0 - down / known, np.nan)
    return labels, shares


def plot(result: ReportResult, args: Args, path: Path) -> None:
    import matplotlib  # only to draw (``spotopt.reports.plots``)
    from matplotlib.dates import ConciseDateFormatter, date2num
    from matplotlib.patches import Rectangle

    since_us, until_us = frames.dt_us(args["since"]), frames.dt_us(args["until"])
    labels, shares = heatmap(result.sections, since_us, until_us, PLOT_ROWS, PLOT_COLUMNS)
    fig, ax = plots.figure()
    if len(labels):
        cmap = matplotlib.colormaps["RdYlGn"].with_extremes(bad="lightgrey")
        extent = (date2num(args["since"]), date2num(args["until"]), len(labels) - 0.5, -0.5)
        image = ax.imshow(
            np.ma.masked_invalid(shares),
            aspect="auto",
            interpolation="nearest",
            cmap=cmap,
            vmin=0.0,
            vmax=1.0,
            extent=extent,
        )
        ax.xaxis_date()
        ax.xaxis.set_major_formatter(ConciseDateFormatter(ax.xaxis.get_major_locator()))
        ax.set_yticks(range(len(labels)), labels.tolist())
        fig.colorbar(image, ax=ax, label="share of the column's time available")
        # Legend entries for plots.finish (empty patches), then the limits the image set.
        for colour, label in (
            (cmap(1.0), "available"),
            (cmap(0.0), "unavailable"),
            ("lightgrey", "not observed yet"),
        ):
            ax.add_patch(Rectangle((0, 0), 0, 0, color=colour, label=label))
        ax.set_xlim(extent[0], extent[1])
        ax.set_ylim(extent[2], extent[3])
    ax.set_xlabel("time (UTC)")
    ax.set_ylabel(
        f"spot market (the {PLOT_ROWS} least available)" if len(labels) == PLOT_ROWS else "spot market"
    )
    ax.tick_params(axis="y", labelsize=8)
    plots.finish(fig, ax, result, "Spot capacity: share of time available", path)


REPORT = Report(
    name="availability",
    summary="per spot market: share of time with capacity (time-weighted), outages (count, mean, "
    "median, longest hours) and each outage, from imported probes and the daemon's launches",
    params=(
        params.gpu(),
        params.cloud(),
        params.region(),
        params.zone("one zone, e.g. us-east-1a (spot capacity is observed per zone); default all"),
        params.since(),
        params.until(),
    ),
    statements=statements,
    compute=compute,
    plot=plot,
    resolve=params.window,
)
