"""Read queries over the history (written once in SQLAlchemy Core, identical on SQLite and PostgreSQL).

Price semantics: a price point holds from its ``observed_at`` until the next point of the same
market, so the price at t is the last point at or before t. A market with no point at or before
t has no price at t (it is unavailable then). Capacity observations follow the same step rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, ScalarSelect, Select, and_, func, select, union_all
from sqlalchemy.orm import QueryableAttribute, Session

from spotopt.catalog import CATALOG_SOURCE
from spotopt.db.models import CapacityObservation, InstanceLifetime, InstanceType, Market, PricePoint


@dataclass(frozen=True, slots=True)
class MarketFilter:
    """Which markets a query looks at; None or empty means "all"."""

    clouds: Sequence[str] | None = None
    regions: Sequence[str] | None = None
    zones: Sequence[str] | None = None
    instance_types: Sequence[str] | None = None
    kinds: Sequence[str] | None = None
    gpu: str | None = None
    """A canonical GPU model (``V100-32GB``) or family (``V100``), matched by ``gpu_matches``."""
    include_unknown_gpu: bool = False


@dataclass(frozen=True, slots=True)
class Quote:
    """One market's price at one time. ``usd_per_gpu_hour`` is None when the GPU count is unknown."""

    market_id: int
    cloud: str
    region: str
    zone: str | None
    instance_type: str
    market: str
    gpu: str | None
    gpu_count: float | None
    usd_per_hour: float
    observed_at: datetime
    source: str

    @property
    def usd_per_gpu_hour(self) -> float | None:
        if not self.gpu_count:
            return None
        return self.usd_per_hour / self.gpu_count

    def as_dict(self) -> dict[str, object]:
        return {
            "cloud": self.cloud,
            "region": self.region,
            "zone": self.zone,
            "instance_type": self.instance_type,
            "market": self.market,
            "gpu": self.gpu,
            "gpu_count": self.gpu_count,
            "usd_per_hour": self.usd_per_hour,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "observed_at": self.observed_at,
            "source": self.source,
        }


AnySelect = Select[*tuple[Any, ...]]
_BATCH_ROWS = 10_000

_QUOTE_COLUMNS = (
    Market.id,
    InstanceType.cloud,
    Market.region,
    Market.zone,
    InstanceType.name,
    Market.kind,
    InstanceType.gpu_model,
    InstanceType.gpu_count,
    PricePoint.usd_per_hour,
    PricePoint.observed_at,
    PricePoint.source,
)


def _filtered(stmt: AnySelect, flt: MarketFilter) -> AnySelect:
    if flt.clouds:
        stmt = stmt.where(InstanceType.cloud.in_(flt.clouds))
    if flt.regions:
        stmt = stmt.where(Market.region.in_(flt.regions))
    if flt.zones:
        stmt = stmt.where(Market.zone.in_(flt.zones))
    if flt.instance_types:
        stmt = stmt.where(InstanceType.name.in_(flt.instance_types))
    if flt.kinds:
        stmt = stmt.where(Market.kind.in_(flt.kinds))
    if flt.gpu:
        family = flt.gpu
        stmt = stmt.where(InstanceType.gpu_model.ilike(family) | InstanceType.gpu_model.ilike(f"{family}-%"))
    elif not flt.include_unknown_gpu:
        stmt = stmt.where(InstanceType.gpu_model.is_not(None))
    return stmt


def _iter_quotes(session: Session, stmt: AnySelect) -> Iterator[Quote]:
    """Stream the quotes of ``stmt`` (fetched in batches, so millions of points fit in memory).

    Every query here orders the rows of one (market, instant) next to each other, source by
    name, so of two sources that observed the same instant the first is kept by looking back
    one row only.
    """
    last: tuple[int, datetime] | None = None
    for row in session.execute(stmt.execution_options(yield_per=_BATCH_ROWS)):
        key = (row[0], row[9])
        if key == last:
            continue
        last = key
        yield Quote(
            market_id=row[0],
            cloud=row[1],
            region=row[2],
            zone=row[3] or None,
            instance_type=row[4],
            market=row[5],
            gpu=row[6],
            gpu_count=row[7],
            usd_per_hour=row[8],
            observed_at=row[9],
            source=row[10],
        )


def newest_at_or_before(
    market_id: QueryableAttribute[int], observed_at: QueryableAttribute[datetime], at: datetime
) -> ScalarSelect[datetime]:
    """The time of the newest observation at or before ``at`` of the market of the enclosing
    query's ``markets`` row (a correlated scalar subquery): the row in effect at ``at`` by the
    step rule. One index seek per market on a (market_id, observed_at) key."""
    return (
        select(observed_at)
        .where(market_id == Market.id, observed_at <= at)
        .order_by(observed_at.desc())
        .limit(1)
        .correlate(Market)
        .scalar_subquery()
    )


