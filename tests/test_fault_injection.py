"""Fault injection: the daemon SIGKILLed at every journaled step and at random times, restarted,
and the issue's invariants checked after every run (see ``tests.fault_harness``).

The crash points are not listed here: a clean run of the scenario journals its side effects
(``m<move>:<action>`` keys), and every key is killed before and after its call. Every point runs
on SQLite (spread over a few tests so ``-n 2`` shares them), three on PostgreSQL, plus a few
seeded random-time kills, the two training faults (the trainer SIGKILLed; a wrapper exiting
137 with a seeded daemon kill besides, on PostgreSQL) and a store that refuses writes during the
move; ``benchmarks/fault_injection.py`` is the long sweep.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from spotopt.clouds.common.base import LaunchSpec
from spotopt.clouds.local.provider import LOCAL_MARKET
from spotopt.mover.eventlog import parse
from tests.fault_harness import (
    FaultWorld,
    Findings,
    Outcome,
    Reference,
    check_processes,
    check_training,
    copy_sqlite,
    crash_points,
    journal_keys,
    kill_delays,
    new_world,
    play,
    reference_run,
)
from tests.mover_world import STEPS

SQLITE_SHARDS = 7
"""The SQLite crash points are spread over this many tests (about two points each)."""
PG_POINTS = 3
RANDOM_SEEDS = (1, 2, 3)
RANDOM_WINDOW_S = 12.0
"""Random kills land within this many seconds of a driver's start (a clean run takes ~9 s)."""


@dataclass(frozen=True)
class Clean:
    """The uninterrupted scenario: its journal keys (the crash points come from them)."""

    keys: list[str]
    outcome: Outcome
    seconds: float

    @property
    def points(self) -> list[tuple[str, str]]:
        return crash_points(self.keys)


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    return reference_run(tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="session")
def clean(sqlite_template: Path, tmp_path_factory: pytest.TempPathFactory, reference: Reference) -> Clean:
    tmp = tmp_path_factory.mktemp("clean")
    world = new_world(copy_sqlite(sqlite_template, tmp / "db.sqlite"), tmp / "world")
    started = time.monotonic()
    try:
        outcome = play(world, reference)
    finally:
        world.stop_all()
    return Clean(journal_keys(world.db_url), outcome, time.monotonic() - started)


def parse_events(path: Path) -> list[dict[str, str]]:
    """The drivers' event lines, parsed."""
    return [parse(line) for line in path.read_text().splitlines()]


def played(world: FaultWorld, reference: Reference, **how: object) -> Outcome:
    try:
        return play(world, reference, **how)  # type: ignore[arg-type]
    finally:
        world.stop_all()


def assert_crashed_at(world: FaultWorld, outcome: Outcome, point: tuple[str, str], clean: Clean) -> None:
    """The first driver died where asked, the restart finished the job, nothing was violated,
    and the journal holds exactly the clean run's steps, each done once."""
    assert outcome.crashed and outcome.runs[-1].returncode == 0, outcome.runs
    crashes = [e for e in parse_events(world.events) if e["event"] == "crash"]
    assert [(e["key"], e["phase"]) for e in crashes] == [point]
    assert outcome.findings.problems() == {}, point
    assert journal_keys(world.db_url) == clean.keys, point


def test_a_clean_run_passes_every_journaled_step(clean: Clean) -> None:
    # start (grant, launch), the make-before-break move (launch, stop-old, grant, terminate-old)
    # and the stop at the end (terminate-old): every kind of side effect the scenario must cover.
    actions = [key.split(":", 1)[1] for key in clean.keys]
    moves = [key.split(":", 1)[0] for key in clean.keys]
    assert actions == ["grant", "launch", "launch", "stop-old", "grant", "terminate-old", "terminate-old"]
    assert moves == ["m1", "m1", "m2", "m2", "m2", "m2", "m3"]
    assert len(clean.points) == 2 * len(clean.keys)
    assert clean.outcome.runs[0].returncode == 0 and not clean.outcome.crashed
    assert clean.outcome.findings.problems() == {}
    assert clean.outcome.findings.epochs == [1, 2]  # the job trained on two placements, in turn


