"""Retries count "in a row" (issue 36): a try that wrote a verified checkpoint past where it
started numbers the next retry from 1 again, so a job that crashes now and then after real
training is not failed after ``retry.max`` crashes in all. Real processes on the local provider
and a real daemon's rounds."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from spotopt.clouds.local.provider import group_members
from spotopt.db.engine import Database
from spotopt.db.models import ManagedJob
from spotopt.mover import jobs as jobstore
from tests.mover_world import World, a_day_ago, job_yaml, make_world, on_demand, spot


@pytest.fixture
def world(db: Database, tmp_path: Path) -> World:
    w = make_world(db, tmp_path, agent_env={"SPOTOPT_CHECKPOINT_EVERY": "0.2s"})
    w.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    yield w
    w.stop_all()


def _kill_trainer(world: World) -> None:
    """SIGKILL the training process of the job's newest placement (as the OOM killer would)."""
    newest = world.placements()[-1]
    assert newest.instance_id is not None
    record = world.tmp / "local" / "instances" / newest.instance_id / "record.json"
    runner = int(json.loads(record.read_text(encoding="utf-8"))["pid"])
    os.kill(next(pid for pid in group_members(runner) if pid != runner), signal.SIGKILL)


def _running_past(world: World, placements: int, step: int) -> bool:
    job = world.job()
    return (
        len(world.placements()) == placements
        and job.state == "running"
        and job.checkpoint_step >= step
        and world.moves()[-1].outcome == "done"
    )


def _retries(world: World) -> list[str]:
    return [e.reason for e in jobstore.events(world.db, "mlp") if e.reason.startswith(jobstore.RETRY_REASON)]


def test_a_crash_after_a_try_that_made_progress_counts_from_one_again(world: World, tmp_path: Path) -> None:
    spec = job_yaml(tmp_path)
    spec.write_text(
        spec.read_text(encoding="utf-8").rstrip("\n") + "\n    retry: {max: 1}\n", encoding="utf-8"
    )
    jobstore.submit(world.db, spec)
    world.hold("mlp", 30)
    world.daemon.tick()
    world.until("a checkpoint at step 30", lambda: _running_past(world, 1, 30))
    _kill_trainer(world)
    world.hold("mlp", 60)  # the retry trains on from step 30: progress
    world.until("the retry to checkpoint step 60", lambda: _running_past(world, 2, 60))
    _kill_trainer(world)
    world.until(
        "the second crash to be handled",
        lambda: world.job().state == "failed" or len(world.placements()) == 3,
    )
    assert world.job().state != "failed", _retries(world)
    reasons = _retries(world)
    assert len(reasons) == 2
    assert all(r.startswith("retry 1 of 1: the training process exited with status 137") for r in reasons)
    with world.db.session() as session:
        job = session.get(ManagedJob, world.job().id)
        assert job is not None
        assert jobstore.retries_in_a_row(session, job) == 1