def prices_at(
    session: Session, at: datetime, flt: MarketFilter = MarketFilter(), max_age: timedelta | None = None
) -> list[Quote]:
    """Every market's price in effect at ``at`` (the last point at or before it).

    One index seek per market on the (market_id, observed_at) primary key, so the cost grows
    with the number of markets, not with the length of the history. ``max_age`` drops markets
    whose last point is older than that (e.g. a retired market that stopped reporting).
    """
    latest = newest_at_or_before(PricePoint.market_id, PricePoint.observed_at, at)
    stmt: AnySelect = (
        select(*_QUOTE_COLUMNS)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .join(PricePoint, and_(PricePoint.market_id == Market.id, PricePoint.observed_at == latest))
        .order_by(Market.id, PricePoint.source)
    )
    stmt = _filtered(stmt, flt)
    if max_age is not None:
        stmt = stmt.where(PricePoint.observed_at >= at - max_age)
    return list(_iter_quotes(session, stmt))


def price_history(
    session: Session,
    flt: MarketFilter = MarketFilter(),
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
) -> list[Quote]:
    """``iter_price_history`` as a list."""
    return list(iter_price_history(session, flt, since, until, limit))


def iter_price_history(
    session: Session,
    flt: MarketFilter = MarketFilter(),
    since: datetime | None = None,
    until: datetime | None = None,
    limit: int | None = None,
) -> Iterator[Quote]:
    """Price points in [since, until], oldest first per market, plus the point in effect at ``since``.

    Including the point in effect at ``since`` makes the answer a complete step function over
    the window: without it a window that starts between two changes would begin with a gap.
    Streamed: ``prices show`` on millions of points holds one batch at a time.
    """
    opening = [] if since is None else [q for q in prices_at(session, since, flt) if q.observed_at < since]
    if limit is not None:
        opening = opening[:limit]
        limit -= len(opening)
    yield from opening
    if limit == 0:
        return
    stmt: AnySelect = (
        select(*_QUOTE_COLUMNS)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .join(PricePoint, PricePoint.market_id == Market.id)
    )
    stmt = _filtered(stmt, flt)
    if until is not None:
        stmt = stmt.where(PricePoint.observed_at <= until)
    if since is not None:
        stmt = stmt.where(PricePoint.observed_at >= since)
    # ``source`` last: of two sources at one instant the first by name wins, as in ``prices_at``.
    stmt = stmt.order_by(
        PricePoint.observed_at, InstanceType.cloud, Market.region, Market.zone, Market.id, PricePoint.source
    )
    if limit is not None:
        stmt = stmt.limit(limit)
    yield from _iter_quotes(session, stmt)


def history_span(session: Session) -> tuple[datetime, datetime] | None:
    """The first and last price point of the history, leaving out the bundled catalog's list
    prices (they are dated when the catalog was compiled, not when anyone observed a market);
    None when nothing else was collected or imported."""
    first, last = session.execute(
        select(func.min(PricePoint.observed_at), func.max(PricePoint.observed_at)).where(
            PricePoint.source != CATALOG_SOURCE
        )
    ).one()
    return None if first is None or last is None else (first, last)


def cheapest(session: Session, at: datetime, flt: MarketFilter, limit: int | None = None) -> list[Quote]:
    """Markets ranked by price per GPU-hour at ``at``, cheapest first (ties broken by name)."""
    quotes = [q for q in prices_at(session, at, flt) if q.usd_per_gpu_hour is not None]
    quotes.sort(
        key=lambda q: (q.usd_per_gpu_hour, q.cloud, q.region, q.zone or "", q.instance_type, q.market)
    )
    return quotes[:limit] if limit else quotes


def preemption_ends(session: Session, since: datetime, until: datetime) -> list[tuple[int, datetime]]:
    """``(market id, ended_at)`` of recorded spot instances preempted in ``[since, until)``.

    Ordered by market, then time: the what-if replay (``--preemptions replay``) places each at
    its tick. Instances still running (``ended_at`` None) or terminated by their owner are not
    preemptions and are left out.
    """
    stmt = (
        select(InstanceLifetime.market_id, InstanceLifetime.ended_at)
        .where(InstanceLifetime.end_reason == "preempted")
        .where(InstanceLifetime.ended_at >= since, InstanceLifetime.ended_at < until)
        .order_by(InstanceLifetime.market_id, InstanceLifetime.ended_at)
    )
    return [(int(m), ended) for m, ended in session.execute(stmt).all() if ended is not None]


def observed_lifetimes(
    session: Session, at: datetime, market_ids: Sequence[int]
) -> dict[int, tuple[int, float]]:
    """Per market: ``(preemptions, exposure hours)`` of the recorded spot instances up to ``at``.

    Exposure counts each instance from its start to its end, or to ``at`` if it ended later or
    still runs (a censored life); a preemption counts only if it happened by ``at``. Nothing after
    ``at`` is read, so a replay learns only what it pretends to know.
    """
    out: dict[int, tuple[int, float]] = {}
    for market_id, started, ended, reason in lifetimes_started_before(session, at, market_ids):
        end = at if ended is None or ended > at else ended
        events, hours = out.get(market_id, (0, 0.0))
        preempted = reason == "preempted" and ended is not None and ended <= at
        out[market_id] = (events + int(preempted), hours + (end - started).total_seconds() / 3600.0)
    return out


