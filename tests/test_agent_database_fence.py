"""Two databases, one store (issue 36, item 19): two daemons granting the same job's lease within
milliseconds both grant epoch 1 and the last write of ``lease.json`` wins. The agent's fence
checks the lease's database as well as its epoch (``SPOTOPT_DATABASE_ID``), so the trainer of
the database that lost the race writes nothing while the lease's own trainer goes on."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotopt.agent import EXIT_SUPERSEDED, Agent, AgentConfig
from spotopt.checkpoints import Location, grant_lease, list_checkpoints, read_lease
from spotopt.checkpoints.lease import LEASE_FILE

NOW = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _keep_sigterm() -> Iterator[None]:
    """Agents built here install their SIGTERM handler in the test process: put the old one back."""

    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def _agent(tmp_path: Path, database: str, messages: list[str]) -> Agent:
    config = AgentConfig.from_environ(
        {
            "SPOTOPT_JOB": "job",
            "SPOTOPT_EPOCH": "1",
            "SPOTOPT_DATABASE_ID": database,
            "SPOTOPT_CHECKPOINT_URI": f"file://{tmp_path / 'store'}",
            "SPOTOPT_CLOUD": "none",
            "SPOTOPT_SCRATCH_DIR": str(tmp_path / f"scratch-{database}"),
        }
    )
    return Agent(config, clock=NOW.timestamp, warn=messages.append, background=False)


def _save(agent: Agent, step: int) -> None:
    agent.progress(step)
    with agent.checkpoint(step) as d:
        (d / "state").write_text(str(step))


def test_the_trainer_of_the_database_that_lost_the_grant_race_writes_nothing(tmp_path: Path) -> None:
    loc = Location(f"file://{tmp_path / 'store'}")
    grant_lease(loc, "job", NOW, epoch=1, database="database-a")
    said_a: list[str] = []
    first = _agent(tmp_path, "database-a", said_a)
    first.resume()
    _save(first, 2)  # the lease is its own database's: it writes
    # Database B's daemon read the store before A's grant landed and writes its own epoch 1 last.
    (tmp_path / "store" / "job" / LEASE_FILE).unlink()
    grant_lease(loc, "job", NOW, epoch=1, database="database-b")
    lease = read_lease(loc, "job")
    assert lease is not None and (lease.epoch, lease.database) == (1, "database-b")
    second = _agent(tmp_path, "database-b", [])
    second.resume()
    _save(second, 5)
    before = sorted(c.name for c in list_checkpoints(loc, "job"))

    first.poll_once()  # the same epoch, but not its database's lease: superseded
    assert first.should_stop() and not first.should_checkpoint()
    with pytest.raises(SystemExit) as exited, first.checkpoint(3) as d:
        (d / "state").write_text("3")
    assert exited.value.code == EXIT_SUPERSEDED
    assert sorted(c.name for c in list_checkpoints(loc, "job")) == before
    assert any("held by another spotopt database (id database-b" in m for m in said_a)

    _save(second, 6)  # the lease's own trainer goes on
    assert max(c.step for c in list_checkpoints(loc, "job")) == 6


def test_an_agent_without_a_database_id_is_fenced_by_the_epoch_alone(tmp_path: Path) -> None:
    loc = Location(f"file://{tmp_path / 'store'}")
    grant_lease(loc, "job", NOW, epoch=1, database="database-b")
    config = AgentConfig.from_environ(
        {
            "SPOTOPT_JOB": "job",
            "SPOTOPT_EPOCH": "1",
            "SPOTOPT_CHECKPOINT_URI": f"file://{tmp_path / 'store'}",
            "SPOTOPT_CLOUD": "none",
            "SPOTOPT_SCRATCH_DIR": str(tmp_path / "scratch"),
        }
    )
    agent = Agent(config, clock=NOW.timestamp, warn=lambda _m: None, background=False)
    agent.resume()
    _save(agent, 2)
    assert [c.step for c in list_checkpoints(loc, "job")] == [2]
