"""Two daemons on one database (PostgreSQL: an advisory lock; SQLite: a lock file): the leader
is SIGKILLed in the middle of a make-before-break move, the standby takes over, finishes the move
and the job, and the two never act at once.

Each driver (``tests.fault_driver --leader``) takes ``Leadership`` before acting and hands
``still_leader`` to its daemon; every event line carries its time and pid, which is how the test
tells who acted when.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from spotopt.db.models import JournalEntry
from spotopt.history.setup import open_history
from spotopt.mover.eventlog import parse
from tests.fault_harness import (
    RUN_LIMIT_S,
    FaultWorld,
    Reference,
    check,
    new_world,
    processes,
    reference_run,
    steer_until,
)

KILL_AT = ("m2:stop-old", "after")
"""Inside the voluntary move: the old placement was asked to checkpoint and stop, the journal
does not know yet, the lease has not moved."""
SIDE_EFFECTS = {
    "launch",
    "stop-old",
    "grant",
    "terminate-old",
    "terminate-new",
    "terminate-leaked",
    "terminate-ended",
}


@pytest.fixture
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return reference_run(tmp_path_factory.mktemp("reference"))


def events(world: FaultWorld) -> list[dict[str, str]]:
    if not world.events.exists():
        return []
    return [parse(line) for line in world.events.read_text(encoding="utf-8").splitlines()]


def test_the_standby_takes_over_a_move_when_the_leader_dies(
    db_url: str, tmp_path: Path, reference: Reference
) -> None:
    world = new_world(db_url, tmp_path)
    deadline = time.monotonic() + RUN_LIMIT_S
    try:
        with processes() as procs:
            leader = procs.start(world, "--leader", "--crash", ":".join(KILL_AT))
            steer_until(
                world,
                lambda: any(e["event"] == "leader" and e["pid"] == str(leader.pid) for e in events(world)),
                deadline,
            )
            standby = procs.start(world, "--leader")  # waits for the lock
            steer_until(world, lambda: standby.poll() is not None, deadline)
            leader.wait()
    finally:
        world.stop_all()
    assert leader.returncode == -9 and standby.returncode == 0

    lines = events(world)
    ours = [e for e in lines if e["pid"] == str(leader.pid)]
    theirs = [e for e in lines if e["pid"] == str(standby.pid)]
    assert len(ours) + len(theirs) == len(lines)
    (crash,) = [e for e in ours if e["event"] == "crash"]
    died = float(crash["t"])
    # Never both acting: the leader's last line is its crash; the standby's first line is taking
    # the lock, after that, and every side effect it made came later still.
    assert ours[-1] is crash and max(float(e["t"]) for e in ours) == died
    assert theirs[0]["event"] == "leader" and float(theirs[0]["t"]) > died
    assert all(float(e["t"]) > died for e in theirs)
    assert {("launch", "2")} <= {(e["event"], e.get("move")) for e in ours if e["event"] in SIDE_EFFECTS}
    # The standby finished the leader's move: the request the leader sent was answered (the old
    # agent stopped), so it was not sent again, the lease moved and the old instance ended.
    # (Had it taken over before the agent stopped, it would have re-sent the same request, once.)
    done_by_standby = [(e["event"], e.get("move")) for e in theirs if e["event"] in SIDE_EFFECTS]
    assert done_by_standby.count(("stop-old", "2")) <= 1
    assert [d for d in done_by_standby if d != ("stop-old", "2")][:2] == [
        ("grant", "2"),
        ("terminate-old", "2"),
    ]
    assert {"event": "move-done", "move": "2"}.items() <= next(
        e for e in theirs if e["event"] == "move-done" and e["move"] == "2"
    ).items()

    # The journal: every step once, done; the one the leader died in was begun by it and
    # finished by the standby under the same key, not done a second time.
    db = open_history(db_url)
    try:
        with db.session() as session:
            entries = list(session.scalars(select(JournalEntry).order_by(JournalEntry.id)))
    finally:
        db.dispose()
    keys = [e.key for e in entries]
    assert len(keys) == len(set(keys)) and {e.status for e in entries} == {"done"}
    (stop_old,) = [e for e in entries if e.key == KILL_AT[0]]
    assert stop_old.finished_at is not None
    assert stop_old.started_at.timestamp() < died < stop_old.finished_at.timestamp()
    assert check(world, reference).problems() == {}
