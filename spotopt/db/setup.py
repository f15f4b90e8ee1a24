"""Open the history database ready to use: schema at head and the bundled catalog synced.

SQLite (the embedded default) is migrated automatically under a lock, so a new user never
thinks about migrations. PostgreSQL is shared by a team: spotopt refuses to touch an outdated
schema there and tells the operator to run ``spotopt db upgrade``.
"""

from __future__ import annotations

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from spotopt.catalog import catalog_hash, sync_catalog
from spotopt.db import migrate
from spotopt.db.engine import Database, make_engine
from spotopt.db.models import Meta
from spotopt.errors import ConfigError
from spotopt.settings import Settings


def connect_error(engine: Engine, exc: OperationalError) -> ConfigError:
    """The message a user sees when the database cannot be reached or opened."""
    return ConfigError(
        f"cannot connect to the database {engine.url.render_as_string()}: {exc.orig}; "
        "check --db / SPOTOPT_DB_URL and that the server is running"
    )


def catalog_is_current(db: Database) -> bool:
    with db.session() as session:
        stored = session.get(Meta, "catalog_hash")
        return stored is not None and stored.value == catalog_hash()


def open_history(url: str | None = None, settings: Settings | None = None) -> Database:
    """Return a ``Database`` for ``url`` (or the settings' URL) with schema and catalog current."""
    settings = settings or Settings()
    engine = make_engine(settings.resolved_db_url(url))
    db = Database(engine)
    try:
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
    except OperationalError as exc:
        engine.dispose()
        raise connect_error(engine, exc) from exc
    except Exception:
        engine.dispose()
        raise
    return db


def upgrade_history(
    url: str | None = None, settings: Settings | None = None
) -> tuple[str | None, str | None]:
    """Upgrade to head and sync the catalog; returns (revision before, revision after)."""
    settings = settings or Settings()
    engine = make_engine(settings.resolved_db_url(url))
    try:
        before = migrate.current_revision(engine)
        migrate.upgrade(engine)
        with migrate.migration_lock(engine), Database(engine).session() as session:
            sync_catalog(session)
        return before, migrate.current_revision(engine)
    except OperationalError as exc:
        raise connect_error(engine, exc) from exc
    finally:
        engine.dispose()
