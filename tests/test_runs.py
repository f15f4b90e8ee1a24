"""Imports and collector runs are recorded by one mechanism: the same counts, conflicts and
rejection reasons with examples end up in ``runs``, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any, ClassVar

import pytest
from sqlalchemy import select

import spotopt.history.collect
from spotopt.collectors.base import Collector
from spotopt.db.engine import Database
from spotopt.db.models import Run
from spotopt.history.collect import CollectRequest, run_collect
from spotopt.history.ingest import run_ingest
from spotopt.types import Record, Rejection
from tests.helpers import price, t

# One stored point, then: the same key with another price (a conflict), a new point, a rejection.
FIRST = [price("p3.2xlarge", "2024-01-01 00:00", 1.0)]
SECOND: list[Record] = [
    price("p3.2xlarge", "2024-01-01 00:00", 2.0),
    price("p3.2xlarge", "2024-01-01 01:00", 1.5),
    Rejection("item 7", "malformed item"),
]
EXPECTED_REJECTIONS = {"reasons": {"malformed item": 1}, "examples": ["item 7: malformed item"]}


class _Scripted(Collector):
    """A global-scope collector that yields ``SECOND`` (stands in for any cloud's collector)."""

    name: ClassVar[str] = "scripted"
    cloud: ClassVar[str] = "aws"
    collects: ClassVar[str] = "scripted prices"
    needs: ClassVar[str] = "nothing"
    global_scope: ClassVar[bool] = True

    def collect(self, since: datetime | None) -> Iterator[Record]:
        yield from SECOND


def _last_run(db: Database, source: str) -> dict[str, Any]:
    with db.session() as session:
        run = session.scalars(select(Run).where(Run.source == source).order_by(Run.id.desc())).first()
        assert run is not None
        return {
            "status": run.status,
            "inserted": run.inserted,
            "duplicate": run.duplicate,
            "conflicting": run.conflicting,
            "rejected": run.rejected,
            "rejections": json.loads(run.rejections or "null"),
        }


def test_a_collector_run_records_conflicts_and_rejection_examples_like_an_import(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    for source in ("import", "scripted"):  # a point is keyed by its source: seed both alike
        run_ingest(db, source, "seed", FIRST)
    run_ingest(db, "import", "test", SECOND)
    monkeypatch.setattr(spotopt.history.collect, "for_cloud", lambda cloud: [_Scripted])
    [result] = run_collect(
        db, CollectRequest(clouds=("aws",)), lambda cloud: object(), now=t("2024-02-01 00:00")
    )

    collected = _last_run(db, "scripted")
    assert collected == _last_run(db, "import") | {"rejections": EXPECTED_REJECTIONS}
    assert collected == {
        "status": "ok",
        "inserted": 1,
        "duplicate": 0,
        "conflicting": 1,
        "rejected": 1,
        "rejections": EXPECTED_REJECTIONS,
    }
    assert "conflicting with stored observations: 1 (the stored ones are kept)" in result.note


def test_a_failed_collector_scope_keeps_its_rejections_and_writes_nothing(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    class _Broken(_Scripted):
        def collect(self, since: datetime | None) -> Iterator[Record]:
            yield Rejection("item 1", "malformed item")
            raise RuntimeError("the API went away")

    monkeypatch.setattr(spotopt.history.collect, "for_cloud", lambda cloud: [_Broken])
    [result] = run_collect(db, CollectRequest(clouds=("aws",)), lambda cloud: object())
    assert result.status == "failed"
    recorded = _last_run(db, "scripted")
    assert recorded["status"] == "failed" and recorded["inserted"] == recorded["conflicting"] == 0
