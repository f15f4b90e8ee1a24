"""A failed training process is retried from its newest verified checkpoint as the job's retry
policy says (issue 21, finding 2): an OOM-like kill (137) resumes and the weights come out as
an uninterrupted run's; a missing command (127) fails at once with its status and log; retries
are bounded; ``jobs retry`` resumes a failed job. Real processes on the local provider."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from spotopt.clouds.local.provider import group_members
from spotopt.db.engine import Database
from spotopt.errors import InputError
from spotopt.mover import jobs as jobstore
from tests.helpers import cli
from tests.mover_world import World, a_day_ago, job_yaml, make_world, on_demand, spot, uninterrupted_weights


@pytest.fixture
def world(db: Database, tmp_path: Path) -> World:
    w = make_world(db, tmp_path, agent_env={"SPOTOPT_CHECKPOINT_EVERY": "0.2s"})
    w.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    yield w
    w.stop_all()


def _run(path: Path, command: str, retry: str | None = None) -> Path:
    """``path``'s job spec running ``command`` instead (and with ``retry`` when given)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    lines = [f"    run: {command}" if line.startswith("    run: ") else line for line in lines]
    if retry is not None:
        lines.append(f"    retry: {retry}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rounds_until(world: World, what: str, condition: Callable[[], bool]) -> None:
    """Run daemon ticks (a retried start waits for the next one) until ``condition`` holds."""

    def ticked() -> bool:
        if condition():
            return True
        world.daemon.tick()
        return False

    world.until(what, ticked, poll=False)


def _failed_reason(world: World, name: str = "mlp") -> str:
    return next(e.reason for e in jobstore.events(world.db, name) if e.to_state == "failed")


def test_an_oom_kill_is_retried_from_the_newest_verified_checkpoint(world: World, tmp_path: Path) -> None:
    jobstore.submit(world.db, job_yaml(tmp_path))
    world.hold("mlp", 60)
    world.daemon.tick()
    world.until("a verified checkpoint at step 60", lambda: world.job().checkpoint_step >= 60)
    (first,) = world.placements()
    runner = int(first.instance_id and _pid(world, first.instance_id))
    trainer = next(pid for pid in group_members(runner) if pid != runner)
    os.kill(trainer, signal.SIGKILL)  # what the kernel's OOM killer does
    world.until("a second placement", lambda: len(world.placements()) == 2)
    world.hold("mlp", 120)  # the relaunch may now progress past its checkpoint
    world.until(
        "the retry to run", lambda: world.job().state == "running" and world.moves()[-1].outcome == "done"
    )
    retry = next(e for e in jobstore.events(world.db, "mlp") if e.to_state == "recovering")
    assert retry.reason.startswith(
        "retry 1 of 3: the training process exited with status 137 (killed by SIGKILL"
    )
    assert "its log: " in retry.reason
    assert world.placements()[0].end_reason == "exited"
    world.release("mlp")
    world.until("the job to finish", lambda: world.job().state == "done")
    assert np.array_equal(np.load(tmp_path / "mlp-out" / "weights.npy"), uninterrupted_weights(tmp_path))


def _pid(world: World, instance_id: str) -> int:
    record = json.loads((world.tmp / "local" / "instances" / instance_id / "record.json").read_text())
    return int(record["pid"])


def test_a_missing_command_fails_at_once_with_its_status_and_log(
    world: World, tmp_path: Path, db_url: str
) -> None:
    code, _, err = cli("--db", db_url, "jobs", "logs", "nope")
    assert code == 2 and "no managed job named 'nope'" in err
    jobstore.submit(world.db, _run(job_yaml(tmp_path), "no-such-trainer-i21 --epochs 3"))
    _rounds_until(world, "the job to fail", lambda: world.job().state == "failed")
    reason = _failed_reason(world)
    assert "exited with status 127 (command not found)" in reason and "not retried" in reason
    log = Path(reason.split("its log: ")[1].split(" ")[0].rstrip(";"))
    assert "no-such-trainer-i21" in log.read_text(encoding="utf-8")
    world.daemon.tick()
    assert len(world.placements()) == 1  # not relaunched, not billed again
    for follow in ([], ["--follow"]):  # the placement has ended: --follow prints it and returns
        where = ["--state-dir", world.tmp / "local"]
        code, out, err = cli("--db", db_url, "jobs", "logs", "mlp", *where, *follow)
        assert code == 0 and "no-such-trainer-i21" in out, err
    code, _, err = cli("--db", db_url, "jobs", "logs", "mlp", "--state-dir", tmp_path)
    assert code == 2 and "give the --state-dir the daemon runs with" in err


def test_retries_are_bounded_and_jobs_retry_starts_a_new_run_of_them(
    world: World, tmp_path: Path, db_url: str
) -> None:
    jobstore.submit(world.db, _run(job_yaml(tmp_path), "/bin/sh -c 'exit 3'", retry="{max: 2}"))
    _rounds_until(world, "the job to fail", lambda: world.job().state == "failed")
    assert len(world.placements()) == 3  # the first try and two retries
    assert "exited with status 3 (after 2 retries); its log: " in _failed_reason(world)
    assert jobstore.resume(world.db, "mlp").state == "pending"
    with pytest.raises(InputError, match="only a failed or cancelled job can be retried"):
        jobstore.resume(world.db, "mlp")

    code, _, err = cli("--db", db_url, "jobs", "retry", "mlp")
    assert code == 2 and "is pending; only a failed or cancelled job can be retried" in err
    _rounds_until(world, "the job to fail again", lambda: world.job().state == "failed")
    assert len(world.placements()) == 6  # three more tries after the retry by hand
    code, out, err = cli("--db", db_url, "jobs", "retry", "mlp")
    assert code == 0 and "mlp: pending" in out, err


def test_a_retry_policy_limited_to_some_exit_codes_fails_on_the_others(world: World, tmp_path: Path) -> None:
    jobstore.submit(world.db, _run(job_yaml(tmp_path), "/bin/sh -c 'exit 1'", retry="{on_exit_codes: [137]}"))
    _rounds_until(world, "the job to fail", lambda: world.job().state == "failed")
    assert len(world.placements()) == 1
    assert "not in retry.on_exit_codes" in _failed_reason(world)


@pytest.mark.parametrize(
    ("retry", "field"),
    [
        ("{max: -1}", "retry.max"),
        ("{max: 1.5}", "retry.max"),
        ("{on_exit_codes: [0]}", "retry.on_exit_codes"),
    ],
)
def test_a_nonsense_retry_policy_is_refused(db: Database, tmp_path: Path, retry: str, field: str) -> None:
    with pytest.raises(InputError, match=field.replace(".", r"\.")):
        jobstore.submit(db, _run(job_yaml(tmp_path), "python train.py", retry=retry))
