"""Open the history database ready to use: schema at head and the bundled catalog synced.

SQLite (the embedded default) is migrated automatically under a lock, so a new user never
thinks about migrations. PostgreSQL is shared by a team: spotopt refuses to touch an outdated
schema there and tells the operator to run ``spotopt db upgrade``.

A database that is not spotopt's is refused before anything is written to it: a file that is
not SQLite at all, or a database that holds tables but no Alembic revision (another
application's). A new SQLite file is created only in a directory that exists (the default
location's directories are created), and the caller is told it is new (``Database.created``).
On every open, runs left ``running`` by a process of this host that no longer exists (killed
with ``kill -9``) are marked failed.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime

from sqlalchemy import Engine, inspect, select, update
from sqlalchemy.exc import DatabaseError, OperationalError

from spotopt.db import migrate
from spotopt.db.engine import Database, damaged, make_engine, sqlite_path
from spotopt.db.models import Meta, Run
from spotopt.errors import ConfigError
from spotopt.history.catalog_sync import catalog_hash, sync_catalog
from spotopt.settings import Settings


def connect_error(engine: Engine, exc: OperationalError) -> ConfigError:
    """The message a user sees when the database cannot be reached or opened."""
    return ConfigError(
        f"cannot connect to the database {engine.url.render_as_string()}: {exc.orig}; "
        "check --db / SPOTOPT_DB_URL and that the server is running"
    )


def not_a_database(engine: Engine, exc: DatabaseError) -> ConfigError:
    """A file that SQLite cannot read as a database (a CSV, a dump), or a database whose pages
    are damaged (``damaged``: how to recover it, not "use another file")."""
    return damaged(engine, exc.orig) or ConfigError(
        f"{engine.url.render_as_string()} is not a SQLite database ({exc.orig}); "
        "point --db at a spotopt history or at a new file"
    )


def catalog_is_current(db: Database) -> bool:
    with db.session() as session:
        stored = session.get(Meta, "catalog_hash")
        return stored is not None and stored.value == catalog_hash()


def check_is_spotopt(engine: Engine) -> None:
    """Refuse a database that holds tables but was never migrated by spotopt (no Alembic revision)."""
    tables = set(inspect(engine).get_table_names())
    if tables and "alembic_version" not in tables:
        shown = ", ".join(sorted(tables)[:5]) + (", …" if len(tables) > 5 else "")
        raise ConfigError(
            f"the database {engine.url.render_as_string()} holds tables of another application "
            f"({shown}) and no spotopt schema; spotopt leaves it untouched: use another --db"
        )


def _engine(url: str | None, settings: Settings) -> tuple[Engine, bool]:
    """The engine for the resolved URL, and whether its SQLite file is new."""
    resolved = settings.resolved_db_url(url)
    path = sqlite_path(resolved)
    created = path is not None and not path.exists()
    return make_engine(resolved, create_directory=settings.is_default_db(url)), created


def open_history(url: str | None = None, settings: Settings | None = None) -> Database:
    """Return a ``Database`` for ``url`` (or the settings' URL) with schema and catalog current."""
    settings = settings or Settings()
    engine, created = _engine(url, settings)
    db = Database(engine, created=created)
    try:
        check_is_spotopt(engine)
        if not migrate.is_current(engine):
            if engine.dialect.name != "sqlite" or not settings.auto_migrate:
                current = migrate.current_revision(engine) or "empty"
                raise ConfigError(
                    f"database schema is at {current}, spotopt needs {migrate.head_revision(engine)}: "
                    f"run `spotopt db upgrade` (with --db {engine.url.render_as_string()})"
                )
            migrate.upgrade(engine)
        if not catalog_is_current(db):
            with migrate.migration_lock(engine), db.session() as session:
                sync_catalog(session)  # re-checks the hash: a concurrent opener may have synced
        fail_stale_runs(db)
    except OperationalError as exc:
        engine.dispose()
        raise connect_error(engine, exc) from exc
    except DatabaseError as exc:
        engine.dispose()
        raise not_a_database(engine, exc) from exc
    except Exception:
        engine.dispose()
        raise
    return db


def upgrade_history(
    url: str | None = None, settings: Settings | None = None
) -> tuple[str | None, str | None]:
    """Upgrade to head and sync the catalog; returns (revision before, revision after)."""
    settings = settings or Settings()
    engine, _ = _engine(url, settings)
    try:
        check_is_spotopt(engine)
        before = migrate.current_revision(engine)
        migrate.upgrade(engine)
        with migrate.migration_lock(engine), Database(engine).session() as session:
            sync_catalog(session)
        return before, migrate.current_revision(engine)
    except OperationalError as exc:
        raise connect_error(engine, exc) from exc
    except DatabaseError as exc:
        raise not_a_database(engine, exc) from exc
    finally:
        engine.dispose()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def fail_stale_runs(db: Database) -> list[int]:
    """Mark failed the ``running`` runs of this host whose process is gone; returns their ids.

    Only this host's runs can be checked (a pid means nothing elsewhere); runs recorded before
    spotopt stored owners have none and are left alone. Nothing is written when none is stale,
    so a read-only database opens as before.
    """
    host = socket.gethostname()
    with db.session() as session:
        running = session.execute(
            select(Run.id, Run.pid).where(Run.status == "running", Run.host == host, Run.pid.is_not(None))
        ).all()
    stale = [(run_id, pid) for run_id, pid in running if pid is not None and not _alive(pid)]
    if stale:
        with db.session() as session:
            for run_id, pid in stale:
                session.execute(
                    update(Run)
                    .where(Run.id == run_id, Run.status == "running")
                    .values(
                        status="failed",
                        finished_at=datetime.now(UTC),
                        error=f"its process (pid {pid} on {host}) ended without finishing the run "
                        "(killed?); nothing it wrote was committed",
                    )
                )
    return [run_id for run_id, _ in stale]
