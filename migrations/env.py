"""Alembic environment: the engine comes from ``config.attributes`` (spotopt) or the settings (CLI)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from spotopt.db.engine import make_engine
from spotopt.db.models import Base
from spotopt.settings import Settings

config = context.config


def _engine() -> Engine:
    engine = config.attributes.get("engine")
    if engine is not None:
        return engine
    # The developer CLI (`alembic check`, `alembic revision`) has no alembic.ini: the URL comes
    # from SPOTOPT_DB_URL or the default, like every spotopt command.
    return make_engine(Settings().resolved_db_url())


def run_migrations_online() -> None:
    engine = _engine()
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=connection.dialect.name == "sqlite",
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    raise SystemExit("spotopt migrations run online only: use `spotopt db upgrade`.")
run_migrations_online()
