"""Small generated capacity traces for the tests (the real ones are for benchmarks, never copied).

``spot_trace`` writes the spot-traces JSON layout; ``availability_csv`` and ``lifetimes_csv`` the
CSV formats of ``spotopt import availability|lifetimes``; ``stored_capacity`` and
``stored_lifetimes`` read back what the history holds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select

from spotopt.db.engine import Database, make_engine
from spotopt.db.models import CapacityObservation, InstanceLifetime, Market

AVAILABILITY_HEADER = "timestamp,cloud,region,zone,instance_type,available"
LIFETIMES_HEADER = "cloud,region,zone,instance_type,instance_id,launched_at,ended_at,end_reason"
TRACE_MARKET = (
    "--cloud",
    "aws",
    "--region",
    "us-west-2",
    "--zone",
    "us-west-2a",
    "--instance-type",
    "p3.2xlarge",
)


def spot_trace(path: Path, gap_seconds: float, data: Sequence[Any], **extra: Any) -> Path:
    """A spot-traces file: ``{"metadata": {"gap_seconds": G}, "data": [...]}`` (plus ``extra`` keys)."""
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap_seconds}, "data": list(data), **extra}))
    return path


def write_csv(path: Path, header: str, rows: Sequence[str]) -> Path:
    path.write_text(header + "\n" + "".join(row + "\n" for row in rows))
    return path


def stored_capacity(history: str | Database) -> list[tuple[str, datetime, str, bool, int | None, int | None]]:
    """(zone, time, source, available, launched, requested) of every capacity observation."""
    db = history if isinstance(history, Database) else Database(make_engine(history))
    try:
        with db.session() as session:
            rows = session.execute(
                select(
                    Market.zone,
                    CapacityObservation.observed_at,
                    CapacityObservation.source,
                    CapacityObservation.available,
                    CapacityObservation.launched,
                    CapacityObservation.requested,
                )
                .join(Market, Market.id == CapacityObservation.market_id)
                .order_by(Market.zone, CapacityObservation.observed_at, CapacityObservation.source)
            )
            return [(z, t, s, bool(a), launched, requested) for z, t, s, a, launched, requested in rows]
    finally:
        if db is not history:
            db.dispose()


def stored_lifetimes(db_url: str) -> list[tuple[str, str, datetime, datetime | None, str | None]]:
    """(zone, instance_ref, started_at, ended_at, end_reason) of every recorded lifetime."""
    db = Database(make_engine(db_url))
    try:
        with db.session() as session:
            rows = session.execute(
                select(
                    Market.zone,
                    InstanceLifetime.instance_ref,
                    InstanceLifetime.started_at,
                    InstanceLifetime.ended_at,
                    InstanceLifetime.end_reason,
                )
                .join(Market, Market.id == InstanceLifetime.market_id)
                .order_by(Market.zone, InstanceLifetime.started_at)
            )
            return [tuple(r) for r in rows]  # type: ignore[misc]
    finally:
        db.dispose()
