"""One spotopt writer per SQLite file at a time; the others wait visibly, up to a bound.

SQLite lets one transaction write at a time. A second writer gets ``database is locked`` once
its busy timeout (30 s) runs out, while a large import holds the write lock for minutes. So the
first write statement of a transaction takes a lock file next to the database (released at
commit or rollback); a process that finds it taken logs that another spotopt process is
writing and waits up to ``WRITE_WAIT_S`` before giving up with ``DatabaseBusyError``.
Readers never take it (WAL readers do not block writers). PostgreSQL needs none of this.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout
from sqlalchemy import Engine, event

from spotopt.errors import DatabaseBusyError

WRITE_WAIT_S = 600.0
"""How long a writer waits for another spotopt process's write transaction to end."""

_WRITES = ("INSERT", "UPDATE", "DELETE", "REPLACE", "CREATE", "DROP", "ALTER")
_HELD = "spotopt_write_lock"
log = logging.getLogger("spotopt")


def install(engine: Engine, database: Path) -> None:
    """Make every write transaction on ``engine`` hold ``<database>.write.lock`` until it ends."""
    lock = FileLock(str(database) + ".write.lock")

    def before_execute(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if conn.info.get(_HELD) or not statement.lstrip()[:7].upper().startswith(_WRITES):
            return
        try:
            _acquire(lock, database)
        except OSError:  # no lock file possible (read-only directory): SQLite's own locking decides
            return
        conn.info[_HELD] = True

    def release(info: dict[str, Any]) -> None:
        if info.pop(_HELD, False):
            lock.release()

    event.listen(engine, "before_cursor_execute", before_execute)
    event.listen(engine, "commit", lambda conn: release(conn.info))
    event.listen(engine, "rollback", lambda conn: release(conn.info))
    # A connection returned to the pool without commit or rollback through the Connection
    event.listen(engine.pool, "checkin", lambda _dbapi, record: release(record.info))


def _acquire(lock: FileLock, database: Path) -> None:
    try:
        lock.acquire(timeout=0)
        return
    except Timeout:
        pass
    log.warning(
        "another spotopt process is writing to %s; waiting up to %s for it to finish",
        database,
        _minutes(WRITE_WAIT_S),
    )
    try:
        lock.acquire(timeout=WRITE_WAIT_S)
    except Timeout:
        raise DatabaseBusyError(
            f"another spotopt process kept writing to {database} for {_minutes(WRITE_WAIT_S)}; "
            "nothing was written: run this again when it has finished"
        ) from None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"
