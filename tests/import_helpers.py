"""Helpers for the importer tests: run ``spotopt import`` through the CLI and count what is stored."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from typer.testing import CliRunner, Result

from spotopt.cli.app import app
from spotopt.db.engine import Database, make_engine
from spotopt.db.models import CapacityObservation, InstanceLifetime, InstanceType, Market, PricePoint, Run
from spotopt.db.queries import MarketFilter, Quote, prices_at

EXAMPLES = Path(__file__).resolve().parent.parent / "data" / "examples"


def run_cli(db_url: str, *args: str | Path) -> Result:
    return CliRunner().invoke(app, ["--db", db_url, *(str(a) for a in args)])


def import_json(db_url: str, command: str, *files: Path) -> dict[str, Any]:
    """Import through the CLI with ``--format json``; fail the test with the error if it fails."""
    result = run_cli(db_url, "import", command, *files, "--format", "json")
    assert result.exit_code == 0, result.stderr
    summary: dict[str, Any] = json.loads(result.stdout)
    return summary


def counts(db_url: str) -> dict[str, int]:
    """Row counts of the tables an import writes (runs excluded: failed runs are recorded on purpose)."""
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return {
                model.__tablename__: conn.scalar(select(func.count()).select_from(model)) or 0
                for model in (PricePoint, Market, InstanceType, CapacityObservation, InstanceLifetime)
            }
    finally:
        engine.dispose()


def runs(db_url: str) -> list[tuple[str, str, str | None]]:
    """(source, status, error) of every recorded run, oldest first."""
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(Run.source, Run.status, Run.error).order_by(Run.id))
            return [(r[0], r[1], r[2]) for r in rows]
    finally:
        engine.dispose()


def quotes_at(db_url: str, at: datetime, source: str, **filters: Any) -> list[Quote]:
    """Prices of ``source`` in effect at ``at`` (unknown-GPU types included)."""
    db = Database(make_engine(db_url))
    try:
        with db.session() as session:
            found = prices_at(session, at, MarketFilter(include_unknown_gpu=True, **filters))
        return [q for q in found if q.source == source]
    finally:
        db.dispose()
