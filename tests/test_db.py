"""Schema through migrations, auto-migration under a lock, catalog sync, price-at-t semantics."""

from __future__ import annotations

import multiprocessing
from datetime import timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import create_engine, func, select, text

from spotopt.catalog import instance_types, list_prices
from spotopt.db import migrate
from spotopt.db.engine import Database, make_engine, normalise_url
from spotopt.db.models import InstanceType, Market, PricePoint, Run
from spotopt.db.queries import MarketFilter, cheapest, price_history, prices_at
from spotopt.errors import ConfigError
from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history
from spotopt.types import MarketKind
from tests.helpers import counts, ingest, price, t


def test_models_and_migrations_agree(db: Database) -> None:
    command.check(migrate.alembic_config(db.engine))  # raises if autogenerate finds a difference


def test_downgrade_to_base_and_back(db_url: str) -> None:
    engine = make_engine(db_url)
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    assert migrate.upgrade(engine) is True
    assert migrate.is_current(engine)
    engine.dispose()


def test_catalog_synced_once(db: Database) -> None:
    with db.session() as session:
        n_types = session.scalar(select(func.count()).select_from(InstanceType))
        n_prices = session.scalar(
            select(func.count()).select_from(PricePoint).where(PricePoint.source == "catalog")
        )
    assert n_types == len(instance_types())
    assert n_prices == len(list_prices())
    before = counts(db)
    db.dispose()
    open_history(str(db.engine.url.render_as_string(hide_password=False))).dispose()
    assert counts(db) == before


def _open(url: str) -> str:
    database = open_history(url)
    with database.session() as session:
        n = session.scalar(select(func.count()).select_from(InstanceType))
    database.dispose()
    return str(n)


def test_sqlite_default_migrates_itself_under_a_lock(tmp_path: Path) -> None:
    (tmp_path / "new").mkdir()
    url = f"sqlite:///{tmp_path / 'new' / 'fresh.sqlite'}"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        results = pool.map(_open, [url] * 3)
    assert len(set(results)) == 1 and int(results[0]) == len(instance_types())
    assert migrate.is_current(make_engine(url))


def test_postgres_is_not_migrated_behind_the_operator(pg_server) -> None:  # type: ignore[no-untyped-def]
    with create_engine(pg_server.url(), isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text("CREATE DATABASE unmigrated"))
    with pytest.raises(ConfigError, match="spotopt db upgrade"):
        open_history(pg_server.url("unmigrated"))


def test_urls_are_normalised_and_checked() -> None:
    assert normalise_url("postgresql://u@h/db").startswith("postgresql+psycopg://")
    assert normalise_url("postgres://u@h/db").startswith("postgresql+psycopg://")
    with pytest.raises(ConfigError, match="not supported"):
        normalise_url("mysql://u@h/db")
    with pytest.raises(ConfigError, match="not a URL"):
        normalise_url("not a url")


def test_price_at_t_is_last_point_at_or_before_t(db: Database) -> None:
    ingest(db, [price("p3.2xlarge", "2024-01-01 00:00", 1.0), price("p3.2xlarge", "2024-01-01 06:00", 2.0)])
    with db.session() as session:

        def at(when: str) -> list[float]:
            flt = MarketFilter(instance_types=["p3.2xlarge"], kinds=["spot"])
            return [q.usd_per_hour for q in prices_at(session, t(when), flt)]

        assert at("2023-12-31 23:59") == []  # before the first point: no price, unavailable
        assert at("2024-01-01 00:00") == [1.0]
        assert at("2024-01-01 05:59") == [1.0]
        assert at("2024-01-01 06:00") == [2.0]
        assert at("2025-01-01 00:00") == [2.0]
        flt = MarketFilter(instance_types=["p3.2xlarge"], kinds=["spot"])
        assert prices_at(session, t("2024-02-01 00:00"), flt, max_age=timedelta(days=7)) == []


