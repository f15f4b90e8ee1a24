"""One acting daemon per database: the others stand by and take over when the leader dies.

Several ``spotopt daemon run`` processes may point at one database for high availability; two
acting at once would launch twice and fight over leases. So acting needs leadership, held as a
lock that the operating system or the server drops when the holder dies, so that no stale lock
outlives a crashed daemon and nobody has to guess a timeout:

- **PostgreSQL**: a session-level advisory lock (``pg_try_advisory_lock``) taken on a connection
  of its own, kept open for as long as we lead. The server drops the lock with the session: when
  the process dies, its connection breaks, or an administrator terminates the backend.
- **SQLite**: ``filelock`` on ``<database>.leader.lock`` (the mechanism ``db.writelock`` and
  ``db.migrate`` use for their own lock files); the kernel drops it when the process dies.

A leader can lose its lock while it runs (the backend is terminated, the network breaks, the lock
file is deleted). ``still_leader()`` checks that the lock is really still ours, and the executor
calls it before every side effect: a leader that lost the lock stops before its next one.

Who leads is recorded in the ``meta`` table (key ``mover_leader``, a JSON object with host, pid
and since), the same on both backends and readable by ``daemon status`` through ``read_leader``.
The record is advisory: the lock decides, and a leader that died leaves its record behind until
the next leader overwrites it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType

from filelock import FileLock, Timeout
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from spotopt.db.engine import Database, sqlite_path
from spotopt.db.models import Meta
from spotopt.errors import ConfigError

log = logging.getLogger("spotopt")

LEADER_KEY = "mover_leader"
"""The ``meta`` row that says who leads."""

ADVISORY_KEY = int.from_bytes(hashlib.sha256(b"spotopt mover leader").digest()[:8]) >> 1
"""The PostgreSQL advisory lock key: fixed, positive, and unlikely to collide with another
application's keys (advisory locks are per database, so other spotopt databases do not share it)."""


@dataclass(frozen=True)
class LeaderRecord:
    """Who leads: enough for a person to find the process (host and pid) and since when."""

    host: str
    pid: int
    since: datetime

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "since": self.since.isoformat()})

    @classmethod
    def from_json(cls, value: str) -> LeaderRecord:
        data = json.loads(value)
        return cls(host=str(data["host"]), pid=int(data["pid"]), since=datetime.fromisoformat(data["since"]))


