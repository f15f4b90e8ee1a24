"""The local provider: the shared contract, plus what only real processes can show."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotopt.clouds.common.base import InstanceState, LaunchSpec
from spotopt.clouds.local.provider import LocalProvider, group_members
from spotopt.clouds.registry import get_provider
from spotopt.errors import ConfigError, ProviderError
from spotopt.types import MarketKey, MarketKind
from tests.provider_contract import ProviderContract, wait_for

LOCAL_MARKET = MarketKey("local", "local", None, "process", MarketKind.SPOT)
SLEEP = (sys.executable, "-c", "import time; time.sleep(60)")


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[LocalProvider]:
    made = LocalProvider(tmp_path / "state", grace_s=5.0)
    yield made
    for instance in made.list_instances():  # the test owns its processes: none outlives it
        made.terminate(instance.instance_id, grace_s=0)


@pytest.fixture
def market() -> MarketKey:
    return LOCAL_MARKET


class TestLocalProviderContract(ProviderContract):
    pass


def _spec(command: tuple[str, ...], **env: str) -> LaunchSpec:
    return LaunchSpec(job="j", epoch=4, command=command, checkpoint_uri="file:///tmp/store", env=env)


def test_the_registry_builds_local_and_suggests_a_name(tmp_path: Path) -> None:
    assert isinstance(get_provider("local", state_dir=tmp_path), LocalProvider)
    with pytest.raises(ConfigError, match="did you mean local"):
        get_provider("locall", state_dir=tmp_path)


def test_the_job_gets_the_agent_environment_and_its_log(provider: LocalProvider, tmp_path: Path) -> None:
    script = (
        "import json, os\n"
        "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('SPOTOPT_')}))"
    )
    instance = provider.launch(
        _spec((sys.executable, "-c", script), SPOTOPT_POLL_EVERY="1s"), LOCAL_MARKET, "env"
    )
    wait_for(provider, instance.instance_id, {InstanceState.EXITED})
    env = json.loads(provider.log_path(instance.instance_id).read_text())
    assert env["SPOTOPT_JOB"] == "j" and env["SPOTOPT_EPOCH"] == "4" and env["SPOTOPT_CLOUD"] == "local"
    assert env["SPOTOPT_CHECKPOINT_URI"] == "file:///tmp/store" and env["SPOTOPT_POLL_EVERY"] == "1s"
    assert env["SPOTOPT_NOTICE_FILE"].endswith("notice")
    assert provider.status(instance.instance_id).exit_code == 0


def test_a_restarted_provider_finds_its_instances(provider: LocalProvider) -> None:
    instance = provider.launch(_spec(SLEEP), LOCAL_MARKET, "restart")
    again = LocalProvider(provider.state_dir)  # a new daemon process on the same state directory
    assert again.list_instances() == [instance]
    assert again.status(instance.instance_id).state is InstanceState.RUNNING
    assert again.launch(_spec(SLEEP), LOCAL_MARKET, "restart") == instance
    assert again.terminate(instance.instance_id, grace_s=2).state is InstanceState.TERMINATED
    assert provider.status(instance.instance_id).state is InstanceState.TERMINATED


def test_a_reused_pid_is_not_mistaken_for_the_instance(provider: LocalProvider) -> None:
    instance = provider.launch(_spec(SLEEP), LOCAL_MARKET, "pid-reuse")
    record_file = provider.state_dir / "instances" / instance.instance_id / "record.json"
    record = json.loads(record_file.read_text())
    record["start_ticks"] += 1  # as if the pid now belonged to a process started later
    record_file.write_text(json.dumps(record))
    stranger = LocalProvider(provider.state_dir)  # not the parent: must rely on /proc alone
    assert stranger.status(instance.instance_id).state is InstanceState.EXITED
    assert stranger.terminate(instance.instance_id).state is InstanceState.EXITED  # must not signal
    record["start_ticks"] -= 1
    record_file.write_text(json.dumps(record))
    assert (
        provider.status(instance.instance_id).state is InstanceState.RUNNING
    )  # still alive: it was never signalled


def test_terminate_escalates_to_sigkill_after_the_grace_period(provider: LocalProvider) -> None:
    stubborn = (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)"
    )
    instance = provider.launch(_spec((sys.executable, "-c", stubborn)), LOCAL_MARKET, "stubborn")
    log = provider.log_path(instance.instance_id)
    deadline = time.monotonic() + 30
    while "ready" not in log.read_text():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    status = provider.terminate(instance.instance_id, grace_s=0.3)
    assert status.state is InstanceState.TERMINATED
    assert status.exit_code is None  # SIGKILL took the runner too: no status recorded


def test_concurrent_launches_with_one_key_start_one_process(provider: LocalProvider) -> None:
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(provider.launch(_spec(SLEEP), LOCAL_MARKET, "race")))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({r.instance_id for r in results}) == 1
    assert len(provider.list_instances()) == 1


def test_preempt_delivers_a_notice_then_kills(provider: LocalProvider) -> None:
    waits = (
        "import os, pathlib, time\n"
        "p = pathlib.Path(os.environ['SPOTOPT_NOTICE_FILE'])\n"
        "while not p.exists(): time.sleep(0.01)\n"
        "print('noticed', flush=True)\n"
        "time.sleep(60)"
    )
    instance = provider.launch(_spec((sys.executable, "-c", waits)), LOCAL_MARKET, "preempt")
    status = provider.preempt(instance.instance_id, notice_s=1.0)
    assert status.state is InstanceState.PREEMPTED
    assert "noticed" in provider.log_path(instance.instance_id).read_text()
    assert provider.terminate(instance.instance_id).state is InstanceState.PREEMPTED


def test_a_job_that_ends_itself_on_the_notice_is_not_reclaimed(provider: LocalProvider) -> None:
    # The agent's emergency checkpoint done, the process exits before the cloud's deadline: the
    # instance ended by our doing (billed as such), not by the cloud's reclaim.
    exits = (
        "import os, pathlib, time\n"
        "p = pathlib.Path(os.environ['SPOTOPT_NOTICE_FILE'])\n"
        "while not p.exists(): time.sleep(0.01)\n"
    )
    instance = provider.launch(_spec((sys.executable, "-c", exits)), LOCAL_MARKET, "saves")
    provider.notify(instance.instance_id, notice_s=120.0)
    wait_for(provider, instance.instance_id, {InstanceState.EXITED})
    assert provider.reclaim(instance.instance_id).state is InstanceState.EXITED
    assert provider.status(instance.instance_id).exit_code == 0


def test_terminate_returns_when_the_jobs_own_children_are_gone_too(provider: LocalProvider) -> None:
    # A job's children are part of its instance: a terminate that returned while one still ran
    # would leak it (and a check right after would see it). Here the job ends on SIGTERM but its
    # child ignores it.
    family = ("sh", "-c", "trap 'exit 0' TERM; (trap '' TERM; sleep 60) & sleep 60 & wait")
    instance = provider.launch(_spec(family), LOCAL_MARKET, "family")
    pid = json.loads((provider.state_dir / "instances" / instance.instance_id / "record.json").read_text())[
        "pid"
    ]
    wait_for_members(pid, 3)
    provider.terminate(instance.instance_id, grace_s=30)
    assert group_members(pid) == []


def wait_for_members(pgid: int, n: int) -> None:
    deadline = time.monotonic() + 60
    while len(group_members(pgid)) < n:
        assert time.monotonic() < deadline, f"process group {pgid} never had {n} processes"
        time.sleep(0.01)


def test_an_empty_command_or_a_missing_program_is_a_provider_error(provider: LocalProvider) -> None:
    with pytest.raises(ProviderError, match="no command"):
        provider.launch(_spec(()), LOCAL_MARKET, "empty")
    bad = provider.launch(_spec(("/nonexistent/program",)), LOCAL_MARKET, "missing")
    wait_for(provider, bad.instance_id, {InstanceState.EXITED})
    assert "nonexistent" in provider.log_path(bad.instance_id).read_text()
    assert provider.status(bad.instance_id).exit_code == 127


KILLED_LAUNCHER = """
import os, sys
from spotopt.clouds.common.base import LaunchSpec
from spotopt.clouds.local.provider import LocalProvider
from tests.test_provider_local import LOCAL_MARKET
provider = LocalProvider(sys.argv[1])
real_write, writes = provider._write, []
def write_or_die(record):
    writes.append(record)
    if sys.argv[2] == "before-pid" and len(writes) == 2:
        os._exit(9)  # as a SIGKILL would: no cleanup, the pid never recorded
    real_write(record)
    if sys.argv[2] == "after-record":
        os._exit(9)
