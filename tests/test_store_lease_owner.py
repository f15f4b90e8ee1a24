"""One store, one database's job (issue 36, item 19): two databases given the same job file (the
same name and checkpoint store) each granted their epoch 1, so two trainers trained into one
store at once. The lease now names the database that granted it, and another database's grant
is refused in one line that names the store and how to free it. Real processes on the local
provider, two SQLite histories (and the fixture's backend for the first)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotopt.checkpoints import Lease, LeaseHeldError, Location, grant_lease, read_lease
from spotopt.db.engine import Database
from spotopt.db.identity import database_id_of
from spotopt.history.setup import open_history
from spotopt.mover import jobs as jobstore
from spotopt.mover.executor import job_location
from tests.mover_world import World, a_day_ago, job_yaml, make_world, on_demand, spot

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_lease_another_database_holds_is_not_granted_over(tmp_path: Path) -> None:
    loc = Location(f"file://{tmp_path}")
    first = grant_lease(loc, "mlp", T0, epoch=1, database="a" * 32)
    assert (first.epoch, first.database) == (1, "a" * 32)
    assert read_lease(loc, "mlp") == first
    assert grant_lease(loc, "mlp", T0, epoch=1, database="a" * 32) == first  # idempotent for its holder
    with pytest.raises(LeaseHeldError) as refused:
        grant_lease(loc, "mlp", T0, epoch=1, database="b" * 32)
    message = str(refused.value)
    assert "id aaaaaaaaaaaa, epoch 1" in message and f"delete file://{tmp_path}/mlp/lease.json" in message
    assert "\n" not in message
    assert read_lease(loc, "mlp") == first
    assert grant_lease(loc, "mlp", T0, epoch=2, database="a" * 32).epoch == 2  # its holder moves on
    # A lease without a database (``spotopt agent run``, or written before leases named one) is
    # taken over by the first daemon that grants, which then holds it.
    other = Location(f"file://{tmp_path / 'old'}")
    assert grant_lease(other, "mlp", T0) == Lease("mlp", 1, T0, frozenset())
    assert grant_lease(other, "mlp", T0, epoch=2, database="b" * 32).database == "b" * 32


@pytest.fixture
def two(db: Database, tmp_path: Path) -> Iterator[tuple[World, World]]:
    """Two histories, each with the same prices and the same job file submitted."""
    second = open_history(f"sqlite:///{tmp_path / 'second.sqlite'}")
    worlds = (make_world(db, tmp_path), make_world(second, tmp_path))
    try:
        for world in worlds:
            world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
            jobstore.submit(world.db, job_yaml(tmp_path))
        yield worlds
    finally:
        for world in worlds:
            world.stop_all()
        second.dispose()


def test_a_second_database_cannot_train_the_same_job_into_the_same_store(
    two: tuple[World, World], tmp_path: Path
) -> None:
    first, second = two
    first.hold("mlp", 20)
    first.daemon.tick()
    first.until("the first database's job to run", lambda: first.job().steps >= 20)
    loc = job_location(first.job())

    second.daemon.tick()
    assert second.job().state == "failed"
    assert second.placements() == []  # refused before any launch: nothing trains, nothing bills
    reason = next(e.reason for e in jobstore.events(second.db, "mlp") if e.to_state == "failed")
    assert f"checkpoint store {loc.url}: job mlp's lease is held by another spotopt database" in reason
    assert f"delete {loc.url}/mlp/lease.json" in reason and "\n" not in reason
    lease = read_lease(loc, "mlp")
    assert lease is not None and lease.database == database_id_of(first.db)
    second.daemon.tick()
    assert second.placements() == [] and first.job().state == "running"

    # Freed as the message says, once the first database's job is done: the second runs there.
    first.release("mlp")
    first.until("the first database's job to finish", lambda: first.job().state == "done")
    Path(tmp_path / "store" / "mlp" / "lease.json").unlink()
    jobstore.resume(second.db, "mlp")
    second.daemon.tick()
    assert [p.state for p in second.placements()] == ["running"]
    lease = read_lease(loc, "mlp")
    assert lease is not None and lease.database == database_id_of(second.db)
