"""A recovery after the training process was killed (exit 137, what the kernel's OOM killer
does) is labelled by what it was, a retry, not "preempted" (issue 36, item 23); a real
preemption's recovery keeps its label (tests/test_daemon_local.py). Real processes on the local
provider."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from spotopt.clouds.local.provider import group_members
from spotopt.db.engine import Database
from spotopt.mover import jobs as jobstore
from tests.mover_world import a_day_ago, job_yaml, make_world, on_demand, spot


def test_a_recovery_after_an_oom_kill_is_a_retry_not_a_preemption(db: Database, tmp_path: Path) -> None:
    world = make_world(db, tmp_path)
    try:
        world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
        jobstore.submit(world.db, job_yaml(tmp_path))
        world.hold("mlp", 20)
        world.daemon.tick()
        world.until("step 20", lambda: world.job().state == "running" and world.job().steps >= 20)
        (first,) = world.placements()
        record = tmp_path / "local" / "instances" / str(first.instance_id) / "record.json"
        runner = int(json.loads(record.read_text(encoding="utf-8"))["pid"])
        os.kill(next(pid for pid in group_members(runner) if pid != runner), signal.SIGKILL)
        world.until("the relaunch", lambda: len(world.moves()) == 2)
        recover = world.moves()[-1]
        assert recover.kind == "recover"
        assert recover.reason.startswith("retry: ") and "preempted" not in recover.reason
        assert world.placements()[0].end_reason == "exited"
    finally:
        world.stop_all()
