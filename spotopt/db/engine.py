"""Engine and session helpers: the only place that commits.

SQLite gets WAL (readers do not block the writer), enforced foreign keys and a busy timeout;
PostgreSQL URLs without a driver get psycopg 3.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from spotopt.db import writelock
from spotopt.errors import ConfigError, DatabaseBusyError


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
    # WAL is a property of the file: switch only a new file or spotopt's own history, so another
    # application's database that spotopt then refuses (history.setup) is left exactly as it was.
    cur.execute("SELECT count(*), count(*) FILTER (WHERE name = 'alembic_version') FROM sqlite_master")
    objects, ours = cur.fetchone()
    if objects == 0 or ours:
        cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA busy_timeout=30000")
    # One import is one transaction; with the default 2 MiB page cache a large one keeps spilling
    # dirty pages to the WAL and reading them back (benchmarks/ingest.py, 1 M rows: 1.8x slower).
    # The cache is allocated on demand, so small databases do not pay for it.
    cur.execute("PRAGMA cache_size=-262144")
    # Check each page's cells as it is read: a damaged page then fails the statement
    # (SQLITE_CORRUPT, reported by ``damaged``) instead of reading as fewer or wrong rows. It
    # costs a few percent of a full scan; ``PRAGMA quick_check`` on every open would cost 6-8 s
    # on a 700 MB history (5 M prices), so a whole-file check is left to the user.
    cur.execute("PRAGMA cell_size_check=ON")
    cur.close()


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for other backends and in-memory databases)."""
    parsed = make_url(normalise_url(url))
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    if parsed.database.startswith("file:"):  # sqlite:///file:PATH?mode=ro&uri=true
        return Path(parsed.database.removeprefix("file:")).expanduser()
    return Path(parsed.database).expanduser()


def make_engine(url: str, create_directory: bool = False) -> Engine:
    """Create an engine. A SQLite file's directory must exist unless ``create_directory``
    (the default database in the user's data directory): a typo in ``--db`` must not quietly
    become a new, empty history somewhere else."""
    url = normalise_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        path = sqlite_path(url)
        if path is not None and create_directory:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif path is not None and not path.parent.is_dir():
            raise ConfigError(
                f"database URL {url!r}: directory {path.parent} does not exist; "
                "create it first (a new database file is created there) or fix the path"
            )
        engine = create_engine(url)
        event.listen(engine, "connect", _sqlite_pragmas)
        if path is not None:
            writelock.install(engine, path)
        return engine
    return create_engine(url, pool_pre_ping=True)


def damaged(engine: Engine, exc: BaseException | None) -> ConfigError | None:
    """The user-facing error for a SQLite file whose pages are damaged (SQLITE_CORRUPT), else
    None; ``exc`` is the driver's error (``DBAPIError.orig``, or raised by a raw cursor)."""
    if getattr(exc, "sqlite_errorname", None) != "SQLITE_CORRUPT":
        return None
    path = sqlite_path(engine.url.render_as_string(hide_password=False))
    return ConfigError(
        f"the database {path} is damaged ({exc}); restore it from a backup, or recover what is "
        f"readable with `sqlite3 {path} .recover | sqlite3 NEW.sqlite` and use --db sqlite:///NEW.sqlite"
    )


# SQLSTATEs of a PostgreSQL write refused for good: read-only transaction, insufficient privilege.
_PG_WRITE_REFUSED = {"25006", "42501"}


def write_refused(engine: Engine, exc: DBAPIError) -> ConfigError | DatabaseBusyError | None:
    """The user-facing error for a write the database did not accept, else None."""
    where = engine.url.render_as_string(hide_password=True)
    if engine.dialect.name == "sqlite" and "database is locked" in str(exc.orig):
        return DatabaseBusyError(
            f"the database {where} stayed locked by another program for 30 s ({exc.orig}); "
            "nothing was written: run this again when it has finished"
        )
    if engine.dialect.name == "sqlite" and "readonly database" in str(exc.orig):
        return ConfigError(
            f"the database {where} is read-only ({exc.orig}); "
            "make the file and its directory writable, or point --db at a copy"
        )
    if getattr(exc.orig, "sqlstate", None) in _PG_WRITE_REFUSED:
        first = str(exc.orig).strip().splitlines()[0]
        return ConfigError(
            f"the database {where} refused the write ({first}); "
            "connect as a role that may write, or to a writable server"
        )
    return None


class Database:
    """An engine plus a session factory. ``session()`` is one unit of work: commit or roll back.

    ``created``: the SQLite file did not exist before this opened it (a new, empty history).
    """

    def __init__(self, engine: Engine, created: bool = False) -> None:
        self.engine = engine
        self.created = created
        self._factory = sessionmaker(engine, expire_on_commit=False)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed if the block ends normally, rolled back on any exception.

        A write the database refuses for good (a read-only SQLite file, a read-only PostgreSQL
        transaction or role) or a damaged SQLite file becomes a ``ConfigError`` saying so; the
        transaction is rolled back.
        """
        try:
            with self._factory() as session, session.begin():
                yield session
        except DBAPIError as exc:
            refused = write_refused(self.engine, exc) or damaged(self.engine, exc.orig)
            if refused is None:
                raise
            raise refused from exc
        except sqlite3.DatabaseError as exc:  # from a raw DBAPI cursor (the importers' bulk inserts)
            damage = damaged(self.engine, exc)
            if damage is None:
                raise
            raise damage from exc

    def dispose(self) -> None:
        self.engine.dispose()
