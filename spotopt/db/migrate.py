"""Alembic from inside the package: upgrade to head under a lock, and report the revision.

The lock makes concurrent first runs safe: SQLite uses a lock file next to the database,
PostgreSQL a session-level advisory lock. After taking the lock the revision is checked again,
so the second process finds the work done and does nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from filelock import FileLock
from sqlalchemy import Engine, text

from spotopt import DISTRIBUTION
from spotopt.errors import ConfigError

# An arbitrary constant that names spotopt's migration lock among PostgreSQL advisory locks.
_PG_LOCK_KEY = 0x5370_6F74


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "spotopt.migrations:")
    cfg.attributes["engine"] = engine
    return cfg


def head_revision(engine: Engine) -> str | None:
    return ScriptDirectory.from_config(alembic_config(engine)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def is_current(engine: Engine) -> bool:
    """True at head; a ``ConfigError`` if the database was migrated by a newer spotopt."""
    current = current_revision(engine)
    known = {
        script.revision for script in ScriptDirectory.from_config(alembic_config(engine)).walk_revisions()
    }
    if current is not None and current not in known:
        raise ConfigError(
            f"the database schema is at {current}, newer than this spotopt knows "
            f"(head {head_revision(engine)}): install a newer {DISTRIBUTION}"
        )
    return current == head_revision(engine)


@contextmanager
def migration_lock(engine: Engine) -> Iterator[None]:
    if engine.dialect.name == "sqlite":
        db_path = engine.url.database
        if not db_path or db_path == ":memory:":
            yield
            return
        with FileLock(str(Path(db_path).expanduser()) + ".migrate.lock", timeout=300):
            yield
        return
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": _PG_LOCK_KEY})
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": _PG_LOCK_KEY})


def upgrade(engine: Engine, revision: str = "head") -> bool:
    """Upgrade to ``revision``; returns True if anything was applied."""
    if revision == "head" and is_current(engine):
        return False
    with migration_lock(engine):
        if revision == "head" and is_current(engine):
            return False
        command.upgrade(alembic_config(engine), revision)
        return True


def downgrade(engine: Engine, revision: str) -> None:
    with migration_lock(engine):
        command.downgrade(alembic_config(engine), revision)
