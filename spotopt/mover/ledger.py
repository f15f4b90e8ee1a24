"""The ledger: what each placement of a managed job cost, by its cloud's billing rule.

One row per instance interval (a ``Placement`` from the launch call's return to the terminate
call's return, or to ``now`` while it runs). Its price is the market's price *in effect* over the
interval (the price history is a step function: a point holds until the next one), averaged over
the time it ran, times the instances the job's slot takes; the billed seconds are the cloud's
(``spotopt.mover.billing``: AWS/GCP per second with a 60 s minimum, AWS spot interrupted in its
first hour free, Azure whole minutes). A placement run by the ``local`` provider is priced as the
market it stands for, so a trial on one machine reports what the cloud would have billed.

This is the one cost function of the mover: the budget checks of the executor, ``jobs show``
and ``jobs cost`` all read ``intervals``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotopt.db.models import InstanceType, Market, Placement, PricePoint
from spotopt.mover.billing import billed_seconds
from spotopt.providers.base import market_label
from spotopt.types import MarketKey, MarketKind


@dataclass(frozen=True, slots=True)
class Interval:
    """One billed instance interval of a job."""

    placement_id: int
    epoch: int
    provider: str
    instance_id: str | None
    market: str
    """``cloud/region/zone/instance type/kind`` (``spotopt.providers.base.market_label``)."""
    cloud: str
    started_at: datetime
    ended_at: datetime | None
    """None: still running (billed up to the ledger's ``now``)."""
    end_reason: str | None
    usd_per_hour: float
    """The job slot's price in effect, averaged over the interval."""
    billed_s: float
    cost_usd: float


def market_key(session: Session, market_id: int) -> MarketKey:
    """The market of ``market_id`` as the providers name it."""
    market, itype = session.execute(
        select(Market, InstanceType)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .where(Market.id == market_id)
    ).one()
    return MarketKey(itype.cloud, market.region, market.zone or None, itype.name, MarketKind(market.kind))


def price_in_effect(
    session: Session, market_id: int, start: datetime, end: datetime, fallback: float
) -> float:
    """The time-weighted mean price of ``market_id`` over ``[start, end]`` (``fallback`` where the
    history has no point yet, e.g. a market priced only at launch).

    Two sources reporting the same instant are ordered by source name (the last one holds), so
    SQLite and PostgreSQL agree on which one is in effect.
    """
    before = session.scalar(
        select(PricePoint.usd_per_hour)
        .where(PricePoint.market_id == market_id, PricePoint.observed_at <= start)
        .order_by(PricePoint.observed_at.desc(), PricePoint.source.desc())
        .limit(1)
    )
    if end <= start:
        return float(before) if before is not None else fallback
    changes = session.execute(
        select(PricePoint.observed_at, PricePoint.usd_per_hour)
        .where(
            PricePoint.market_id == market_id,
            PricePoint.observed_at > start,
            PricePoint.observed_at < end,
        )
        .order_by(PricePoint.observed_at, PricePoint.source)
    ).all()
    price = float(before) if before is not None else fallback
    total, at = 0.0, start
    for when, usd in changes:
        total += price * (when - at).total_seconds()
        price, at = float(usd), when
    total += price * (end - at).total_seconds()
    return total / (end - start).total_seconds()


def slot_usd_per_hour(session: Session, p: Placement, start: datetime, end: datetime) -> float:
    """The job slot's price of placement ``p`` in effect over ``[start, end]``: its market's
    price times the instances the slot takes (the price at launch where the history has none)."""
    launch_price = p.usd_per_hour / p.instances if p.instances else 0.0
    return p.instances * price_in_effect(session, p.market_id, start, end, launch_price)


def intervals(session: Session, job_id: int, now: datetime) -> list[Interval]:
    """Every instance interval of the job that ran (launched and returned), oldest first."""
    placements = session.scalars(
        select(Placement)
        .where(Placement.job_id == job_id, Placement.started_at.is_not(None))
        .order_by(Placement.started_at, Placement.id)
    ).all()
    return [interval(session, p, now) for p in placements]


def interval(session: Session, p: Placement, now: datetime) -> Interval:
    """The ledger row of one placement (``now`` ends it while it runs)."""
    assert p.started_at is not None
    market = market_key(session, p.market_id)
    end = p.ended_at or max(now, p.started_at)
    slot_usd = slot_usd_per_hour(session, p, p.started_at, end)
    # Only a spot instance can be reclaimed by its cloud (AWS's first-hour refund is a Spot rule);
    # an on-demand placement that vanished is billed like one we ended.
    reclaimed = p.end_reason == "preempted" and market.kind is MarketKind.SPOT
    seconds = billed_seconds(market.cloud, p.started_at, end, interrupted_by_cloud=reclaimed)
    return Interval(
        placement_id=p.id,
        epoch=p.epoch,
        provider=p.provider,
        instance_id=p.instance_id,
        market=market_label(market),
        cloud=market.cloud,
        started_at=p.started_at,
        ended_at=p.ended_at,
        end_reason=p.end_reason,
        usd_per_hour=slot_usd,
        billed_s=seconds,
        cost_usd=slot_usd * seconds / 3600.0,
    )


def total_usd(rows: Sequence[Interval]) -> float:
    """The ledger's total: what every interval of the job cost, across moves."""
    return sum((r.cost_usd for r in rows), 0.0)


def spent_usd(session: Session, job_id: int, now: datetime) -> float:
    """What the job has cost so far, running instances billed up to ``now``."""
    return total_usd(intervals(session, job_id, now))
