"""The database's own id: which spotopt history a cloud resource belongs to.

Several spotopt databases can share one cloud account (a team's PostgreSQL and someone's
laptop SQLite, a what-if replay's throwaway copy). Everything the daemon launches is tagged with
the id of the database that launched it, so a leak sweep ends only what *this* database
launched, and idempotency keys can be made unique across databases.

The id is a random hex string kept in the ``meta`` table (key/value) under ``database_id``,
created on first use: no migration, and a database copied file by file keeps its id (a copy
*is* the same history; a replay that must not touch the original's instances launches nothing
real).
"""

from __future__ import annotations

import uuid

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from spotopt.db.engine import Database
from spotopt.db.models import Meta

DATABASE_ID_KEY = "database_id"


def stored_database_id(session: Session) -> str | None:
    """This database's id, or None while it has none: then nothing was ever launched from it
    (a launch creates it, ``database_id``), so no instance carries it. Reads only: what must
    change nothing (``spotopt daemon sweep --dry-run``) uses this."""
    return session.scalar(select(Meta.value).where(Meta.key == DATABASE_ID_KEY))


def database_id(session: Session) -> str:
    """This database's id, created in ``session``'s transaction on first use.

    Two processes creating it at once agree: the insert does nothing when the key exists
    (``ON CONFLICT DO NOTHING`` on SQLite and PostgreSQL), and the value read back is the one
    that was committed first."""
    stored = stored_database_id(session)
    if stored is not None:
        return stored
    insert = sqlite_insert if session.get_bind().dialect.name == "sqlite" else pg_insert
    session.execute(
        insert(Meta)
        .values(key=DATABASE_ID_KEY, value=uuid.uuid4().hex)
        .on_conflict_do_nothing(index_elements=[Meta.key])
    )
    created = session.scalar(select(Meta.value).where(Meta.key == DATABASE_ID_KEY))
    assert created is not None, "inserted or found just above"
    return created


def database_id_of(db: Database) -> str:
    """``database_id`` in a transaction of its own."""
    with db.session() as session:
        return database_id(session)
