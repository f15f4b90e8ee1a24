"""A managed job's progress history (``spotopt.mover.progress``): what is kept of the heartbeats
and what the dashboard's chart reads back, on SQLite and PostgreSQL. The executor's writing it
from real heartbeats is checked end to end in ``tests/test_daemon_local.py``."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from spotopt.db.engine import Database
from spotopt.db.models import JobProgress, ManagedJob
from spotopt.mover.progress import PROGRESS_EVERY, progress_points, record_progress
from spotopt.replay.harness import copy_history
from tests.mover_rows import T0, submit


def _kept(db: Database, job_id: int) -> list[tuple[int, int]]:
    with db.session() as session:
        rows = session.execute(
            select(JobProgress.epoch, JobProgress.steps)
            .where(JobProgress.job_id == job_id)
            .order_by(JobProgress.at)
        )
        return [(epoch, steps) for epoch, steps in rows]


def test_points_are_thinned_within_an_epoch_and_kept_at_each_new_one(db: Database, tmp_path: Path) -> None:
    job_id = submit(db, tmp_path)
    every = PROGRESS_EVERY
    beats = [  # (after T0, epoch, steps): heartbeats every 30 s would be denser still
        (0 * every, 1, 0),
        (every / 5, 1, 150),  # too soon after the last point: thinned
        (every, 1, 750),  # PROGRESS_EVERY after it: kept
        (every * 6 / 5, 2, 600),  # a new epoch, restarted from its checkpoint: kept at once
        (every * 7 / 5, 2, 750),
        (every * 11 / 5, 2, 1_350),
    ]
    for after, epoch, steps in beats:
        with db.session() as session:
            record_progress(session, job_id, epoch, steps, T0 + after)
    assert _kept(db, job_id) == [(1, 0), (1, 750), (2, 600), (2, 1_350)]


def test_the_chart_ends_on_the_job_row_s_newest_heartbeat(db: Database, tmp_path: Path) -> None:
    job_id = submit(db, tmp_path)
    with db.session() as session:
        job = session.get(ManagedJob, job_id)
        assert job is not None
        assert progress_points(session, job) == []  # never heard from
        record_progress(session, job_id, 1, 100, T0)
        job.steps, job.heartbeat_at = 100, T0
        assert progress_points(session, job) == [(T0, 100)]  # the row's beat is the point itself
        # A later heartbeat thinned away is still where the chart ends.
        job.steps, job.heartbeat_at = 160, T0 + timedelta(minutes=2)
        record_progress(session, job_id, 1, 160, job.heartbeat_at)
        assert progress_points(session, job) == [(T0, 100), (T0 + timedelta(minutes=2), 160)]


def test_a_replay_s_copy_of_the_history_leaves_the_progress_behind(db: Database, tmp_path: Path) -> None:
    """``job_progress`` is the daemon's own state, like the jobs its rows belong to: the daemon
    replay starts from the history without either (``MOVER_TABLES``)."""
    job_id = submit(db, tmp_path)
    with db.session() as session:
        record_progress(session, job_id, 1, 100, T0)
    copy = copy_history(db, tmp_path / "replay.sqlite")
    try:
        with copy.session() as session:
            assert session.scalars(select(JobProgress)).all() == []
            assert session.scalars(select(ManagedJob)).all() == []
    finally:
        copy.dispose()