def test_history_window_opens_with_the_price_in_effect(db: Database) -> None:
    ingest(db, [price("g4dn.xlarge", f"2024-01-0{d} 00:00", 0.1 * d) for d in range(1, 6)])
    with db.session() as session:
        flt = MarketFilter(instance_types=["g4dn.xlarge"], kinds=["spot"])
        window = price_history(session, flt, since=t("2024-01-02 12:00"), until=t("2024-01-04 00:00"))
    assert [q.usd_per_hour for q in window] == pytest.approx([0.2, 0.3, 0.4])
    assert window[0].observed_at == t("2024-01-02 00:00")


def test_cheapest_ranks_per_gpu_hour(db: Database) -> None:
    # p3.8xlarge has 4 V100s: 4.0 $/h is 1.0 $/GPU-h, cheaper than p3.2xlarge's 1.5.
    ingest(
        db,
        [
            price("p3.2xlarge", "2024-01-01 00:00", 1.5),
            price("p3.8xlarge", "2024-01-01 00:00", 4.0),
            price("g4dn.xlarge", "2024-01-01 00:00", 0.2),
        ],
    )
    with db.session() as session:
        flt = MarketFilter(gpu="V100", kinds=["spot"])
        ranked = cheapest(session, t("2024-01-02 00:00"), flt)
    assert [q.instance_type for q in ranked] == ["p3.8xlarge", "p3.2xlarge"]
    assert ranked[0].usd_per_gpu_hour == pytest.approx(1.0)
    assert ranked[0].gpu == "V100-16GB"


def test_ingest_is_idempotent_and_recorded(db: Database) -> None:
    records = [price("p3.2xlarge", f"2024-01-01 0{h}:00", 1.0 + h) for h in range(5)]
    first = ingest(db, records)
    second = ingest(db, records)
    assert (first.stats.inserted, first.stats.duplicate) == (5, 0)
    assert (second.stats.inserted, second.stats.duplicate) == (0, 5)
    with db.session() as session:
        runs = session.scalars(select(Run).where(Run.source == "test").order_by(Run.id)).all()
    assert [(r.status, r.inserted, r.duplicate) for r in runs] == [("ok", 5, 0), ("ok", 0, 5)]
    assert all(r.finished_at is not None and r.finished_at >= r.started_at for r in runs)


def test_unknown_instance_type_is_kept_and_reported(db: Database) -> None:
    summary = ingest(db, [price("x9.mystery", "2024-01-01 00:00", 3.0)])
    assert summary.stats.unknown_types == {("aws", "x9.mystery")}
    with db.session() as session:
        row = session.scalar(select(InstanceType).where(InstanceType.name == "x9.mystery"))
        assert row is not None and row.gpu_model is None and row.origin == "test"
        flt = MarketFilter(instance_types=["x9.mystery"], include_unknown_gpu=True)
        assert [q.usd_per_hour for q in price_history(session, flt)] == [3.0]


def test_failed_ingest_changes_nothing_and_records_the_failure(db: Database) -> None:
    before = counts(db)

    def records():  # type: ignore[no-untyped-def]
        yield price("p3.2xlarge", "2024-01-01 00:00", 1.0)
        yield price("brand.new", "2024-01-01 00:00", 1.0)
        raise ValueError("boom in the middle")

    with pytest.raises(ValueError, match="boom"):
        run_ingest(db, "test", "scope", records())
    assert counts(db) == before
    with db.session() as session:
        run = session.scalar(select(Run).where(Run.source == "test"))
    assert run is not None and run.status == "failed" and "boom" in (run.error or "")


