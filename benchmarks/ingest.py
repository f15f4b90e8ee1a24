"""Ingest benchmark: 1 M generated price rows into SQLite and PostgreSQL, then the same rows again.

Two paths per database: ``records`` feeds typed records straight into ``run_ingest`` (the
ingest layer alone); ``csv`` imports a generated CSV file through the CSV reader (what
``spotopt import csv`` does, parsing included). The second pass of each is the re-import, which
must insert nothing. PostgreSQL is a throwaway server (``tests/pg.py``) unless ``--pg-url`` is
given. Targets on a 2-core machine: >= 100k rows/s on SQLite, >= 50k rows/s on PostgreSQL.

    python benchmarks/ingest.py [--rows 1000000] [--pg-url URL] [--skip-pg] [--skip-csv]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spotopt.db.engine import Database  # noqa: E402
from spotopt.history.importers.csv_prices import read_price_csv  # noqa: E402
from spotopt.history.ingest import run_ingest  # noqa: E402
from spotopt.history.setup import open_history, upgrade_history  # noqa: E402
from spotopt.types import MarketKey, MarketKind, PriceObservation, Record  # noqa: E402

START = datetime(2020, 1, 1, tzinfo=UTC)
TYPES = ("p3.2xlarge", "p3.8xlarge", "g4dn.xlarge", "g5.xlarge", "p4d.24xlarge", "zz1.bench")
ZONES = tuple(f"{region}{letter}" for region in ("us-east-1", "us-west-2", "eu-west-1") for letter in "abcd")
MARKETS = tuple(
    MarketKey("aws", zone[:-1], zone, name, MarketKind.SPOT) for zone in ZONES for name in TYPES
)  # 72 markets


def generate(rows: int) -> Iterator[PriceObservation]:
    """``rows`` price points spread over the markets, 5 minutes apart per market."""
    step = timedelta(minutes=5)
    for i in range(rows):
        market = MARKETS[i % len(MARKETS)]
        yield PriceObservation(market, START + step * (i // len(MARKETS)), 0.1 + (i % 997) / 100)


def write_csv(path: Path, rows: int) -> None:
    with path.open("w") as out:
        out.write("timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n")
        for p in generate(rows):
            m = p.market
            out.write(
                f"{p.observed_at:%Y-%m-%dT%H:%M:%S}Z,{m.cloud},{m.region},{m.zone},"
                f"{m.instance_type},{m.kind.value},{p.usd_per_hour:.4f}\n"
            )


def timed(
    db: Database, label: str, source: str, records: Iterator[Record], rows: int, expect_new: bool
) -> float:
    began = time.perf_counter()
    summary = run_ingest(db, source, "benchmark", records)
    seconds = time.perf_counter() - began
    stats = summary.stats
    wanted = (rows, 0) if expect_new else (0, rows)
    if (stats.inserted, stats.duplicate) != wanted:
        raise SystemExit(f"{label}: inserted/duplicate {stats.inserted}/{stats.duplicate}, expected {wanted}")
    rate = rows / seconds
    print(f"{label:<34} {rows:>9,} rows {seconds:8.2f} s {rate:>11,.0f} rows/s", flush=True)
    return rate


def bench(db: Database, name: str, rows: int, csv_path: Path | None) -> dict[str, float]:
    records = list(generate(rows))  # generated before the clock starts: this phase times ingest alone
    rates = {}
    for label, new in (("import", True), ("re-import", False)):
        key = f"{name} records {label}"
        rates[key] = timed(db, key, "bench", iter(records), rows, new)
    del records
    if csv_path is not None:
        for label, new in (("import", True), ("re-import", False)):
            key = f"{name} csv {label}"
            rates[key] = timed(db, key, "bench-csv", read_price_csv(csv_path), rows, new)  # type: ignore[arg-type]
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--pg-url", help="an empty PostgreSQL database (default: a throwaway server)")
    parser.add_argument("--skip-pg", action="store_true", help="SQLite only")
    parser.add_argument("--skip-csv", action="store_true", help="records only, no CSV parsing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spotopt-bench-") as tmp:
        work = Path(tmp)
        csv_path = None if args.skip_csv else work / "prices.csv"
        if csv_path is not None:
            write_csv(csv_path, args.rows)
            print(f"generated {csv_path.stat().st_size / 1e6:.0f} MB of CSV", flush=True)
        db = open_history(f"sqlite:///{work / 'bench.sqlite'}")
        try:
            bench(db, "SQLite", args.rows, csv_path)
        finally:
            db.dispose()
        if args.skip_pg:
            return
        if args.pg_url:
            upgrade_history(args.pg_url)
            db = open_history(args.pg_url)
            try:
                bench(db, "PostgreSQL", args.rows, csv_path)
            finally:
                db.dispose()
            return
        from tests.pg import PostgresServer, find_bindir

        bindir = find_bindir()
        if bindir is None:
            raise SystemExit(
                "no PostgreSQL binaries (pg_ctl); install postgresql, pass --pg-url or --skip-pg"
            )
        server = PostgresServer(bindir)
        server.start()
        try:
            with create_engine(server.url(), isolation_level="AUTOCOMMIT").connect() as conn:
                conn.execute(text("CREATE DATABASE bench"))
            upgrade_history(server.url("bench"))
            db = open_history(server.url("bench"))
            try:
                bench(db, "PostgreSQL", args.rows, csv_path)
            finally:
                db.dispose()
        finally:
            server.stop()


if __name__ == "__main__":
    main()
