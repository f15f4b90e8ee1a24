"""``spotopt db``: schema operations for operators of a shared (PostgreSQL) database."""

from __future__ import annotations

import typer
from sqlalchemy.exc import DatabaseError, OperationalError

from spotopt.cli.common import state
from spotopt.db import migrate
from spotopt.db.engine import make_engine
from spotopt.history.setup import connect_error, not_a_database, upgrade_history
from spotopt.render import say
from spotopt.settings import Settings

app = typer.Typer(no_args_is_help=True, help="Database schema: upgrade and show the revision.")


@app.command()
def upgrade(ctx: typer.Context) -> None:
    """Apply pending migrations (under a lock) and sync the bundled catalog."""
    before, after = upgrade_history(state(ctx).db_url)
    if before == after:
        say(f"schema already at {after}")
    else:
        say(f"schema upgraded from {before or 'empty'} to {after}")


@app.command()
def current(ctx: typer.Context) -> None:
    """Print the schema revision of the database and the one this spotopt needs."""
    engine = make_engine(Settings().resolved_db_url(state(ctx).db_url))
    try:
        cur, head = migrate.current_revision(engine), migrate.head_revision(engine)
    except OperationalError as exc:
        raise connect_error(engine, exc) from exc
    except DatabaseError as exc:  # a file SQLite cannot read, or a damaged one
        raise not_a_database(engine, exc) from exc
    finally:
        engine.dispose()
    status = "up to date" if cur == head else "needs `spotopt db upgrade`"
    say(f"current: {cur or 'empty'}  head: {head}  ({status})")