def lifetimes_started_before(
    session: Session, until: datetime, market_ids: Sequence[int]
) -> list[tuple[int, datetime, datetime | None, str | None]]:
    """``(market id, started_at, ended_at, end_reason)`` of the recorded spot instances of
    ``market_ids`` started before ``until``: what ``observed_lifetimes`` reads at any time up to
    ``until`` (the what-if engine loads them once for its whole window)."""
    if not market_ids:
        return []
    stmt = (
        select(
            InstanceLifetime.market_id,
            InstanceLifetime.started_at,
            InstanceLifetime.ended_at,
            InstanceLifetime.end_reason,
        )
        .where(InstanceLifetime.market_id.in_(list(market_ids)), InstanceLifetime.started_at < until)
        .order_by(InstanceLifetime.market_id)
    )
    return [(int(m), started, ended, reason) for m, started, ended, reason in session.execute(stmt).all()]


class CapacityRow(NamedTuple):
    """One capacity observation: from ``observed_at`` until the market's next one, one more
    instance of market ``market_id`` could (``available``) or could not be launched;
    ``launched`` of ``requested`` where the source knew them (None: unknown)."""

    market_id: int
    observed_at: datetime
    available: bool
    launched: int | None
    requested: int | None
    source: str


def capacity_history(
    session: Session, market_ids: Sequence[int] | None, since: datetime, until: datetime
) -> list[CapacityRow]:
    """The capacity observations that describe ``market_ids`` (None: every market) over
    ``[since, until)``, ordered by (market, time, source).

    That is, per market, the newest observation at or before ``since`` (the state in effect at
    the start; every source's row at that instant) followed by every observation strictly
    inside the window. A market with no row before ``until`` has no observation: its capacity
    is unknown (a consumer models it, e.g. from prices alone). Of several sources at one
    instant the rows come in source order; a consumer that needs one state per instant keeps
    the first, the rule the price queries and the ``availability`` report follow. One
    primary-key seek per market for the opening row.
    """
    if market_ids is not None and not market_ids:
        return []
    ids = None if market_ids is None else list(market_ids)
    columns = (
        CapacityObservation.market_id,
        CapacityObservation.observed_at,
        CapacityObservation.available,
        CapacityObservation.launched,
        CapacityObservation.requested,
        CapacityObservation.source,
    )
    window = capacity_window(
        columns, since, until, lambda stmt: stmt if ids is None else stmt.where(Market.id.in_(ids))
    ).subquery("capacity")
    stmt = select(*window.c).order_by(window.c.market_id, window.c.observed_at, window.c.source)
    return [
        CapacityRow(int(m), at, bool(available), launched, requested, source)
        for m, at, available, launched, requested, source in session.execute(stmt)
    ]


def capacity_window(
    columns: Sequence[ColumnElement[Any] | QueryableAttribute[Any]],
    since: datetime,
    until: datetime,
    restrict: Callable[[AnySelect], AnySelect],
) -> AnySelect:
    """``columns`` of the capacity observations in effect over ``[since, until)``: per market the
    newest at or before ``since``, then those strictly inside (a union, unordered).

    ``restrict`` narrows the markets of a statement that joins ``markets`` and ``instance_types``
    (the ``availability`` report passes its filters; ``capacity_history`` its ids). Written once
    here for both, so the report and the engine see the same observations.
    """
    opening_time = newest_at_or_before(CapacityObservation.market_id, CapacityObservation.observed_at, since)
    opening = restrict(
        select(*columns)
        .select_from(Market)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .join(
            CapacityObservation,
            and_(CapacityObservation.market_id == Market.id, CapacityObservation.observed_at == opening_time),
        )
    )
    inside = restrict(
        select(*columns)
        .select_from(CapacityObservation)
        .join(Market, Market.id == CapacityObservation.market_id)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .where(CapacityObservation.observed_at > since, CapacityObservation.observed_at < until)
    )
    return select(union_all(opening, inside).subquery("capacity_window"))


def instance_types(session: Session, cloud: str | None = None) -> list[InstanceType]:
    """The catalog as the history holds it (bundled types plus those seen in imports and collections)."""
    stmt = select(InstanceType).order_by(InstanceType.cloud, InstanceType.gpu_model, InstanceType.name)
    if cloud:
        stmt = stmt.where(InstanceType.cloud == cloud)
    return list(session.scalars(stmt))


def unknown_gpu_types(session: Session) -> set[tuple[str, str]]:
    """(cloud, name) of the instance types whose GPU the catalog does not know."""
    stmt = select(InstanceType.cloud, InstanceType.name).where(InstanceType.gpu_model.is_(None))
    return {(cloud, name) for cloud, name in session.execute(stmt)}