class Leadership:
    """The right to act for one database. Not thread-safe: one daemon loop owns it (its rounds may
    run in different threads, one at a time).

    ``clock`` and ``sleep`` (monotonic seconds) are injectable so ``acquire``'s waiting can be
    tested without waiting.
    """

    def __init__(
        self,
        db: Database,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._db = db
        self._clock = clock
        self._sleep = sleep
        self._record: LeaderRecord | None = None
        self._pg_engine: Engine | None = None
        self._pg_conn: Connection | None = None
        self._file_lock: FileLock | None = None
        self._lock_path: Path | None = None
        self._lock_inode: int | None = None
        if db.dialect == "sqlite":
            path = sqlite_path(db.engine.url.render_as_string(hide_password=False))
            if path is None:
                raise ConfigError(
                    "the daemon needs a database file or a PostgreSQL server to elect a leader; "
                    "an in-memory SQLite database has no file to lock: use sqlite:///PATH"
                )
            self._lock_path = Path(str(path) + ".leader.lock")
        elif db.dialect != "postgresql":
            raise ConfigError(f"leader election: backend {db.dialect!r} is not supported")

    @property
    def record(self) -> LeaderRecord | None:
        """Our own leader record while we lead, else None."""
        return self._record

    def try_acquire(self) -> bool:
        """Take leadership if nobody holds it; never waits. True when we lead afterwards."""
        if self._record is not None:
            return self.still_leader()
        taken = self._try_pg() if self._lock_path is None else self._try_file()
        if not taken:
            return False
        record = LeaderRecord(host=socket.gethostname(), pid=os.getpid(), since=datetime.now(UTC))
        try:
            with self._db.session() as session:
                session.merge(Meta(key=LEADER_KEY, value=record.to_json()))
        except BaseException:
            self._drop_lock()
            raise
        self._record = record
        log.info("leader: this process leads (host %s, pid %s)", record.host, record.pid)
        return True

    def acquire(self, timeout_s: float | None = None, poll_s: float = 2.0) -> bool:
        """Wait up to ``timeout_s`` (None: for ever) for leadership, trying every ``poll_s``.

        True when we lead, False when the time ran out. A standby daemon calls this: it takes
        over within ``poll_s`` of the leader's death.
        """
        if poll_s <= 0:
            raise ConfigError(f"poll_s: {poll_s!r} must be > 0")
        deadline = None if timeout_s is None else self._clock() + timeout_s
        told = False
        while not self.try_acquire():
            now = self._clock()
            if deadline is not None and now >= deadline:
                return False
            if not told:
                current = read_leader(self._db)
                log.info(
                    "leader: another daemon leads (%s); standing by",
                    "unknown" if current is None else f"host {current.host}, pid {current.pid}",
                )
                told = True
            self._sleep(poll_s if deadline is None else max(0.0, min(poll_s, deadline - now)))
        return True

    def still_leader(self) -> bool:
        """Is the lock still ours? Checked before every side effect; once False, stays False."""
        if self._record is None:
            return False
        held = self._pg_holds() if self._lock_path is None else self._file_holds()
        if not held:
            log.warning("leader: lost the leader lock; this process stops acting")
            self._drop_lock(lost=True)
            self._record = None
        return held

    def release(self) -> None:
        """Give up leadership (idempotent) and clear our record if it is still the current one."""
        record = self._record
        self._drop_lock()
        self._record = None
        if record is None:
            return
        with self._db.session() as session:
            row = session.get(Meta, LEADER_KEY)
            if row is not None and LeaderRecord.from_json(row.value) == record:
                session.delete(row)

    def __enter__(self) -> Leadership:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    # PostgreSQL: a session advisory lock on a connection of our own (no pool: returning a
    # connection that holds the lock to a pool would hand the lock to whoever gets it next).

    def _try_pg(self) -> bool:
        engine = create_engine(self._db.engine.url, poolclass=NullPool, isolation_level="AUTOCOMMIT")
        try:
            conn = engine.connect()
            taken = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": ADVISORY_KEY}).scalar())
        except BaseException:
            engine.dispose()
            raise
        if not taken:
            conn.close()
            engine.dispose()
            return False
        self._pg_engine, self._pg_conn = engine, conn
        return True

    def _pg_holds(self) -> bool:
        assert self._pg_conn is not None
        query = text(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND pid = pg_backend_pid() AND database = (SELECT oid FROM pg_database"
            " WHERE datname = current_database()) AND classid = :hi AND objid = :lo AND objsubid = 1)"
        )
        try:
            params = {"hi": ADVISORY_KEY >> 32, "lo": ADVISORY_KEY & 0xFFFFFFFF}
            return bool(self._pg_conn.execute(query, params).scalar())
        except DBAPIError:  # the connection broke or the backend was terminated: the lock is gone
            return False

    # SQLite: the lock file; held only while its inode is the one we locked (a deleted and
    # re-created file could be locked by another process).

    def _try_file(self) -> bool:
        assert self._lock_path is not None
        # Not thread-local: the daemon's rounds run in the scheduler's worker threads, one at a time.
        lock = FileLock(str(self._lock_path), thread_local=False)
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return False
        self._file_lock = lock
        self._lock_inode = self._lock_path.stat().st_ino
        return True

    def _file_holds(self) -> bool:
        assert self._file_lock is not None and self._lock_path is not None
        try:
            inode = self._lock_path.stat().st_ino
        except FileNotFoundError:
            return False
        return self._file_lock.is_locked and inode == self._lock_inode

    def _drop_lock(self, lost: bool = False) -> None:
        if self._pg_conn is not None:
            try:
                if not lost:
                    # Unlock explicitly: the session ends asynchronously after close(), and a
                    # standby that tries right after a release must find the lock free.
                    self._pg_conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": ADVISORY_KEY})
                self._pg_conn.close()
            except SQLAlchemyError:  # the session is gone already, and with it the lock
                self._pg_conn.invalidate()
            self._pg_conn = None
        if self._pg_engine is not None:
            self._pg_engine.dispose()
            self._pg_engine = None
        if self._file_lock is not None:
            self._file_lock.release(force=True)
            self._file_lock = None
            self._lock_inode = None


def read_leader(db: Database) -> LeaderRecord | None:
    """The last leader recorded for ``db`` (for ``daemon status``); None if none was recorded."""
    with db.session() as session:
        row = session.get(Meta, LEADER_KEY)
        return None if row is None else LeaderRecord.from_json(row.value)
