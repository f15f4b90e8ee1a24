"""Benchmark every report on a generated history: 10 M price points over 5 000 markets.

    python benchmarks/reports.py                       # SQLite in a temp dir + a throwaway PostgreSQL
    python benchmarks/reports.py --sqlite /tmp/b.sqlite --keep   # reuse the SQLite file next time
    python benchmarks/reports.py --pg-url postgresql://me@localhost/bench   # an existing, empty database
    python benchmarks/reports.py --rows 1000000 --skip-pg        # smaller, SQLite only

The history: 250 GPU instance types (cloud, GPU model and count drawn from the bundled GPU
list) × 5 regions × (1 on-demand market with 2 list-price points + 3 spot zones). Spot points
are spread over 365 days at random times (the spot markets share ``rows`` evenly), prices a
clipped random walk between 10 % and 110 % of on-demand. Plus one advisor-bucket observation
per (instance type, region) and day, and 20 000 instance lifetimes, a third still running.

Rows are generated with numpy and bulk-loaded (SQLite ``executemany`` of pre-formatted text,
PostgreSQL ``COPY``) straight into the tables after the migrations ran, then each report runs
with the parameters shown (default window: the last 7 days) and the best of ``--repeat`` runs is
printed per database.
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
from sqlalchemy import insert, select

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from spotopt.catalog import gpu_models
from spotopt.db.engine import Database
from spotopt.db.models import InstanceLifetime, InstanceType, Interruption, Market
from spotopt.history.setup import open_history, upgrade_history
from spotopt.reports.registry import get

END = datetime(2026, 1, 1, tzinfo=UTC)
SPAN = timedelta(days=365)
TYPES, REGIONS, ZONES = 250, 5, 3
SOURCE = "bench"
US = 1_000_000
RNG_SEED = 20260101

CASES: list[tuple[str, dict[str, str]]] = [
    ("cheapest", {"bucket": "day"}),
    ("cheapest", {"gpu": "V100", "bucket": "hour"}),
    ("volatility", {}),
    ("spot-discount", {}),
    ("regional-spread", {"bucket": "day"}),
    ("price-board", {"gpu": "A100"}),
    ("interruptions", {}),
    ("coverage", {}),
    ("coverage", {"since": "-30d"}),
]


def _build_catalog(db: Database) -> pd.DataFrame:
    """Instance types and markets; returns one row per market with its on-demand base price."""
    rng = np.random.default_rng(RNG_SEED)
    gpus = sorted(gpu_models())
    clouds = ("aws", "gcp", "azure")
    markets = []
    with db.session() as session:
        for i in range(TYPES):
            cloud, gpu, count = clouds[i % 3], gpus[i % len(gpus)], [1, 2, 4, 8][i % 4]
            type_id = session.execute(
                insert(InstanceType)
                .values(cloud=cloud, name=f"bench-{i}", gpu_model=gpu, gpu_count=count, origin=SOURCE)
                .returning(InstanceType.id)
            ).scalar_one()
            base = float(rng.uniform(0.5, 4.0)) * count
            for r in range(REGIONS):
                region = f"{cloud}-region-{r}"
                places = [("", "on-demand")] + [(f"{region}{chr(97 + z)}", "spot") for z in range(ZONES)]
                for zone, kind in places:
                    market_id = session.execute(
                        insert(Market)
                        .values(instance_type_id=type_id, region=region, zone=zone, kind=kind)
                        .returning(Market.id)
                    ).scalar_one()
                    markets.append((market_id, type_id, region, kind, base))
    return pd.DataFrame(markets, columns=["market_id", "type_id", "region", "kind", "base"])


def _price_chunks(markets: pd.DataFrame, rows: int) -> Iterator[pd.DataFrame]:
    """Per market: (market_id, t µs, usd_per_hour), in chunks of markets to bound memory."""
    rng = np.random.default_rng(RNG_SEED + 1)
    spot = markets[markets["kind"] == "spot"]
    per_spot = max(1, (rows - 2 * (len(markets) - len(spot))) // len(spot))
    end_us = int(END.timestamp()) * US
    span_us = int(SPAN.total_seconds()) * US
    for chunk in np.array_split(markets.to_numpy(), 50):
        parts = []
        for market_id, _type_id, _region, kind, base in chunk:
            if kind == "on-demand":
                t = np.array([end_us - 2 * span_us, end_us - span_us // 2], dtype=np.int64)
                price = np.array([base * 1.05, base])
            else:
                t = np.sort(rng.integers(end_us - span_us, end_us, per_spot))
                steps = rng.normal(0.0, 0.03, per_spot).cumsum()
                price = base * np.clip(0.35 + steps, 0.1, 1.1)
            parts.append(pd.DataFrame({"market_id": market_id, "t": t, "usd_per_hour": price.round(4)}))
        frame = pd.concat(parts, ignore_index=True).drop_duplicates(["market_id", "t"])
        yield frame


def _sqlite_times(t_us: np.ndarray) -> np.ndarray:
    return np.char.replace(np.datetime_as_string(t_us.astype("datetime64[us]"), unit="us"), "T", " ")


def _load_sqlite(db: Database, markets: pd.DataFrame, rows: int) -> int:
    raw = db.engine.raw_connection()
    loaded = 0
    try:
        cur = raw.cursor()
        cur.execute("PRAGMA synchronous=OFF")
        for frame in _price_chunks(markets, rows):
            data = zip(
                frame["market_id"].tolist(),
                _sqlite_times(frame["t"].to_numpy()).tolist(),
                [SOURCE] * len(frame),
                frame["usd_per_hour"].tolist(),
                strict=True,
            )
            cur.executemany(
                "INSERT INTO price_points (market_id, observed_at, source, usd_per_hour) VALUES (?, ?, ?, ?)",
                data,
            )
            raw.commit()
            loaded += len(frame)
            print(f"\r  sqlite: {loaded:,} rows", end="", flush=True, file=sys.stderr)
        cur.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()
    print(file=sys.stderr)
    return loaded


def _load_pg(db: Database, markets: pd.DataFrame, rows: int) -> int:
    raw = db.engine.raw_connection()
    loaded = 0
    try:
        cur = raw.cursor()
        for frame in _price_chunks(markets, rows):
            out = pd.DataFrame(
                {
                    "market_id": frame["market_id"],
                    "observed_at": pd.to_datetime(frame["t"], unit="us", utc=True).dt.strftime(
                        "%Y-%m-%d %H:%M:%S.%f+00"
                    ),
                    "source": SOURCE,
                    "usd_per_hour": frame["usd_per_hour"],
                }
            )
            buf = io.StringIO()
            out.to_csv(buf, header=False, index=False)
            with cur.copy(  # type: ignore[attr-defined]
                "COPY price_points (market_id, observed_at, source, usd_per_hour) FROM STDIN (FORMAT csv)"
            ) as copy:
                copy.write(buf.getvalue())
            raw.commit()
            loaded += len(frame)
            print(f"\r  postgresql: {loaded:,} rows", end="", flush=True, file=sys.stderr)
        cur.execute("ANALYZE")
        raw.commit()
    finally:
        raw.close()
    print(file=sys.stderr)
    return loaded


def _load_extras(db: Database, markets: pd.DataFrame) -> None:
    """Advisor buckets per (type, region, day) and instance lifetimes on spot markets."""
    rng = np.random.default_rng(RNG_SEED + 2)
    pairs = markets[markets["kind"] == "on-demand"][["type_id", "region"]].to_numpy()
    days = [END - timedelta(days=d) for d in range(1, 366)]
    rows = [
        {
            "instance_type_id": int(type_id),
            "region": region,
            "zone": "",
            "observed_at": day,
            "kind": "advisor-bucket",
            "value": float(v),
            "raw": f"<{int(v)}%",
            "source": SOURCE,
        }
        for type_id, region in pairs
        for day, v in zip(days, rng.choice([5, 10, 15, 20, 100], len(days)), strict=True)
    ]
    spot_ids = markets.loc[markets["kind"] == "spot", "market_id"].to_numpy()
    lifetimes = []
    for i in range(20_000):
        start = END - timedelta(hours=float(rng.uniform(1, 24 * 365)))
        life = timedelta(hours=float(rng.exponential(30.0)))
        running = i % 3 == 0 or start + life > END
        lifetimes.append(
            {
                "market_id": int(rng.choice(spot_ids)),
                "instance_ref": f"i-{i}",
                "started_at": start,
                "ended_at": None if running else start + life,
                "end_reason": None if running else ("preempted" if i % 3 == 1 else "terminated"),
                "source": SOURCE,
            }
        )
    with db.session() as session:
        for n in range(0, len(rows), 50_000):
            session.execute(insert(Interruption), rows[n : n + 50_000])
        session.execute(insert(InstanceLifetime), lifetimes)


def prepare(url: str, rows: int) -> Database:
    upgrade_history(url)
    db = open_history(url)
    with db.session() as session:
        if session.scalar(select(InstanceType.id).where(InstanceType.origin == SOURCE).limit(1)) is not None:
            print(f"  reusing the generated history in {db.engine.url.render_as_string()}")
            return db
    started = time.perf_counter()
    markets = _build_catalog(db)
    loaded = (_load_pg if db.dialect == "postgresql" else _load_sqlite)(db, markets, rows)
    _load_extras(db, markets)
    took = time.perf_counter() - started
    print(f"  loaded {loaded:,} price points over {len(markets):,} markets in {took:.0f} s")
    return db


def _timed(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def bench(db: Database, repeat: int) -> dict[str, float]:
    timings = {}
    for name, given in CASES:
        report = get(name)
        anchor = "until" if any(p.name == "until" for p in report.params) else "at"
        args = report.parse({anchor: END.isoformat(), **given}, now=END)

        def once(report=report, args=args) -> object:  # type: ignore[no-untyped-def]
            with db.session() as session:
                return report.run(session, args)

        seconds, result = _timed(once, repeat)
        label = name + (" " + " ".join(f"{k}={v}" for k, v in given.items()) if given else "")
        sizes = ", ".join(f"{k}: {len(v)} rows" for k, v in result.sections.items())  # type: ignore[attr-defined]
        print(f"  {label:<40} {seconds:7.3f} s   ({sizes})")
        timings[label] = seconds
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--sqlite", type=Path, help="SQLite file (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the SQLite file for the next run")
    parser.add_argument(
        "--pg-url", help="an existing empty PostgreSQL database (default: a throwaway server)"
    )
    parser.add_argument("--skip-pg", action="store_true")
    parser.add_argument("--skip-sqlite", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    opts = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        if not opts.skip_sqlite:
            path = opts.sqlite or Path(tmp) / "bench.sqlite"
            print(f"SQLite ({path})")
            db = prepare(f"sqlite:///{path}", opts.rows)
            results["sqlite"] = bench(db, opts.repeat)
            db.dispose()
            if not opts.keep and opts.sqlite is None:
                path.unlink()
        if not opts.skip_pg:
            server = None
            url = opts.pg_url
            if url is None:
                from tests.pg import PostgresServer, find_bindir

                bindir = find_bindir()
                if bindir is None:
                    sys.exit("no PostgreSQL binaries: pass --pg-url or --skip-pg")
                server = PostgresServer(bindir)
                server.start()
                url = server.url()
            try:
                print("PostgreSQL")
                db = prepare(url, opts.rows)
                results["postgresql"] = bench(db, opts.repeat)
                db.dispose()
            finally:
                if server is not None:
                    server.stop()
    if len(results) == 2:
        print("\n| report | SQLite (s) | PostgreSQL (s) |\n|---|---:|---:|")
        for label in results["sqlite"]:
            print(f"| `{label}` | {results['sqlite'][label]:.2f} | {results['postgresql'][label]:.2f} |")


if __name__ == "__main__":
    main()
