"""SQLite and PostgreSQL give identical answers to every history query on the same data."""

from __future__ import annotations

import random

from spotopt.db.engine import Database
from spotopt.db.queries import MarketFilter, cheapest, price_history, prices_at
from spotopt.history.setup import open_history
from spotopt.types import MarketKind
from tests.helpers import ingest, price, t

TYPES = ["p3.2xlarge", "p3.8xlarge", "g4dn.xlarge", "g5.xlarge", "p4d.24xlarge", "unknown.gpu9"]


def _history(seed: int) -> list:  # type: ignore[type-arg]
    rng = random.Random(seed)
    records = []
    for instance_type in TYPES:
        for zone in ("us-east-1a", "us-east-1b"):
            for _ in range(rng.randint(3, 25)):
                when = (
                    f"2024-01-{rng.randint(1, 28):02d} {rng.randint(0, 23):02d}:{rng.choice([0, 15, 30]):02d}"
                )
                records.append(price(instance_type, when, round(rng.uniform(0.1, 30), 4), zone=zone))
        records.append(price(instance_type, "2024-01-01 00:00", 40.0, zone=None, kind=MarketKind.ON_DEMAND))
    return records


def _answers(db: Database) -> list[list[dict[str, object]]]:
    with db.session() as session:
        answers = []
        for when in ("2024-01-05 00:00", "2024-01-15 12:00", "2024-02-01 00:00"):
            answers.append([q.as_dict() for q in prices_at(session, t(when), MarketFilter())])
            answers.append([q.as_dict() for q in cheapest(session, t(when), MarketFilter(gpu="v100"), 5)])
        flt = MarketFilter(include_unknown_gpu=True, kinds=["spot"])
        answers.append([q.as_dict() for q in price_history(session, flt, since=t("2024-01-10 00:00"))])
        return answers


def test_sqlite_and_postgresql_agree(sqlite_db: Database, pg_url: str) -> None:
    pg = open_history(pg_url)
    records = _history(7)
    for db in (sqlite_db, pg):
        ingest(db, records)
    sqlite_answers, pg_answers = _answers(sqlite_db), _answers(pg)
    pg.dispose()
    assert all(sqlite_answers)
    assert sqlite_answers == pg_answers
