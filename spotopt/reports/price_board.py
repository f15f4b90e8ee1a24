"""``price-board``: every market's price at one time for a GPU model, cheapest per GPU-hour first.

The price at T is the last point at or before T (one index seek per market). Markets with no
point at or before T had no price yet and are not listed. Each price says how old it is at T
(``age_days``); one older than the setting ``price_max_age_days`` is ``stale`` and listed after
every fresh one, however cheap: a market that stopped reporting in 2024 is not the cheapest now.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from sqlalchemy import select

from spotopt.db.models import InstanceType, Market, PricePoint
from spotopt.reports import frames, params
from spotopt.reports.base import AnySelect, Args, Report, ReportResult
from spotopt.reports.sql import MARKET_COLUMNS, MARKET_SELECT, filter_markets, raw
from spotopt.settings import Settings

COLUMNS = [*MARKET_COLUMNS, "usd_per_hour", "usd_per_gpu_hour", "since", "age_days", "stale", "source"]
DAY_US = 86_400e6


def statements(args: Args) -> dict[str, AnySelect]:
    latest = (
        select(PricePoint.observed_at)
        .where(PricePoint.market_id == Market.id, PricePoint.observed_at <= args["at"])
        .order_by(PricePoint.observed_at.desc())
        .limit(1)
        .correlate(Market)
        .scalar_subquery()
    )
    stmt = (
        select(
            *MARKET_SELECT,
            PricePoint.usd_per_hour,
            raw(PricePoint.observed_at).label("observed_at"),
            PricePoint.source,
        )
        .select_from(Market)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .join(PricePoint, PricePoint.market_id == Market.id)
        .where(PricePoint.observed_at == latest)
    )
    return {"board": filter_markets(stmt, args)}


def compute(results: dict[str, pd.DataFrame], args: Args) -> ReportResult:
    board = results["board"].copy()
    board["t"] = frames.to_us(board["observed_at"])
    # Two sources at the same instant: the alphabetically first wins (as in db.queries).
    board = board.sort_values(["market_id", "source"], kind="stable").drop_duplicates("market_id")
    count = board["gpu_count"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        board["usd_per_gpu_hour"] = np.where(
            count > 0, board["usd_per_hour"].to_numpy(dtype=float) / count, np.nan
        )
    board["since"] = frames.from_us(board["t"].to_numpy(dtype=np.int64), board.index)
    board["age_days"] = (frames.dt_us(args["at"]) - board["t"].to_numpy(dtype=float)) / DAY_US
    limit = Settings().price_max_age_days
    board["stale"] = board["age_days"] > limit
    board["zone"] = board["zone"].fillna("")
    board = board.sort_values(
        ["stale", "usd_per_gpu_hour", "cloud", "region", "zone", "instance_type", "market"], kind="stable"
    ).reset_index(drop=True)
    stale = int(board["stale"].sum())
    notes = (
        [
            f"{stale} of {len(board)} prices are stale (last observed more than {limit:g} days before "
            f"{args['at']:%Y-%m-%d %H:%M} UTC; the setting price_max_age_days): listed after the fresh ones"
        ]
        if stale
        else []
    )
    return ReportResult(
        {"price-board": board[COLUMNS]},
        args["at"],
        args["at"],
        sorted(pd.unique(board["source"].to_numpy(dtype=object))),
        f"Prices at {args['at']:%Y-%m-%d %H:%M} UTC",
        notes,
    )


REPORT = Report(
    name="price-board",
    summary="every market's price at time T for a GPU model, cheapest per GPU-hour first (stale ones last)",
    params=(params.gpu(required=True), params.at(), params.cloud(), params.region(), params.market("all")),
    statements=statements,
    compute=compute,
)
