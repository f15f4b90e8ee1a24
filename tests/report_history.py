"""A small hand-made price history for the report tests; the answers are worked out in the tests.

Times are hours from T0 = 2024-05-01 00:00 UTC; the reports look at [T0, T0 + 48 h). The
bundled catalog's list prices are removed first, so the history holds only these points.

    A   aws us-east-1a  tst.v100.1 (1 GPU) spot       h-1 1.0, h6 0.5 (and 0.9 from source zz), h30 2.0
    B   aws us-east-1b  tst.v100.4 (4 GPUs) spot      h0 3.2
    A2  aws us-west-2a  tst.v100.1 spot               h-5 0.9
    G   gcp us-central1 tst-g-v100-1 (1 GPU) spot     h12 0.7
    OD  aws us-east-1   tst.v100.1 on-demand          h-100 3.0, h36 1.8
    OD4 aws us-east-1   tst.v100.4 on-demand          h-100 12.0
    ODW aws us-west-2   tst.v100.1 on-demand          h-100 3.0
    GOD gcp us-central1 tst-g-v100-1 on-demand        h-100 2.1

Capacity observations: A up at h-2, down h10, up h13 (source import-availability); G down at
h20 (daemon) and up at h20 (import-availability: the daemon, first by name, holds).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, select

from spotopt.db.engine import Database
from spotopt.db.models import InstanceLifetime, Market, PricePoint
from spotopt.history.ingest import run_ingest
from spotopt.types import (
    AvailabilityObservation,
    InstanceTypeSpec,
    InterruptionObservation,
    MarketKey,
    MarketKind,
    PriceObservation,
    Record,
)

T0 = datetime(2024, 5, 1, tzinfo=UTC)
SPOT, OD = MarketKind.SPOT, MarketKind.ON_DEMAND


def h(hours: float) -> datetime:
    return T0 + timedelta(hours=hours)


def iso(hours: float) -> str:
    return h(hours).isoformat()


A = MarketKey("aws", "us-east-1", "us-east-1a", "tst.v100.1", SPOT)
B = MarketKey("aws", "us-east-1", "us-east-1b", "tst.v100.4", SPOT)
A2 = MarketKey("aws", "us-west-2", "us-west-2a", "tst.v100.1", SPOT)
G = MarketKey("gcp", "us-central1", None, "tst-g-v100-1", SPOT)
OD1 = MarketKey("aws", "us-east-1", None, "tst.v100.1", OD)
OD4 = MarketKey("aws", "us-east-1", None, "tst.v100.4", OD)
ODW = MarketKey("aws", "us-west-2", None, "tst.v100.1", OD)
GOD = MarketKey("gcp", "us-central1", None, "tst-g-v100-1", OD)

TYPES = [
    InstanceTypeSpec("aws", "tst.v100.1", "V100-16GB", 1),
    InstanceTypeSpec("aws", "tst.v100.4", "V100-16GB", 4),
    InstanceTypeSpec("gcp", "tst-g-v100-1", "V100-16GB", 1),
]
PRICES = [
    (A, -1, 1.0),
    (A, 6, 0.5),
    (A, 30, 2.0),
    (B, 0, 3.2),
    (A2, -5, 0.9),
    (G, 12, 0.7),
    (OD1, -100, 3.0),
    (OD1, 36, 1.8),
    (OD4, -100, 12.0),
    (ODW, -100, 3.0),
    (GOD, -100, 2.1),
]


def _advisor(hours: float, kind: str, value: float | None) -> InterruptionObservation:
    return InterruptionObservation("aws", "us-east-1", None, "tst.v100.1", h(hours), kind, value, str(value))


def _failing() -> Iterator[Record]:
    yield PriceObservation(A, h(40), 9.9)
    raise RuntimeError("collector lost its connection")


def build(db: Database) -> None:
    with db.session() as session:
        session.execute(delete(PricePoint).where(PricePoint.source == "catalog"))
    run_ingest(db, "test", "hand-made", [*TYPES, *(PriceObservation(m, h(t), p) for m, t, p in PRICES)])
    # A second source saw market A at the same instant; "test" < "zz", so 0.5 holds.
    run_ingest(db, "zz", "hand-made", [PriceObservation(A, h(6), 0.9)])
    run_ingest(
        db,
        "advisor",
        "hand-made",
        [
            _advisor(1, "advisor-bucket", 10.0),
            _advisor(3, "advisor-bucket", 15.0),
            _advisor(7, "preemption", None),
            _advisor(25, "advisor-bucket", 20.0),
        ],
    )
    up = [(A, -2, True), (A, 10, False), (A, 13, True), (G, 20, True)]
    run_ingest(
        db, "import-availability", "hand-made", [AvailabilityObservation(m, h(t), a) for m, t, a in up]
    )
    run_ingest(db, "daemon", "hand-made", [AvailabilityObservation(G, h(20), False, 0, 1)])
    with pytest.raises(RuntimeError, match="lost its connection"):  # recorded as a failed run
        run_ingest(db, "zz", "later", _failing())
    with db.session() as session:
        ids = {
            (m.region, m.zone, m.kind): m.id
            for m in session.scalars(select(Market).where(Market.region.in_(["us-east-1", "us-west-2"])))
        }
        market_a, market_b = (
            ids[("us-east-1", "us-east-1a", "spot")],
            ids[("us-east-1", "us-east-1b", "spot")],
        )
        lifetimes = [
            # (ref, start h, end h or None, reason): on A, 3 preemptions and 3 censored lifetimes.
            (market_a, "i1", 0, 5, "preempted"),
            (market_a, "i2", 0, 10, "terminated"),
            (market_a, "i3", 2, None, None),
            (market_a, "i4", 1, 9, "preempted"),
            (market_a, "i5", 40, 50, "preempted"),  # ends after `until`: censored at 8 h
            (market_a, "i6", 3, 6, "preempted"),
            (market_b, "j1", 10, None, None),
        ]
        for market_id, ref, start, end, reason in lifetimes:
            session.add(
                InstanceLifetime(
                    market_id=market_id,
                    instance_ref=ref,
                    started_at=h(start),
                    ended_at=h(end) if end is not None else None,
                    end_reason=reason,
                    source="test",
                )
            )
