"""The Core building blocks the reports share: market filters, the catalog of markets, price windows.

Every statement here is dialect-neutral SQLAlchemy Core, so SQLite and PostgreSQL run the same
query. Time bucketing is deliberately *not* done in SQL: SQLite stores UTC times as naive text
and PostgreSQL as ``timestamptz``, so the reports fetch narrow rows (market id, time, price) and
bucket them in pandas, where both databases' values become the same int64 microseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, select, type_coerce, union_all
from sqlalchemy.orm import QueryableAttribute
from sqlalchemy.sql.sqltypes import NullType

from spotopt.db.models import InstanceType, Market, PricePoint
from spotopt.db.queries import newest_at_or_before
from spotopt.reports.base import AnySelect

MARKET_COLUMNS = ("cloud", "region", "zone", "instance_type", "market", "gpu_model", "gpu_count")


def raw(column: ColumnElement[Any] | QueryableAttribute[Any]) -> ColumnElement[Any]:
    """The column as the driver returns it (text on SQLite, datetime on PostgreSQL).

    Skips SQLAlchemy's per-row datetime parsing, which costs more than the query itself on a
    few hundred thousand rows; ``frames.to_us`` converts the whole column at once instead.
    """
    return type_coerce(column, NullType())


def filter_markets(stmt: AnySelect, args: Mapping[str, Any], *, unknown_gpu: bool = False) -> AnySelect:
    """Apply the shared market parameters (gpu, cloud, region, zone, market) to a statement that joins
    ``markets`` and ``instance_types``. Markets of unknown GPU appear in price reports only with
    ``unknown_gpu`` (they have no $/GPU-hour), and never when a ``gpu`` is asked for."""
    gpu = args.get("gpu")
    if gpu:
        stmt = stmt.where((InstanceType.gpu_model == gpu) | InstanceType.gpu_model.like(f"{gpu}-%"))
    elif not unknown_gpu:
        stmt = stmt.where(InstanceType.gpu_model.is_not(None))
    if args.get("cloud"):
        stmt = stmt.where(InstanceType.cloud == args["cloud"])
    if args.get("region"):
        stmt = stmt.where(Market.region == args["region"])
    if args.get("zone"):
        stmt = stmt.where(Market.zone == args["zone"])
    if args.get("market"):
        stmt = stmt.where(Market.kind == args["market"])
    return stmt


MARKET_SELECT = (
    Market.id.label("market_id"),
    InstanceType.cloud,
    Market.region,
    Market.zone,
    InstanceType.name.label("instance_type"),
    Market.kind.label("market"),
    InstanceType.gpu_model,
    InstanceType.gpu_count,
)
"""What every report says about a market (select from ``markets`` joined with ``instance_types``)."""


def markets_stmt(args: Mapping[str, Any], *, with_on_demand: bool = False) -> AnySelect:
    """The filtered markets with their catalog facts (one row per market).

    ``with_on_demand`` keeps the on-demand markets of the same instance types and regions even
    when ``market=spot`` is asked for, because spot-vs-on-demand comparisons need them.
    """
    stmt = (
        select(*MARKET_SELECT, Market.instance_type_id)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .order_by(Market.id)
    )
    if with_on_demand and args.get("market") == "spot":
        return filter_markets(stmt, {**args, "market": None})
    return filter_markets(stmt, args)


def points_stmt(args: Mapping[str, Any], *, with_on_demand: bool = False) -> AnySelect:
    """Price points that describe the filtered markets over [since, until).

    That is every point strictly inside the window plus, per market, the point in effect at
    ``since`` (the last one at or before it), so the step function is complete from ``since``
    on. The opening point is found with one index seek per market on the primary key.
    ``since`` None means "from the first point".
    """
    since, until = args.get("since"), args["until"]
    market_args = {**args, "market": None} if with_on_demand and args.get("market") == "spot" else args
    columns = (
        PricePoint.market_id,
        raw(PricePoint.observed_at).label("observed_at"),
        PricePoint.usd_per_hour,
        PricePoint.source,
    )
    inside = filter_markets(
        select(*columns)
        .join(Market, Market.id == PricePoint.market_id)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .where(PricePoint.observed_at < until),
        market_args,
    )
    if since is None:
        return inside
    inside = inside.where(PricePoint.observed_at > since)
    opening_time = newest_at_or_before(PricePoint.market_id, PricePoint.observed_at, since)
    opening = filter_markets(
        select(*columns)
        .select_from(Market)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .join(PricePoint, PricePoint.market_id == Market.id)
        .where(PricePoint.observed_at == opening_time),
        market_args,
    )
    return select(union_all(opening, inside).subquery("points"))
