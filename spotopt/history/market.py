"""Market snapshot at t: price, availability and preemption rate of every market.

``snapshot(session, at, flt)`` is a pure read of the history (no clock): the what-if engine calls
it with many simulated times. A market is *available* at t when it has a price at t (see
``spotopt.db.queries.prices_at``); its preemption rate is 0 for on-demand and, for spot, the
latest interruption observation at or before t for its instance type and region (a zone's own
row wins over the region's), converted to preemptions per hour:

- AWS Spot Advisor bucket (``advisor-bucket``, stored as the bucket's upper bound in % per
  month: 5, 10, 15, 20, or 100 for ">20%"): "the rate at which Spot has reclaimed capacity
  during the trailing month". We take the bucket's midpoint (2.5, 7.5, 12.5, 17.5 %; 25 % for
  the open ">20%" bucket) as the probability ``p`` that an instance is reclaimed within a month
  (730 h) and assume exponential lifetimes: ``rate = -ln(1 - p) / 730`` per hour.
- Azure eviction rate (``eviction-rate``, upper bound of the 0-5, 5-10, 10-15, 15-20, 20+ %
  bucket): Microsoft documents these as the chance of eviction within the next hour, so
  ``rate = -ln(1 - p)`` per hour with the same midpoints.
- Observed lifetimes (``instance_lifetimes``: spotopt's own instances, or imported ones) refine
  that rate: with ``n`` preemptions over ``E`` instance-hours of exposure up to t (an instance
  still running, or terminated by its owner, counts its hours but no preemption: a censored
  life), the rate is the posterior mean of exponential lifetimes under a Gamma prior centred on
  the cloud's rate with the weight of ``PRIOR_HOURS`` of exposure:
  ``(n + rate_cloud · PRIOR_HOURS) / (E + PRIOR_HOURS)``. With no lifetimes it is the cloud's
  rate; with many it is the observed ``n / E`` (the exponential MLE). Labelled ``observed+…``.
- No observation: a per-cloud default from the thesis' availability study (§6.3, Fig. 6.2):
  GCP preemptible VMs are preempted at least once per 24 h (rate 1/24); AWS spot instances were
  reliably available for longer than GCP's and preempted "on the order of hours" (we assume a
  48 h MTBF); the thesis has no Azure availability data, so Azure gets GCP's 24 h. Labelled
  ``default`` in every output.

Capacity (instances one can hold at once) is not in the history; callers pass it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, func, select
from sqlalchemy.orm import Session

from spotopt.db.models import InstanceType, Interruption
from spotopt.db.queries import MarketFilter, Quote, observed_lifetimes, prices_at

HOURS_PER_MONTH = 730.0
BUCKET_MIDPOINT_PERCENT = ((5.0, 2.5), (10.0, 7.5), (15.0, 12.5), (20.0, 17.5))
OPEN_BUCKET_PERCENT = 25.0
DEFAULT_RATE_PER_HOUR = {"gcp": 1 / 24, "aws": 1 / 48, "azure": 1 / 24}
RATE_KINDS = ("advisor-bucket", "eviction-rate")
PRIOR_HOURS = 48.0
"""Weight of the cloud's own rate, in instance-hours of exposure, against observed lifetimes."""


@dataclass(frozen=True, slots=True)
class MarketState:
    """One market at one time. ``preemptions_per_hour`` is 0 for on-demand."""

    quote: Quote
    preemptions_per_hour: float
    rate_source: str  # on-demand | advisor-bucket | eviction-rate | default, "observed+" with lifetimes
    rate_observed_at: datetime | None

    @property
    def label(self) -> str:
        q = self.quote
        return f"{q.cloud}/{q.zone or q.region}/{q.instance_type}/{q.market}"


def bucket_midpoint(upper_percent: float) -> float:
    for upper, mid in BUCKET_MIDPOINT_PERCENT:
        if upper_percent <= upper:
            return mid
    return OPEN_BUCKET_PERCENT


def rate_per_hour(kind: str, value: float) -> float:
    """Convert an interruption observation to preemptions per hour (see the module docstring)."""
    p = bucket_midpoint(value) / 100.0
    if kind == "advisor-bucket":
        return -math.log1p(-p) / HOURS_PER_MONTH
    if kind == "eviction-rate":
        return -math.log1p(-p)
    raise ValueError(f"no rate conversion for interruption kind {kind!r}")


RateKey = tuple[str, str, str, str]
"""(cloud, instance type, region, zone or "") of an interruption observation."""
RateRow = tuple[str, float, datetime]
"""(kind, value, observed_at) of an interruption observation."""


