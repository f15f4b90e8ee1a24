"""Never two trainers (issue 21, finding 3): a daemon whose local provider does not know the
running instance (started with another ``--state-dir``) believes the store, where the agent
still writes its heartbeat, and launches nothing beside it; once the agent falls silent the
placement is lost and recovered. Real processes, a real store; SQLite and PostgreSQL."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon
from tests.mover_world import AGENT_ENV, a_day_ago, job_yaml, make_world, on_demand, spot


def test_a_daemon_with_another_state_dir_does_not_launch_a_second_trainer(
    db: Database, tmp_path: Path
) -> None:
    world = make_world(db, tmp_path)
    try:
        world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
        jobstore.submit(db, job_yaml(tmp_path))
        world.hold("mlp", 30)
        world.daemon.tick()
        world.until("the job to run", lambda: world.job().steps >= 30)
        elsewhere = LocalProvider(tmp_path / "other-state-dir", grace_s=5.0)
        standby = Daemon(db, elsewhere, world.settings, agent_env=AGENT_ENV)
        for _ in range(3):
            standby.tick()
            standby.poll()
        assert [p.state for p in world.placements()] == ["running"]
        assert world.job().state == "running"
        assert elsewhere.list_instances() == []
        # The agent falls silent (its instance really ended): now the placement is lost.
        (placement,) = world.placements()
        world.provider.terminate(placement.instance_id or "")
        timeouts = replace(world.settings.timeouts, silent_s=0.0)
        hasty = Daemon(db, elsewhere, replace(world.settings, timeouts=timeouts), agent_env=AGENT_ENV)
        hasty.poll()
        assert world.placements()[0].state == "ended"
    finally:
        world.stop_all()
        other = LocalProvider(tmp_path / "other-state-dir")
        for instance in other.list_instances():
            other.terminate(instance.instance_id)
