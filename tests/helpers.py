"""Small builders shared by tests: price records, row counts, the CLI and a strict JSON parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from typer.testing import CliRunner

from spotopt.cli.app import app
from spotopt.db.engine import Database
from spotopt.db.models import InstanceType, Interruption, Market, PricePoint, Run
from spotopt.history.ingest import RunSummary, run_ingest
from spotopt.types import MarketKey, MarketKind, PriceObservation

SPOTOPT = Path(sys.executable).parent / "spotopt"
"""The console script installed beside this interpreter: what a user runs."""


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


def cli(*args: str | Path) -> tuple[int, str, str]:
    """Run ``spotopt ARGS``; (exit code, stdout, stderr)."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def strict_json(text: str) -> Any:
    """``json.loads`` that refuses NaN and Infinity, which Python's json writes by default."""

    def refuse(name: str) -> Any:
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def console(db_url: str, *args: str | Path, columns: int = 200) -> subprocess.CompletedProcess[str]:
    """``spotopt --db DB_URL ARGS`` through the installed console script, as a user runs it, in a
    terminal ``columns`` wide."""
    assert SPOTOPT.exists(), f"{SPOTOPT}: install the package (pip install -e .) into this env"
    return subprocess.run(
        [str(SPOTOPT), "--db", db_url, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": str(columns)},
    )
