"""Small builders shared by tests: price records and row counts."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import func, select

from spotopt.db.engine import Database
from spotopt.db.models import InstanceType, Interruption, Market, PricePoint, Run
from spotopt.ingest import RunSummary, run_ingest
from spotopt.types import MarketKey, MarketKind, PriceObservation


def t(text: str) -> datetime:
    """``t("2024-01-01 06:00")`` → aware UTC datetime."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def price(
    instance_type: str,
    when: str,
    usd: float,
    *,
    cloud: str = "aws",
    region: str = "us-east-1",
    zone: str | None = "us-east-1a",
    kind: MarketKind = MarketKind.SPOT,
) -> PriceObservation:
    return PriceObservation(MarketKey(cloud, region, zone, instance_type, kind), t(when), usd)


def ingest(db: Database, records: list[PriceObservation], source: str = "test") -> RunSummary:
    return run_ingest(db, source, "test", records)


def counts(db: Database) -> dict[str, int]:
    """Row counts of the history tables (to prove a failed command changed nothing)."""
    with db.session() as session:
        return {
            model.__tablename__: session.scalar(select(func.count()).select_from(model)) or 0
            for model in (InstanceType, Market, PricePoint, Interruption)
        } | {"runs_ok": session.scalar(select(func.count()).where(Run.status == "ok")) or 0}
