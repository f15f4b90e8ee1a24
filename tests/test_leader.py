"""One leader per database, with real processes on SQLite and on a real PostgreSQL server.

Every process a test starts is tracked by its ``Popen`` and stopped in teardown; every wait is a
poll with a bounded deadline, so a slow machine makes a test slower, never flaky.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from spotopt.db.engine import Database
from spotopt.db.models import Meta
from spotopt.errors import ConfigError
from spotopt.history.setup import open_history
from spotopt.mover.leader import ADVISORY_KEY, LEADER_KEY, LeaderRecord, Leadership, read_leader

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 60.0
"""Upper bound for anything a test waits for; reached only when something is broken."""

# A daemon stand-in: waits up to argv[2] seconds for leadership, says what happened, then holds
# it until killed (or until its stdin closes).
HOLDER = """
import sys
from spotopt.history.setup import open_history
from spotopt.mover.leader import Leadership
lead = Leadership(open_history(sys.argv[1]))
ok = lead.acquire(timeout_s=float(sys.argv[2]), poll_s=0.05)
print("LEADER" if ok else "TIMEOUT", flush=True)
if ok:
    sys.stdin.read()
    lead.release()
"""


class Holders:
    """The holder processes of one test; all of them are stopped when the test ends."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, url: str, timeout_s: float) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, url, str(timeout_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=DEADLINE_S)
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()


@pytest.fixture
def holders() -> Iterator[Holders]:
    owned = Holders()
    yield owned
    owned.stop_all()


def line_of(proc: subprocess.Popen[bytes], within_s: float = DEADLINE_S) -> str:
    """The process's next output line, waiting at most ``within_s``."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], within_s)
    assert ready, f"process {proc.pid} said nothing within {within_s} s"
    return proc.stdout.readline().decode().strip()


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"not within {DEADLINE_S} s: {what}"
        time.sleep(0.05)


def test_second_process_waits_then_takes_over_when_the_leader_is_killed(
    db_url: str, db: Database, holders: Holders
) -> None:
    first = holders.start(db_url, timeout_s=DEADLINE_S)
    assert line_of(first) == "LEADER"
    leader = read_leader(db)
    assert leader is not None and leader.pid == first.pid

    # While the first one lives, another process cannot lead: it gives up after its timeout.
    refused = holders.start(db_url, timeout_s=0.5)
    assert line_of(refused) == "TIMEOUT"
    assert refused.wait(timeout=DEADLINE_S) == 0
    assert not Leadership(db).try_acquire()

    # A standby takes over once the leader dies without any chance to clean up.
    standby = holders.start(db_url, timeout_s=DEADLINE_S)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=DEADLINE_S)
    assert line_of(standby) == "LEADER"
    leader = read_leader(db)
    assert leader is not None and leader.pid == standby.pid


def test_release_hands_over_at_once_and_clears_the_record(db: Database) -> None:
    first, second = Leadership(db), Leadership(db)
    assert first.try_acquire() and first.still_leader()
    assert first.record is not None and read_leader(db) == first.record
    assert not second.try_acquire() and not second.still_leader()
    first.release()
    assert not first.still_leader() and read_leader(db) is None
    with second:
        assert second.try_acquire() and second.still_leader()
        assert read_leader(db) == second.record
    assert read_leader(db) is None
    first.release()  # idempotent


def test_release_keeps_a_newer_leaders_record(db: Database) -> None:
    """A leader that lost its lock must not erase the record of the one that replaced it."""
    lead = Leadership(db)
    assert lead.try_acquire() and lead.record is not None
    newer = LeaderRecord(host="other-host", pid=4242, since=lead.record.since)
    with db.session() as session:
        session.merge(Meta(key=LEADER_KEY, value=newer.to_json()))
    lead.release()
    assert read_leader(db) == newer


def test_terminated_backend_means_no_longer_leader(pg_url: str) -> None:
    db = open_history(pg_url)
    try:
        lead = Leadership(db)
        assert lead.try_acquire() and lead.still_leader()
        admin = create_engine(pg_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            killed = (
                conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
                        " AND classid = :hi AND objid = :lo AND objsubid = 1 AND granted"
                    ),
                    {"hi": ADVISORY_KEY >> 32, "lo": ADVISORY_KEY & 0xFFFFFFFF},
                )
                .scalars()
                .all()
            )
        admin.dispose()
        assert killed == [True]
        wait_until(lambda: not lead.still_leader(), "still_leader() turns False")
        assert not lead.still_leader()  # and stays False: it never reconnects on its own
        successor = Leadership(db)
        wait_until(successor.try_acquire, "another daemon takes over the freed lock")
        assert successor.still_leader()
        successor.release()
        lead.release()
    finally:
        db.dispose()


def test_deleted_lock_file_means_no_longer_leader(sqlite_db: Database) -> None:
    lead = Leadership(sqlite_db)
    assert lead.try_acquire() and lead.still_leader()
    lock_file = Path(str(sqlite_db.engine.url.database) + ".leader.lock")
    assert lock_file.exists()
    lock_file.unlink()
    assert not lead.still_leader()
    # The file is gone, so a new one can be locked: another daemon may lead now, and we do not.
    other = Leadership(sqlite_db)
    assert other.try_acquire()
    assert not lead.still_leader()
    other.release()


def test_acquire_polls_until_its_timeout_with_injected_clock(db: Database) -> None:
    holder = Leadership(db)
    assert holder.try_acquire()
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    waiting = Leadership(db, clock=lambda: now[0], sleep=sleep)
    assert waiting.acquire(timeout_s=5.0, poll_s=2.0) is False
    assert slept == [2.0, 2.0, 1.0] and now[0] == 5.0
    holder.release()
    assert waiting.acquire(timeout_s=5.0, poll_s=2.0) is True
    assert slept == [2.0, 2.0, 1.0]  # took it on the first try, without sleeping
    waiting.release()


def test_in_memory_sqlite_has_nothing_to_lock() -> None:
    db = open_history("sqlite://")
    try:
        with pytest.raises(ConfigError, match="in-memory SQLite database has no file to lock"):
            Leadership(db)
    finally:
        db.dispose()


def test_bad_poll_interval_is_refused(sqlite_db: Database) -> None:
    with pytest.raises(ConfigError, match="poll_s"):
        Leadership(sqlite_db).acquire(timeout_s=1.0, poll_s=0)