provider._write = write_or_die
command = ("sh", "-c", 'echo $$ >> "$0"; exec sleep 60', sys.argv[3])
spec = LaunchSpec(job="j", epoch=1, command=command, checkpoint_uri="file:///tmp/s")
provider.launch(spec, LOCAL_MARKET, "k")
"""
"""A launcher that dies ``after-record`` (the record written, nothing started yet) or
``before-pid`` (the process runs, its pid not recorded)."""


def _killed_launcher(state: Path, when: str, starts: Path) -> None:
    args = [sys.executable, "-c", KILLED_LAUNCHER, str(state), when, str(starts)]
    assert subprocess.run(args, cwd=Path(__file__).parents[1], check=False).returncode == 9


def _relaunch(provider: LocalProvider, starts: Path) -> int:
    command = ("sh", "-c", 'echo $$ >> "$0"; exec sleep 60', str(starts))
    spec = LaunchSpec(job="j", epoch=1, command=command, checkpoint_uri="file:///tmp/s")
    instance = provider.launch(spec, LOCAL_MARKET, "k")
    record = provider.state_dir / "instances" / instance.instance_id / "record.json"
    return int(json.loads(record.read_text())["pid"])


def test_a_launch_after_a_launcher_killed_mid_start_adopts_the_running_process(
    provider: LocalProvider, tmp_path: Path
) -> None:
    # The launcher died after starting the process, before recording its pid (what SIGKILLed
    # the fault-injection daemon once and left two trainers of one epoch): the next launch with
    # the key must adopt that process, so terminating the instance ends the only trainer.
    starts = tmp_path / "starts"
    _killed_launcher(provider.state_dir, "before-pid", starts)
    orphan = wait_for_line(starts)
    try:
        pgid = _relaunch(provider, starts)
        assert os.getpgid(orphan) == pgid  # the adopted group is the orphan's
        provider.terminate(provider.list_instances()[0].instance_id, grace_s=5)
        assert group_members(pgid) == []
        assert starts.read_text().split() == [str(orphan)]  # one trainer ever started
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(os.getpgid(orphan), signal.SIGKILL)


def test_a_launch_after_a_launcher_killed_before_the_start_starts_the_process(
    provider: LocalProvider, tmp_path: Path
) -> None:
    starts = tmp_path / "starts"
    _killed_launcher(provider.state_dir, "after-record", starts)
    assert not starts.exists()
    pgid = _relaunch(provider, starts)
    assert os.getpgid(wait_for_line(starts)) == pgid
    assert provider.status(provider.list_instances()[0].instance_id).state is InstanceState.RUNNING


def wait_for_line(path: Path) -> int:
    deadline = time.monotonic() + 60
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.01)
    return int(path.read_text().split()[0])
