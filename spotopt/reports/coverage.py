"""``coverage``: what the history holds and where it has holes.

Sections: ``markets`` (per market: first and last point before ``until`` in the whole history,
hours since the last point at ``until``; and inside the window [since, until), default the last
7 days like every report: points, gaps longer than ``gap_hours``, the longest gap), ``gaps`` (each such gap)
and ``runs`` (the last run of every source: when, what it wrote and its status, so a collector
that stopped or failed shows up here). A gap is the time between two consecutive points of a
market; a long one means nobody looked (AWS writes a point only when the price changes, so
"no point for 24 h" is normal there; pick ``gap_hours`` accordingly).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import func, select

from spotopt.db.models import InstanceType, Market, PricePoint, Run
from spotopt.reports import frames, params
from spotopt.reports.base import AnySelect, Args, Param, Report, ReportResult
from spotopt.reports.sql import MARKET_COLUMNS, MARKET_SELECT, filter_markets, raw

MARKETS_COLUMNS = [
    *MARKET_COLUMNS,
    "points",
    "first_observed",
    "last_observed",
    "gaps",
    "longest_gap_hours",
    "hours_since_last",
]
GAP_COLUMNS = [*MARKET_COLUMNS, "gap_from", "gap_to", "gap_hours"]
RUN_COLUMNS = [
    "source",
    "scope",
    "status",
    "started_at",
    "finished_at",
    "inserted",
    "duplicate",
    "rejected",
    "error",
]


def _joined(*columns: Any) -> AnySelect:
    return (
        select(*columns)
        .join(Market, Market.id == PricePoint.market_id)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
    )


def _in_window(stmt: AnySelect, args: Args) -> AnySelect:
    return stmt.where(PricePoint.observed_at >= args["since"], PricePoint.observed_at < args["until"])


def _first_or_last(agg: Any, until: Any) -> Any:
    """The market's first/last point before ``until``: one primary-key seek per market."""
    return raw(
        select(agg(PricePoint.observed_at))
        .where(PricePoint.market_id == Market.id, PricePoint.observed_at < until)
        .correlate(Market)
        .scalar_subquery()
    )


def statements(args: Args) -> dict[str, AnySelect]:
    markets = filter_markets(
        select(
            *MARKET_SELECT,
            _first_or_last(func.min, args["until"]).label("first_observed"),
            _first_or_last(func.max, args["until"]).label("last_observed"),
        ).join(InstanceType, InstanceType.id == Market.instance_type_id),
        args,
    )
    # Every point of the window in (market, time) order; SQLite reads it from the primary-key
    # index alone. Gaps are consecutive differences, cheaper in numpy than a SQL window function.
    stamps = filter_markets(
        _in_window(_joined(PricePoint.market_id, raw(PricePoint.observed_at).label("observed_at")), args),
        args,
    ).order_by(PricePoint.market_id, PricePoint.observed_at)
    last_start = select(Run.source, func.max(Run.started_at).label("started")).group_by(Run.source).subquery()
    runs = select(
        Run.id,
        Run.source,
        Run.scope,
        Run.status,
        raw(Run.started_at).label("started_at"),
        raw(Run.finished_at).label("finished_at"),
        Run.inserted,
        Run.duplicate,
        Run.rejected,
        Run.error,
    ).join(last_start, (last_start.c.source == Run.source) & (last_start.c.started == Run.started_at))
    return {"markets": markets, "points": stamps, "runs": runs}


def _times(column: pd.Series) -> pd.Series:
    """Driver times (None allowed) -> tz-aware UTC timestamps at µs resolution."""
    return pd.to_datetime(column, utc=True, format="ISO8601").dt.as_unit("us")


def compute(results: dict[str, pd.DataFrame], args: Args) -> ReportResult:
    until_us = frames.dt_us(args["until"])
    min_gap_us = round(args["gap_hours"] * frames.US_PER_HOUR)
    markets = results["markets"].assign(zone=lambda f: f["zone"].fillna("")).set_index("market_id")
    stamps = results["points"]
    mid = stamps["market_id"].to_numpy(dtype=np.int64)
    t = frames.to_us(stamps["observed_at"])
    step = (mid[1:] == mid[:-1]) & ((t[1:] - t[:-1]) > min_gap_us)
    gaps = pd.DataFrame({"market_id": mid[1:][step], "from_us": t[:-1][step], "to_us": t[1:][step]})
    gaps["gap_hours"] = (gaps["to_us"] - gaps["from_us"]) / frames.US_PER_HOUR
    gaps = gaps.merge(markets.reset_index(), on="market_id", how="inner")
    gaps["gap_from"] = frames.from_us(gaps["from_us"].to_numpy(), gaps.index)
    gaps["gap_to"] = frames.from_us(gaps["to_us"].to_numpy(), gaps.index)

    table = markets[markets["first_observed"].notna()].copy()
    table["points"] = pd.Series(mid).value_counts().reindex(table.index).fillna(0).astype(np.int64)
    table["hours_since_last"] = (until_us - frames.to_us(table["last_observed"])) / frames.US_PER_HOUR
    table["first_observed"] = _times(table["first_observed"])
    table["last_observed"] = _times(table["last_observed"])
    per_market = gaps.groupby("market_id")["gap_hours"]
    table["gaps"] = per_market.size().reindex(table.index).fillna(0).astype(np.int64)
    table["longest_gap_hours"] = per_market.max().reindex(table.index)
    table = table.reset_index().sort_values("market_id", kind="stable")

    runs = results["runs"].sort_values(["source", "id"], kind="stable").drop_duplicates("source", keep="last")
    runs = runs.assign(started_at=_times(runs["started_at"]), finished_at=_times(runs["finished_at"]))
    sections = {
        "markets": table[MARKETS_COLUMNS].reset_index(drop=True),
        "gaps": gaps[GAP_COLUMNS].reset_index(drop=True),
        "runs": runs[RUN_COLUMNS].reset_index(drop=True),
    }
    return ReportResult(
        sections, args.get("since"), args["until"], sorted(runs["source"]), "Coverage of the history"
    )


REPORT = Report(
    name="coverage",
    summary="markets, time range, gaps longer than gap_hours per market, last run per source and status",
    params=(
        params.gpu(),
        params.cloud(),
        params.region(),
        params.market("all"),
        Param(
            "since",
            "window start: ISO 8601, 'now' or an offset like -30d; default 7 days before until",
            params.time,
        ),
        params.until(),
        params.positive_float(
            "gap_hours", "report gaps between consecutive points longer than this", "24", most=24 * 366 * 100
        ),
    ),
    statements=statements,
    compute=compute,
    resolve=params.window,
)
