"""Typed records that flow from collectors and importers into ``ingest``.

Units live in field names (``usd_per_hour``, ``gpu_memory_gib``); every datetime is
timezone-aware UTC (``utc()`` converts and rejects naive values).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum


class MarketKind(StrEnum):
    SPOT = "spot"
    ON_DEMAND = "on-demand"


def utc(value: datetime) -> datetime:
    """Return ``value`` in UTC; a naive datetime is a bug upstream, so refuse it."""
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value.isoformat()} (spotopt needs a time zone; use UTC)")
    return value.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class InstanceTypeSpec:
    """One instance type of one cloud. ``gpu_model`` is canonical (``V100-16GB``) or None if unknown."""

    cloud: str
    name: str
    gpu_model: str | None
    gpu_count: float | None
    gpu_memory_gib: float | None = None
    vcpus: int | None = None
    memory_gib: float | None = None
    retired: bool = False
    gpu_name_raw: str | None = None
    """The GPU name as the cloud reported it, kept verbatim when it maps to no canonical name."""


@dataclass(frozen=True, slots=True)
class MarketKey:
    """A market: where and how capacity is bought. ``zone`` is None for region-wide prices."""

    cloud: str
    region: str
    zone: str | None
    instance_type: str
    kind: MarketKind


@dataclass(frozen=True, slots=True)
class PriceObservation:
    """``usd_per_hour`` holds from ``observed_at`` until the market's next observation."""

    market: MarketKey
    observed_at: datetime
    usd_per_hour: float


@dataclass(frozen=True, slots=True)
class InterruptionObservation:
    """Interruption data for spot capacity of an instance type in a region (and maybe a zone).

    ``kind`` says what was measured: ``advisor-bucket`` (AWS Spot Advisor, value = upper bound
    of the bucket in percent per month), ``placement-score`` (1–10), ``eviction-rate`` (Azure,
    value = upper bound in percent), ``preemption`` (one observed preemption). ``raw`` keeps the
    text the source printed so nothing is lost in translation.
    """

    cloud: str
    region: str
    zone: str | None
    instance_type: str
    observed_at: datetime
    kind: str
    value: float | None
    raw: str


@dataclass(frozen=True, slots=True)
class AvailabilityObservation:
    """Whether a spot market had capacity at ``observed_at``; holds until its next observation.

    ``available``: one more instance of the market could be launched. ``launched`` of
    ``requested``: how many instances a request got, where the source knows (None: unknown).
    """

    market: MarketKey
    observed_at: datetime
    available: bool
    launched: int | None = None
    requested: int | None = None


LIFETIME_ENDS = ("preempted", "terminated")
"""How a recorded spot instance ended: the cloud took it, or its owner ended it (a censored
life); None (no end) while it still runs."""


@dataclass(frozen=True, slots=True)
class LifetimeObservation:
    """The life of one spot instance: launched at ``started_at``, ended at ``ended_at`` (None: it
    still runs) for ``end_reason`` (``LIFETIME_ENDS``; None exactly when ``ended_at`` is None)."""

    market: MarketKey
    instance_ref: str
    started_at: datetime
    ended_at: datetime | None
    end_reason: str | None


@dataclass(frozen=True, slots=True)
class Rejection:
    """A record the source delivered but spotopt does not import, and why (counted, not fatal)."""

    where: str
    reason: str


MarketRecord = PriceObservation | AvailabilityObservation | LifetimeObservation
"""The records that name a market (their instance type may be new to the catalog)."""
Record = (
    InstanceTypeSpec
    | PriceObservation
    | InterruptionObservation
    | AvailabilityObservation
    | LifetimeObservation
    | Rejection
)
