"""Idempotency keys carry the database's id and the job's (issue 21, finding 4): a fresh
database whose first job is named like an earlier database's gets an instance of its own, not
the earlier run's exited one back. Real processes on one local provider shared by both."""

from __future__ import annotations

from pathlib import Path

from spotopt.db.engine import Database
from spotopt.db.identity import database_id_of
from spotopt.mover import jobs as jobstore
from tests.mover_world import a_day_ago, job_yaml, make_world, on_demand, spot


def test_a_job_named_like_another_database_s_gets_its_own_instance(
    db: Database, sqlite_db: Database, tmp_path: Path
) -> None:
    first = make_world(db, tmp_path)
    (tmp_path / "second").mkdir()
    # one machine, one state directory, two histories
    second = make_world(sqlite_db, tmp_path / "second", provider=first.provider)
    try:
        for world in (first, second):
            world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
        jobstore.submit(db, job_yaml(tmp_path))
        first.daemon.tick()
        first.until("the first database's job to finish", lambda: first.job().state == "done")

        jobstore.submit(sqlite_db, job_yaml(tmp_path / "second"))
        second.daemon.tick()
        second.until("the second database's job to finish", lambda: second.job().state == "done")
        (ours,) = second.placements()
        (theirs,) = first.placements()
        assert ours.instance_id != theirs.instance_id
        assert [m.outcome for m in second.moves()] == ["done", "done"]  # started first time, then stopped
        assert database_id_of(sqlite_db)[:12] in ours.key and f"-j{second.job().id}-m" in ours.key
    finally:
        first.stop_all()
