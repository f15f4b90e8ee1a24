"""A placement that never makes progress is a failed try of its job (issue 36, item 17): a
``run`` that never starts the agent (``/bin/true --x`` exits 0 at once, ``sleep 600`` lives on
silently) was relaunched round after round, each launch billed, the retry limit never applied.
Now each such placement is terminated and counted by the job's retry policy; past ``retry.max``
the job is failed with a reason naming the cause and the log. A launch refused for capacity is
not a try. Real processes on the local provider, in process and through the installed
``spotopt daemon run``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon
from spotopt.types import MarketKey
from tests.helpers import cli, strict_json
from tests.mover_world import AGENT_ENV, World, a_day_ago, job_yaml, make_world, on_demand, spot

SPOTOPT = Path(sys.executable).parent / "spotopt"
LIMIT_S = 180.0
"""Only a broken build waits this long for the job to fail."""


@pytest.fixture
def world(db: Database, tmp_path: Path) -> World:
    w = make_world(db, tmp_path)
    w.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    yield w
    w.stop_all()


def _never_reporting(tmp: Path, command: str, retry: str = "{max: 2}") -> Path:
    """The example job file with ``run: command``: a process that never starts the agent."""
    path = job_yaml(tmp)
    lines = [
        f"    run: {command}" if line.startswith("    run: ") else line
        for line in path.read_text().splitlines()
    ]
    path.write_text("\n".join([*lines, f"    retry: {retry}"]) + "\n", encoding="utf-8")
    return path


def _with_timeouts(world: World, provider: LocalProvider | None = None, **timeouts: float) -> None:
    """The world's daemon with these ``Timeouts`` (and ``provider``, when given)."""
    world.settings = replace(world.settings, timeouts=replace(world.settings.timeouts, **timeouts))
    world.provider = provider or world.provider
    world.daemon = Daemon(world.db, world.provider, world.settings, agent_env=AGENT_ENV)


def _ticks_until_failed(world: World) -> None:
    def ticked() -> bool:
        if world.job().state == "failed":
            return True
        world.daemon.tick()
        return False

    world.until("the job to fail", ticked, poll=False)


def _failed_reason(db: Database) -> str:
    return next(e.reason for e in jobstore.events(db, "mlp") if e.to_state == "failed")


@pytest.mark.parametrize(
    ("command", "cause"),
    [
        ("/bin/true --x", "the training process exited with status 0"),
        ("sleep 600", "within 1 s (2 × the launch timeout); terminated"),
    ],
)
def test_a_placement_without_progress_is_a_failed_try_and_the_job_fails_after_its_retries(
    world: World, tmp_path: Path, command: str, cause: str
) -> None:
    _with_timeouts(world, launch_s=0.5)
    jobstore.submit(world.db, _never_reporting(tmp_path, command))
    _ticks_until_failed(world)
    placements = world.placements()
    assert len(placements) == 3  # the first try and two retries, then no more launches
    assert {(p.state, p.end_reason) for p in placements} == {("ended", "terminated")}
    assert not any(world.provider.status(p.instance_id or "").state.is_live for p in placements)
    retries = [e.reason for e in jobstore.events(world.db, "mlp") if e.reason.startswith("retry ")]
    assert [r[:11] for r in retries] == ["retry 1 of ", "retry 2 of "]
    reason = _failed_reason(world.db)
    assert "the new placement's agent never reported" in reason and cause in reason
    assert "(after 2 retries); its log: " in reason
    world.daemon.tick()
    assert len(world.placements()) == 3 and world.job().state == "failed"


def test_a_launch_refused_for_capacity_is_not_a_try(world: World, tmp_path: Path) -> None:
    refusals = [3]

    def capacity(_market: MarketKey) -> bool:
        refusals[0] -= 1
        return refusals[0] < 0

    local = LocalProvider(tmp_path / "local", grace_s=5.0, capacity=capacity)
    _with_timeouts(world, provider=local, launch_s=0.5, unavailable_s=0.0)
    jobstore.submit(world.db, _never_reporting(tmp_path, "/bin/true --x", retry="{max: 1}"))
    _ticks_until_failed(world)
    ends = [p.end_reason for p in world.placements()]
    assert ends == ["capacity"] * 3 + ["terminated"] * 2  # three refusals, then two tries
    assert "(after 1 retry)" in _failed_reason(world.db)


def test_the_installed_daemon_fails_a_job_that_never_starts_the_agent_and_stops_billing(
    db_url: str, world: World, tmp_path: Path
) -> None:
    """``spotopt daemon run --period 2s`` (no ``--poll``: it follows the short period, item 4)
    until the job has failed; then SIGTERM. ``jobs show --format json`` says why."""
    code, _out, err = cli("--db", db_url, "jobs", "submit", _never_reporting(tmp_path, "sleep 600"))
    assert code == 0, err
    state_dir = tmp_path / "local"
    argv = [str(SPOTOPT), "--db", db_url, "daemon", "run", "--period", "2s", "--launch-timeout", "1s"]
    daemon = subprocess.Popen(
        [*argv, "--state-dir", str(state_dir)],
        env={k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")},
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        limit = time.monotonic() + LIMIT_S
        while world.job().state != "failed" and daemon.poll() is None and time.monotonic() < limit:
            time.sleep(0.2)
        daemon.send_signal(signal.SIGTERM)
        _out, err = daemon.communicate(timeout=120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, err
    assert len(world.placements()) == 3, err
    provider = LocalProvider(state_dir)
    assert not any(provider.status(p.instance_id or "").state.is_live for p in world.placements())
    shown = subprocess.run(
        [str(SPOTOPT), "--db", db_url, "jobs", "show", "mlp", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    doc = strict_json(shown.stdout)
    assert doc["state"] == "failed", doc
    assert "agent never reported" in shown.stdout and "(after 2 retries); its log: " in shown.stdout
