"""Write typed records into the SQL history: idempotent, batched, inside the caller's transaction.

``Ingestor`` resolves instance types and markets through in-memory caches, buffers price,
interruption, capacity and lifetime rows and inserts them with "ignore on conflict" on their
natural keys, so running
the same import twice inserts nothing the second time. Counting is exact on both databases:
SQLite sums ``executemany`` row counts; PostgreSQL copies the batch into a temporary table and
inserts from it with ``ON CONFLICT DO NOTHING`` (one statement, one exact row count).

``start_run``/``finish_run`` are the one way a run is recorded, for imports and collector scopes
alike: the ``runs`` row is written before and after in their own transactions, the data in one
transaction in between, so a failure leaves the history as it was and the run recorded as failed
with its error, and every run stores the same counts (inserted, duplicate, conflicting,
rejected) and the same rejection reasons with examples. ``run_ingest`` wraps a whole import.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import Table, UniqueConstraint, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from spotopt.db.engine import Database
from spotopt.db.models import (
    Base,
    CapacityObservation,
    InstanceLifetime,
    InstanceType,
    Interruption,
    Market,
    PricePoint,
    Run,
    UTCDateTime,
)
from spotopt.errors import InputError
from spotopt.types import (
    AvailabilityObservation,
    InstanceTypeSpec,
    InterruptionObservation,
    LifetimeObservation,
    MarketKey,
    MarketKind,
    PriceObservation,
    Record,
    Rejection,
)

BATCH_ROWS = 20_000
PRICE_COLUMNS = ("market_id", "observed_at", "source", "usd_per_hour", "run_id")
INTERRUPTION_COLUMNS = (
    "instance_type_id",
    "region",
    "zone",
    "observed_at",
    "kind",
    "value",
    "raw",
    "source",
    "run_id",
)
CAPACITY_COLUMNS = ("market_id", "observed_at", "source", "available", "launched", "requested", "run_id")
LIFETIME_COLUMNS = ("market_id", "instance_ref", "started_at", "ended_at", "end_reason", "source")
# What each buffered table is written with (the order its rows are buffered in).
_COLUMNS: dict[str, tuple[str, ...]] = {
    PricePoint.__tablename__: PRICE_COLUMNS,
    Interruption.__tablename__: INTERRUPTION_COLUMNS,
    CapacityObservation.__tablename__: CAPACITY_COLUMNS,
    InstanceLifetime.__tablename__: LIFETIME_COLUMNS,
}
MAX_REJECTION_EXAMPLES = 20


@dataclass
class IngestStats:
    inserted: int = 0
    duplicate: int = 0
    conflicting: int = 0
    """Rows whose key was already stored (or came earlier in the batch) with another value:
    the first observation is kept, the conflict counted and reported, never applied silently."""
    rejected: int = 0
    rejections: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    unknown_types: set[tuple[str, str]] = field(default_factory=set)
    new_types: set[tuple[str, str]] = field(default_factory=set)

    def reject(self, where: str, reason: str) -> None:
        """Count one rejected record; the first ``MAX_REJECTION_EXAMPLES`` say where it was."""
        self.rejected += 1
        self.rejections[reason] += 1
        if len(self.examples) < MAX_REJECTION_EXAMPLES:
            self.examples.append(f"{where}: {reason}")

    def rejections_json(self) -> str | None:
        """What ``runs.rejections`` stores: ``{"reasons": {reason: count}, "examples": [...]}``,
        most frequent reason first; None when nothing was rejected."""
        if not self.rejected:
            return None
        return json.dumps({"reasons": dict(self.rejections.most_common()), "examples": self.examples})

    def as_dict(self) -> dict[str, Any]:
        return {
            "inserted": self.inserted,
            "duplicate": self.duplicate,
            "conflicting": self.conflicting,
            "rejected": self.rejected,
            "rejections": dict(self.rejections),
            "unknown_instance_types": sorted(f"{c}:{n}" for c, n in self.unknown_types),
        }


def insert_missing(session: Session, model: type[Base], values: dict[str, Any]) -> None:
    """Insert a row unless its natural key exists: safe when an import and a collector running
    at the same time create the same new instance type or market (no IntegrityError), and for
    an observation whose key is already stored (the first one is kept)."""
    insert = pg_insert if session.get_bind().dialect.name == "postgresql" else sqlite_insert
    session.execute(insert(model).values(**values).on_conflict_do_nothing())


def upsert_instance_type(session: Session, spec: InstanceTypeSpec, origin: str) -> InstanceType:
    """Insert or refresh one instance type.

    The bundled catalog owns the specs of the types it lists: a collector may fill in a type the
    catalog lacks, or refresh one it created itself, but never overwrite catalog facts.
    """
    insert_missing(
        session, InstanceType, {"cloud": spec.cloud, "name": spec.name, "origin": origin, "retired": False}
    )
    row = session.scalars(
        select(InstanceType).where(InstanceType.cloud == spec.cloud, InstanceType.name == spec.name)
    ).one()
    if row.origin == "catalog" and origin != "catalog":
        return row
    row.gpu_model = spec.gpu_model
    row.gpu_count = spec.gpu_count
    row.gpu_memory_gib = spec.gpu_memory_gib
    row.vcpus = spec.vcpus
    row.memory_gib = spec.memory_gib
    row.retired = spec.retired
    row.gpu_name_raw = spec.gpu_name_raw
    row.origin = origin
    session.flush()
    return row


class Ingestor:
    """Buffers records for one source and writes them in batches inside ``session``'s transaction."""

    def __init__(self, session: Session, source: str, run_id: int | None) -> None:
        self.session = session
        self.source = source
        self.run_id = run_id
        self.stats = IngestStats()
        self._types: dict[tuple[str, str], int] = {
            (c, n): i
            for i, c, n in session.execute(select(InstanceType.id, InstanceType.cloud, InstanceType.name))
        }
        self._markets: dict[tuple[int, str, str, str], int] = {
            (t, r, z, k): i
            for i, t, r, z, k in session.execute(
                select(Market.id, Market.instance_type_id, Market.region, Market.zone, Market.kind)
            )
        }
        self._market_by_key: dict[MarketKey, int] = {}
        self._rows: dict[str, list[tuple[Any, ...]]] = {name: [] for name in _COLUMNS}
        self._dialect = session.get_bind().dialect.name

    def add(self, record: Record) -> None:
        if isinstance(record, PriceObservation):
            _check_utc(record, record.observed_at)
            market_id = self._cached_market_id(record.market)
            self._buffer(
                PricePoint, (market_id, record.observed_at, self.source, record.usd_per_hour, self.run_id)
            )
        elif isinstance(record, InterruptionObservation):
            _check_utc(record, record.observed_at)
            self._buffer(
                Interruption,
                (
                    self.instance_type_id(record.cloud, record.instance_type),
                    record.region,
                    record.zone or "",
                    record.observed_at,
                    record.kind,
                    record.value,
                    record.raw,
                    self.source,
                    self.run_id,
                ),
            )
        elif isinstance(record, AvailabilityObservation):
            _check_utc(record, record.observed_at)
            market_id = self._spot_market_id(record.market, "capacity observations")
            self._buffer(
                CapacityObservation,
                (
                    market_id,
                    record.observed_at,
                    self.source,
                    record.available,
                    record.launched,
                    record.requested,
                    self.run_id,
                ),
            )
        elif isinstance(record, LifetimeObservation):
            _check_utc(record, record.started_at)
            if record.ended_at is not None:
                _check_utc(record, record.ended_at)
            market_id = self._spot_market_id(record.market, "instance lifetimes")
            self._buffer(
                InstanceLifetime,
                (
                    market_id,
                    record.instance_ref,
                    record.started_at,
                    record.ended_at,
                    record.end_reason,
                    self.source,
                ),
            )
        elif isinstance(record, InstanceTypeSpec):
            row = upsert_instance_type(self.session, record, self.source)
            if (record.cloud, record.name) not in self._types:
                self.stats.new_types.add((record.cloud, record.name))
            self._types[(record.cloud, record.name)] = row.id
        elif isinstance(record, Rejection):
            self.reject(record.where, record.reason)
        else:  # pragma: no cover - the Record union is closed
            raise TypeError(f"not a record: {record!r}")

    def reject(self, where: str, reason: str) -> None:
        self.stats.reject(where, reason)

    def instance_type_id(self, cloud: str, name: str) -> int:
        """The id of (cloud, name); a type missing from the catalog is added as unknown-GPU."""
        key = (cloud, name)
        found = self._types.get(key)
        if found is not None:
            return found
        row = upsert_instance_type(
            self.session,
            InstanceTypeSpec(cloud=cloud, name=name, gpu_model=None, gpu_count=None),
            self.source,
        )
        self.stats.unknown_types.add(key)
        self._types[key] = row.id
        return row.id

    def market_id(self, market: MarketKey) -> int:
        type_id = self.instance_type_id(market.cloud, market.instance_type)
        key = (type_id, market.region, market.zone or "", market.kind.value)
        found = self._markets.get(key)
        if found is not None:
            return found
        values = {"instance_type_id": type_id, "region": key[1], "zone": key[2], "kind": key[3]}
        insert_missing(self.session, Market, values)
        market_id = self.session.scalars(
            select(Market.id).where(*(getattr(Market, column) == value for column, value in values.items()))
        ).one()
        self._markets[key] = market_id
        return market_id

    def _cached_market_id(self, market: MarketKey) -> int:
        market_id = self._market_by_key.get(market)
        if market_id is None:
            market_id = self._market_by_key[market] = self.market_id(market)
        return market_id

    def _spot_market_id(self, market: MarketKey, what: str) -> int:
        """The id of a spot market; an on-demand one is refused: ``what`` is recorded for spot
        markets only (a reader lets none through, so this is a caller's mistake)."""
        if market.kind is not MarketKind.SPOT:
            raise InputError(
                f"{market.cloud} {market.region} {market.zone or '(region)'} {market.instance_type}: "
                f"{what} are recorded for spot markets only, not {market.kind.value}"
            )
        return self._cached_market_id(market)

    def _buffer(self, model: type[Base], row: tuple[Any, ...]) -> None:
        rows = self._rows[model.__tablename__]
        rows.append(row)
        if len(rows) >= BATCH_ROWS:
            self._flush(model.__tablename__)

    def flush(self) -> IngestStats:
        for name in self._rows:
            self._flush(name)
        return self.stats

    def _flush(self, name: str) -> None:
        table = Base.metadata.tables[name]
        self._insert_ignore(table, _COLUMNS[name], self._rows[name])
        self._rows[name] = []

    def _insert_ignore(self, table: Table, columns: tuple[str, ...], rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        if self._dialect == "postgresql":
            inserted = _pg_copy_insert(self.session, table, columns, rows)
        else:
            inserted = _sqlite_insert_ignore(self.session, table, columns, rows)
        conflicting = _count_conflicts(self.session, table, columns) if inserted < len(rows) else 0
        self.stats.inserted += inserted
        self.stats.conflicting += conflicting
        self.stats.duplicate += len(rows) - inserted - conflicting


def sqlite_utc_text(value: datetime) -> str:
    """A UTC datetime as SQLAlchemy stores it on SQLite (``2024-05-01 12:00:00.000000``), for raw inserts."""
    if value.tzinfo is UTC:  # the common case, without two conversions per row
        return value.isoformat(" ", "microseconds")[:-6]
    if value.tzinfo is None:
        raise ValueError(f"naive datetime {value!r} reached the database; use UTC")
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds")


def _sqlite_insert_ignore(
    session: Session, table: Table, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> int:
    """``INSERT … ON CONFLICT DO NOTHING`` through the DBAPI cursor: the row count is exact, and
    converting the batch here is several times faster than SQLAlchemy's per-row bind processing
    (``sqlite_utc_text`` writes times exactly as ``UTCDateTime`` would, so queries compare alike).
    Rows go in primary-key order (``benchmarks/ingest.py``: +60 % rows/s with 72 interleaved markets).
    """
    key = [columns.index(c.name) for c in table.primary_key.columns if c.name in columns]
    if len(key) > 1:
        # B-tree inserts in key order touch each page once; stable, so the first of equal keys wins.
        rows = sorted(rows, key=itemgetter(*key))
    for i, column in enumerate(columns):
        if isinstance(table.c[column].type, UTCDateTime):
            rows = [
                (*row[:i], None if row[i] is None else sqlite_utc_text(row[i]), *row[i + 1 :]) for row in rows
            ]
    staging = _staging_name(table)
    cols = ", ".join(columns)
    raw = session.connection().connection.dbapi_connection
    assert raw is not None
    cursor = raw.cursor()
    try:
        cursor.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {staging} AS SELECT {cols} FROM {table.name} WHERE 0"
        )
        cursor.execute(f"DELETE FROM {staging}")
        cursor.executemany(f"INSERT INTO {staging} VALUES ({', '.join('?' * len(columns))})", rows)
        # ORDER BY rowid: the batch order (key order, stable), so the first of equal keys wins.
        cursor.execute(
            f"INSERT INTO {table.name} ({cols}) SELECT {cols} FROM {staging} WHERE true ORDER BY rowid "
            "ON CONFLICT DO NOTHING"
        )
        return int(cursor.rowcount)
    finally:
        cursor.close()


def _pg_copy_insert(
    session: Session, table: Table, columns: tuple[str, ...], rows: list[tuple[Any, ...]]
) -> int:
    """COPY the batch into a temporary table, then insert what is new: fast and exactly counted."""
    staging = _staging_name(table)
    cols = ", ".join(columns)
    conn = session.connection()
    raw = conn.connection.dbapi_connection
    assert raw is not None
    with raw.cursor() as cur:  # type: ignore[attr-defined]
        cur.execute(
            f"CREATE TEMP TABLE IF NOT EXISTS {staging} (LIKE {table.name} INCLUDING DEFAULTS) ON COMMIT DROP"
        )
        cur.execute(f"TRUNCATE {staging}")
        with cur.copy(f"COPY {staging} ({cols}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)
    result = conn.exec_driver_sql(
        f"INSERT INTO {table.name} ({cols}) SELECT {cols} FROM {staging} ON CONFLICT DO NOTHING"
    )
    return result.rowcount


def _check_utc(record: Record, value: datetime) -> None:
    if value.tzinfo is None:  # PostgreSQL would read it as server-local time
        raise ValueError(f"naive datetime in {record!r}; records carry UTC times")


def _staging_name(table: Table) -> str:
    return f"_stage_{table.name}"


# The columns that must agree when a key is observed again (the rest of the row is provenance).
_OBSERVED_VALUES = {
    "price_points": ("usd_per_hour",),
    "interruptions": ("value",),
    "capacity_observations": ("available", "launched", "requested"),
    "instance_lifetimes": ("started_at", "ended_at", "end_reason"),
}


def _count_conflicts(session: Session, table: Table, columns: tuple[str, ...]) -> int:
    """Rows of the staged batch whose key is stored with another value (first one kept).

    The key is the table's unique constraint, or its primary key where that is the natural key
    (price points, capacity observations). Only run when a batch had duplicates, so first
    imports pay nothing for it.
    """
    unique = next(
        (c.columns for c in table.constraints if isinstance(c, UniqueConstraint)), table.primary_key.columns
    )
    key = [c.name for c in unique if c.name in columns]
    postgresql = session.get_bind().dialect.name == "postgresql"
    differs = "IS DISTINCT FROM" if postgresql else "IS NOT"
    if postgresql:  # without statistics on the fresh staging rows the planner scans the history
        session.connection().exec_driver_sql(f"ANALYZE {_staging_name(table)}")
    join = " AND ".join(f"s.{c} = t.{c}" for c in key)
    changed = " OR ".join(f"s.{v} {differs} t.{v}" for v in _OBSERVED_VALUES[table.name])
    sql = f"SELECT count(*) FROM {_staging_name(table)} s JOIN {table.name} t ON {join} WHERE {changed}"
    return int(session.connection().exec_driver_sql(sql).scalar_one())


@dataclass
class RunSummary:
    run_id: int
    source: str
    scope: str
    status: str
    stats: IngestStats
    error: str | None = None


def start_run(db: Database, source: str, scope: str) -> int:
    """Record that ``source`` starts writing ``scope`` (committed before any data); its id."""
    with db.session() as session:
        run = Run(source=source, scope=scope, started_at=datetime.now(UTC), status="running")
        session.add(run)
        session.flush()
        return run.id


def finish_run(db: Database, run_id: int, status: str, stats: IngestStats, error: str | None = None) -> None:
    """Record how run ``run_id`` ended: ``status`` (ok | failed | skipped), what it wrote and
    rejected, and for a run that did not succeed, why (``error``; collectors redact it first, as
    a cloud's message can echo a secret)."""
    with db.session() as session:
        run = session.get(Run, run_id)
        assert run is not None
        run.status = status
        run.finished_at = datetime.now(UTC)
        run.inserted = stats.inserted
        run.duplicate = stats.duplicate
        run.conflicting = stats.conflicting
        run.rejected = stats.rejected
        run.rejections = stats.rejections_json()
        run.error = error[:4000] if error else None


def run_ingest(db: Database, source: str, scope: str, records: Iterable[Record]) -> RunSummary:
    """Record a run, ingest ``records`` in one transaction, record the outcome; re-raise failures.

    The ``runs`` row is committed before the data transaction starts and updated after it ends,
    so a crash at any point leaves either the data and an "ok" run, or no data and a run that
    says "running" (crashed) or "failed" (with the error).
    """
    run_id = start_run(db, source, scope)
    try:
        with db.session() as session:
            ingestor = Ingestor(session, source, run_id)
            for record in records:
                ingestor.add(record)
            stats = ingestor.flush()
    except BaseException as exc:
        finish_run(db, run_id, "failed", IngestStats(), f"{type(exc).__name__}: {exc}")
        raise
    finish_run(db, run_id, "ok", stats)
    return RunSummary(run_id, source, scope, "ok", stats)