def latest_interruptions(
    session: Session, at: datetime, clouds: Sequence[str] | None
) -> dict[RateKey, RateRow]:
    """Per key, the latest rate observation at or before ``at`` (across kinds the latest wins,
    ties broken by source): what ``snapshot`` prices with."""
    key = (Interruption.instance_type_id, Interruption.region, Interruption.zone, Interruption.kind)
    latest = (
        select(*key, func.max(Interruption.observed_at).label("at"))
        .where(Interruption.observed_at <= at, Interruption.kind.in_(RATE_KINDS))
        .where(Interruption.value.is_not(None))
        .group_by(*key)
        .subquery()
    )
    stmt = _rate_rows(clouds).join(
        latest,
        and_(
            latest.c.instance_type_id == Interruption.instance_type_id,
            latest.c.region == Interruption.region,
            latest.c.zone == Interruption.zone,
            latest.c.kind == Interruption.kind,
            latest.c.at == Interruption.observed_at,
        ),
    )
    return dict(_keyed(session, stmt))


def interruptions_between(
    session: Session, after: datetime, until: datetime, clouds: Sequence[str] | None
) -> list[tuple[RateKey, RateRow]]:
    """The rate observations with ``after < observed_at <= until``, in the order that makes each
    one the latest of its key when applied in turn to ``latest_interruptions(session, after)``
    (observed time, then source): the what-if engine follows the clouds' rates through a window
    with one read."""
    stmt = _rate_rows(clouds).where(Interruption.observed_at > after, Interruption.observed_at <= until)
    return _keyed(session, stmt)


def _rate_rows(clouds: Sequence[str] | None) -> Select[str, str, str, str, str, float | None, datetime]:
    """Rate observations (``RATE_KINDS`` with a value), oldest first, ties by source: the order
    in which a later one replaces an earlier one of its key."""
    stmt = (
        select(
            InstanceType.cloud,
            InstanceType.name,
            Interruption.region,
            Interruption.zone,
            Interruption.kind,
            Interruption.value,
            Interruption.observed_at,
        )
        .join(InstanceType, InstanceType.id == Interruption.instance_type_id)
        .where(Interruption.kind.in_(RATE_KINDS), Interruption.value.is_not(None))
        .order_by(Interruption.observed_at, Interruption.source)
    )
    return stmt.where(InstanceType.cloud.in_(clouds)) if clouds else stmt


def _keyed(
    session: Session, stmt: Select[str, str, str, str, str, float | None, datetime]
) -> list[tuple[RateKey, RateRow]]:
    return [
        ((cloud, name, region, zone or ""), (kind, float(value), observed))
        for cloud, name, region, zone, kind, value, observed in session.execute(stmt)
        if value is not None  # the query asks for values; the column allows none
    ]


def cloud_state(q: Quote, rates: Mapping[RateKey, RateRow]) -> MarketState:
    """Market ``q`` at the clouds' rates ``rates``: 0 for on-demand; for spot the zone's own
    observation, else the region's, else the cloud's default (see the module docstring)."""
    if q.market != "spot":
        return MarketState(q, 0.0, "on-demand", None)
    hit = rates.get((q.cloud, q.instance_type, q.region, q.zone or "")) or rates.get(
        (q.cloud, q.instance_type, q.region, "")
    )
    if hit is None:
        return MarketState(q, DEFAULT_RATE_PER_HOUR[q.cloud], "default", None)
    kind, value, observed = hit
    return MarketState(q, rate_per_hour(kind, value), kind, observed)


def snapshot(session: Session, at: datetime, flt: MarketFilter | None = None) -> list[MarketState]:
    """Every market with a price at ``at`` (matching ``flt``), with its preemption rate at ``at``:
    the clouds' rate (``cloud_state``) refined by the lives recorded by then (``with_lifetimes``)."""
    flt = flt or MarketFilter()
    rates = latest_interruptions(session, at, flt.clouds)
    states = [cloud_state(q, rates) for q in prices_at(session, at, flt)]
    lives = observed_lifetimes(session, at, [s.quote.market_id for s in states if s.quote.market == "spot"])
    return [with_lifetimes(s, lives.get(s.quote.market_id)) for s in states]


def with_lifetimes(state: MarketState, observed: tuple[int, float] | None) -> MarketState:
    """``state``'s rate refined by ``(preemptions, exposure hours)`` (see the module docstring)."""
    if observed is None:
        return state
    events, hours = observed
    rate = float(refined_rate(state.preemptions_per_hour, events, hours))
    return MarketState(state.quote, rate, f"observed+{state.rate_source}", state.rate_observed_at)


def refined_rate(cloud_rate: Any, events: Any, hours: Any) -> Any:
    """The cloud's rate refined by ``events`` preemptions over ``hours`` of exposure: the Gamma
    posterior mean of the module docstring. Scalars or numpy arrays alike."""
    return (events + cloud_rate * PRIOR_HOURS) / (hours + PRIOR_HOURS)
