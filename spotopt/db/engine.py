"""Engine and session helpers: the only place that commits.

SQLite gets WAL (readers do not block the writer), enforced foreign keys and a busy timeout;
PostgreSQL URLs without a driver get psycopg 3.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from spotopt.errors import ConfigError


def normalise_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` (as psql users write them) and pick psycopg 3."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(
            f"database URL {url!r} is not a URL; use sqlite:///PATH or postgresql://USER@HOST/DB"
        ) from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ConfigError(
            f"database URL {url!r}: backend {parsed.get_backend_name()!r} is not supported; "
            "use sqlite:///PATH or postgresql://USER@HOST/DB"
        )
    return parsed.render_as_string(hide_password=False)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    # One import is one transaction; with the default 2 MiB page cache a large one keeps spilling
    # dirty pages to the WAL and reading them back (benchmarks/ingest.py, 1 M rows: 1.8x slower).
    # The cache is allocated on demand, so small databases do not pay for it.
    cur.execute("PRAGMA cache_size=-262144")
    cur.close()


def make_engine(url: str) -> Engine:
    """Create an engine; for a SQLite file, create its directory first."""
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True)


class Database:
    """An engine plus a session factory. ``session()`` is one unit of work: commit or roll back."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._factory = sessionmaker(engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed if the block ends normally, rolled back on any exception."""
        with self._factory() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
