"""The daemon's own health is told (issue 40): rounds failing ``round_failures`` times in a row
(once per run of failures), a lost leadership, prices gone stale (once per newest run)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import Notification, Run
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.mover.executor import LostLeadership
from spotopt.notify.outbox import body
from tests.mover_rows import T0, seed_markets


def _told(db: Database) -> list[dict[str, object]]:
    with db.session() as session:
        return [body(row) for row in session.scalars(select(Notification).order_by(Notification.id))]


def test_rounds_failing_in_a_row_are_told_once_per_run_and_a_lost_leadership_at_once(db: Database) -> None:
    clock = [T0]
    daemon = Daemon(db, None, DaemonSettings(round_failures=3), clock=lambda: clock[0])
    for _ in range(5):  # one run of five failures: told at the third
        clock[0] += timedelta(minutes=1)
        daemon.round_ended("poll", RuntimeError("database is locked"))
    daemon.round_ended("tick", RuntimeError("once"))  # another round's count is its own
    daemon.round_ended("poll", None)
    for _ in range(3):  # a new run after a success: told again
        clock[0] += timedelta(minutes=1)
        daemon.round_ended("poll", RuntimeError("database is locked"))
    daemon.round_ended("tick", LostLeadership("lost leadership before m3:launch"))
    told = _told(db)
    assert [(t["event"], t.get("round"), t.get("failures")) for t in told] == [
        ("daemon.rounds_failing", "poll", 3),
        ("daemon.rounds_failing", "poll", 3),
        ("daemon.leadership_lost", None, None),
    ]
    assert told[0]["reason"] == "RuntimeError: database is locked" and told[0]["job"] is None
    assert told[2]["reason"] == "lost leadership before m3:launch"


def test_stale_prices_are_told_once_per_newest_run(db: Database, tmp_path: Path) -> None:
    seed_markets(db)  # one ingest run, finished now (wall clock)
    provider = LocalProvider(tmp_path / "local")
    with db.session() as session:
        finished = session.scalar(select(Run.finished_at))
    assert finished is not None
    for hours in (23, 25, 30):
        Daemon(
            db,
            provider,
            DaemonSettings(prices_stale_h=24.0),
            clock=lambda h=hours: finished + timedelta(hours=h),
        ).tick()
    [told] = _told(db)
    assert told["event"] == "daemon.prices_stale" and told["last_run"] == "test"
    assert str(told["reason"]).startswith("no collector or import has succeeded since")