def test_same_instant_from_two_sources_is_one_quote(db: Database) -> None:
    ingest(db, [price("p3.2xlarge", "2024-01-01 00:00", 1.0)], source="a")
    ingest(db, [price("p3.2xlarge", "2024-01-01 00:00", 1.1)], source="b")
    with db.session() as session:
        quotes = prices_at(session, t("2024-01-02 00:00"), MarketFilter(instance_types=["p3.2xlarge"]))
        assert session.scalar(select(func.count()).select_from(Market).where(Market.kind == "spot")) == 1
    assert [(q.source, q.usd_per_hour) for q in quotes if q.market == MarketKind.SPOT] == [("a", 1.0)]


def test_database_from_a_newer_spotopt_is_refused_clearly(db_url: str) -> None:
    engine = make_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099'"))
    engine.dispose()
    with pytest.raises(ConfigError, match="newer than this spotopt"):
        open_history(db_url)


def test_two_sources_at_one_instant_resolve_alike_everywhere(db: Database) -> None:
    # Inserted in reverse name order: every query must still pick the first source by name.
    ingest(db, [price("p3.2xlarge", "2024-01-01 00:00", 1.9)], source="zz-later")
    ingest(db, [price("p3.2xlarge", "2024-01-01 00:00", 1.0)], source="aa-first")
    flt = MarketFilter(instance_types=["p3.2xlarge"], kinds=["spot"])
    with db.session() as session:
        history = [(q.source, q.usd_per_hour) for q in price_history(session, flt)]
        now = [(q.source, q.usd_per_hour) for q in prices_at(session, t("2024-01-02 00:00"), flt)]
    assert history == now == [("aa-first", 1.0)]


def test_naive_times_never_reach_the_database(db: Database) -> None:
    from datetime import datetime

    from spotopt.types import MarketKey, PriceObservation

    before = counts(db)
    naive = PriceObservation(
        MarketKey("aws", "us-east-1", None, "p3.2xlarge", MarketKind.SPOT), datetime(2024, 1, 1), 1.0
    )
    with pytest.raises(ValueError, match="naive"):
        run_ingest(db, "test", "naive", [naive])
    assert counts(db) == before


def _create_market(url: str) -> int:
    from spotopt.types import MarketKey, PriceObservation

    database = open_history(url)
    market = MarketKey("aws", "us-east-1", "us-east-1a", "brand.new9", MarketKind.SPOT)
    records = [PriceObservation(market, t(f"2024-01-01 {h:02d}:00"), 1.0 + h) for h in range(24)]
    summary = run_ingest(database, "race", "race", records)
    database.dispose()
    return summary.stats.inserted


def test_concurrent_imports_create_the_same_new_market_safely(db_url: str) -> None:
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        inserted = pool.map(_create_market, [db_url] * 3)
    assert sum(inserted) == 24
    database = open_history(db_url)
    with database.session() as session:
        n = session.scalar(
            select(func.count())
            .select_from(Market)
            .join(InstanceType)
            .where(InstanceType.name == "brand.new9")
        )
    database.dispose()
    assert n == 1


def test_conflicting_reobservations_are_counted_not_applied(db: Database) -> None:
    first = ingest(
        db, [price("p3.2xlarge", "2024-01-01 00:00", 0.5), price("p3.2xlarge", "2024-01-01 00:00", 0.9)]
    )
    assert (first.stats.inserted, first.stats.duplicate, first.stats.conflicting) == (1, 0, 1)
    again = ingest(
        db, [price("p3.2xlarge", "2024-01-01 00:00", 0.5), price("p3.2xlarge", "2024-01-01 00:00", 0.6)]
    )
    assert (again.stats.inserted, again.stats.duplicate, again.stats.conflicting) == (0, 1, 1)
    with db.session() as session:
        quotes = prices_at(
            session, t("2024-01-01 00:00"), MarketFilter(instance_types=["p3.2xlarge"], kinds=["spot"])
        )
        run = session.scalars(select(Run).where(Run.source == "test").order_by(Run.id.desc())).first()
    assert [q.usd_per_hour for q in quotes] == [0.5]
    assert run is not None and (run.duplicate, run.conflicting) == (1, 1)