@pytest.mark.parametrize("shard", range(SQLITE_SHARDS))
def test_a_crash_at_every_journaled_step_on_sqlite(
    shard: int, clean: Clean, reference: Reference, sqlite_template: Path, tmp_path: Path
) -> None:
    points = clean.points[shard::SQLITE_SHARDS]
    assert points  # every shard has work while the scenario journals ≥ SQLITE_SHARDS steps
    for i, point in enumerate(points):
        world = new_world(copy_sqlite(sqlite_template, tmp_path / f"p{i}" / "db.sqlite"), tmp_path / f"p{i}")
        assert_crashed_at(world, played(world, reference, crash=point), point, clean)


@pytest.mark.parametrize("which", range(PG_POINTS))
def test_a_crash_at_journaled_steps_on_postgresql(
    which: int, clean: Clean, reference: Reference, pg_url: str, tmp_path: Path
) -> None:
    point = clean.points[which * len(clean.points) // PG_POINTS + 1]  # spread over the three moves
    world = new_world(pg_url, tmp_path)
    assert_crashed_at(world, played(world, reference, crash=point), point, clean)


def assert_survives_a_kill(world: FaultWorld, reference: Reference, seed: int) -> None:
    """The first driver is SIGKILLed after a seeded delay; wherever it landed, the restarted
    drivers finish the job with every invariant intact."""
    (delay,) = kill_delays(seed, 1, RANDOM_WINDOW_S)
    outcome = played(world, reference, kill_after_s=delay)
    assert outcome.runs[-1].returncode == 0
    assert outcome.findings.problems() == {}, (delay, outcome.runs)


@pytest.mark.parametrize("seed", RANDOM_SEEDS)
def test_a_kill_at_a_random_time_on_sqlite(
    seed: int, reference: Reference, sqlite_template: Path, tmp_path: Path
) -> None:
    world = new_world(copy_sqlite(sqlite_template, tmp_path / "db.sqlite"), tmp_path)
    assert_survives_a_kill(world, reference, seed)


def test_a_kill_at_a_random_time_on_postgresql(reference: Reference, pg_url: str, tmp_path: Path) -> None:
    assert_survives_a_kill(new_world(pg_url, tmp_path), reference, seed=100)


def survived(reference: Reference, sqlite_template: Path, tmp_path: Path, fault: str) -> Outcome:
    """``fault`` played on SQLite with no daemon kill: one driver ended the job, nothing broken."""
    world = new_world(copy_sqlite(sqlite_template, tmp_path / "db.sqlite"), tmp_path, fault=fault)
    outcome = played(world, reference)
    assert outcome.runs[-1].returncode == 0 and not outcome.crashed
    assert outcome.findings.problems() == {}, outcome.runs
    return outcome


def test_a_killed_trainer_is_retried_to_the_uninterrupted_result(
    reference: Reference, sqlite_template: Path, tmp_path: Path
) -> None:
    outcome = survived(reference, sqlite_template, tmp_path, "trainer-kill")
    assert outcome.findings.epochs == [1, 2, 3]  # the killed one, its retry, the moved one


def test_an_exit_137_and_a_daemon_kill_together_on_postgresql(
    reference: Reference, pg_url: str, tmp_path: Path
) -> None:
    (delay,) = kill_delays(200, 1, RANDOM_WINDOW_S)
    outcome = played(new_world(pg_url, tmp_path, fault="exit-137"), reference, kill_after_s=delay)
    assert outcome.runs[-1].returncode == 0
    assert outcome.findings.problems() == {}, (delay, outcome.runs)


def test_a_store_that_refuses_writes_during_a_move_is_waited_out(
    reference: Reference, sqlite_template: Path, tmp_path: Path
) -> None:
    outcome = survived(reference, sqlite_template, tmp_path, "store-errors")
    # The old placement trained on while the store refused its checkpoint, checkpointed once
    # the store took writes again, and the new one resumed there: one move, no retry.
    assert outcome.findings.epochs == [1, 2]
    refused = [e for e in parse_events(tmp_path / "events.log") if e["event"] == "job-error"]
    assert refused and all("PermissionError" in e["error"] for e in refused)
    assert (tmp_path / "store-restored").exists()


# -- the checks themselves catch what they are for ------------------------------------------------


def _write_log(world: FaultWorld, reference: Reference, rows: list[tuple[int, int]]) -> None:
    world.log.write_text("".join(f"{s} {reference.losses[s - 1].hex()} {e}\n" for s, e in rows))


def _manifest(world: FaultWorld, step: int, epoch: int) -> None:
    home = world.tmp / "store" / "mlp" / "checkpoints" / f"{step}-e{epoch}-x"
    home.mkdir(parents=True)
    (home / "manifest.json").write_text(json.dumps({"job": "mlp", "step": step, "epoch": epoch}))


def test_the_checks_see_overlapping_epochs_lost_progress_and_wrong_losses(
    reference: Reference, tmp_path: Path
) -> None:
    world = FaultWorld("sqlite://", tmp_path)
    steps = range(1, STEPS + 1)
    _write_log(world, reference, [(s, 1 if s <= 150 else 2) for s in steps])
    _manifest(world, 150, 1)
    fine = Findings()
    check_training(world, reference, fine)
    assert fine.overlaps == fine.lost_progress == [] and fine.epochs == [1, 2]

    # Epoch 1 trains once more after epoch 2 started: two placements at once.
    _write_log(world, reference, [(s, 1 if s <= 150 else 2) for s in steps] + [(151, 1)])
    overlapping = Findings()
    check_training(world, reference, overlapping)
    assert overlapping.overlaps == ["line 401: epoch 1 trained step 151 after 2"]

    # Two trainers of epoch 1 (a launch done twice), interleaved before the move.
    twice = [(s, 1) for s in range(1, 11)] + [(s, 1) for s in range(1, 151)] + [(s, 2) for s in steps[150:]]
    _write_log(world, reference, twice)
    doubled = Findings()
    check_training(world, reference, doubled)
    assert doubled.overlaps[0] == "line 11: epoch 1 trained step 1 twice" and len(doubled.overlaps) == 10

    _write_log(world, reference, [(s, 1) for s in range(1, 151)] + [(s, 2) for s in range(101, STEPS + 1)])
    lost = Findings()
    check_training(world, reference, lost)
    assert lost.lost_progress == ["epoch 2 resumed at step 100, older than the verified checkpoint 150"]

    # A step whose loss is not the uninterrupted run's (and no final weights at all).
    world.log.write_text(world.log.read_text().replace(reference.losses[9].hex(), (0.5).hex(), 1))
    wrong = Findings()
    check_training(world, reference, wrong)
    assert "epoch 1 step 10: loss differs from the uninterrupted run" in wrong.wrong_result
    assert any("final weights" in w for w in wrong.wrong_result)


def test_the_checks_see_an_orphaned_process(tmp_path: Path) -> None:
    world = FaultWorld("sqlite://", tmp_path)
    provider = world.provider
    spec = LaunchSpec(job="mlp", epoch=1, command=("sleep", "60"), checkpoint_uri=f"file://{tmp_path}")
    instance = provider.launch(spec, LOCAL_MARKET, "orphan")
    try:
        found = Findings()
        check_processes(world, found)
        assert len(found.orphans) == 2 and all(instance.instance_id in o for o in found.orphans)
    finally:
        provider.terminate(instance.instance_id, grace_s=0)
    after = Findings()
    check_processes(world, after)
    assert after.orphans == []


def test_the_checks_see_a_training_process_no_instance_record_knows(tmp_path: Path) -> None:
    world = FaultWorld("sqlite://", tmp_path)
    # The child says it runs before the check: right after the fork its command line is still
    # this interpreter's (the check once looked in that instant and found nothing).
    code = "import time; print('running', flush=True); time.sleep(60)"
    with subprocess.Popen(
        [sys.executable, "-c", code, str(world.log)], stdout=subprocess.PIPE, text=True
    ) as stray:
        try:
            assert stray.stdout is not None and stray.stdout.readline() == "running\n"
            found = Findings()
            check_processes(world, found)
            assert found.orphans == [f"pid {stray.pid}: a training process of this world still runs"]
        finally:
            stray.kill()
    after = Findings()
    check_processes(world, after)
    assert after.orphans == []
