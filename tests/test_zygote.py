"""The trainer tests' forking launcher (``tests/zygote.py``) starts a job as the local provider
does: the same script sees the same process (``__main__``, argv, path, folder, environment,
stdin, its own process group, default SIGTERM) and the provider sees the same statuses (an exit
code, an exception's 1, 128 + 15 after a terminate, none after a SIGKILL of the group), whether
the instance is a new interpreter or a fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotopt.clouds.common.base import InstanceState, LaunchSpec
from spotopt.clouds.local.provider import LocalProvider
from tests.interruptions import MARKET, ForkingProvider
from tests.zygote import Zygote

SCRIPT = """\
import json, os, signal, sys, time
print(json.dumps({
    "name": __name__, "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
    "job": os.environ.get("SPOTOPT_JOB"), "stdin": sys.stdin.read(), "group_leader": os.getpgid(0),
    "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
}), flush=True)
if sys.argv[1] == "exit":
    sys.exit(3)
if sys.argv[1] == "raise":
    raise ValueError("boom")
time.sleep(60)
"""


@pytest.fixture(scope="module")
def zygote_preload() -> tuple[Path | str, ...]:
    return ("json",)


@pytest.fixture(params=["new interpreter", "fork"])
def provider(request: pytest.FixtureRequest, tmp_path: Path, zygote: Zygote) -> Iterator[LocalProvider]:
    state = tmp_path / "state"
    made = (
        LocalProvider(state, grace_s=10)
        if request.param == "new interpreter"
        else ForkingProvider(state, zygote, 10)
    )
    yield made
    for instance in made.list_instances():
        made.terminate(instance.instance_id, grace_s=0)


def _launch(provider: LocalProvider, tmp_path: Path, mode: str) -> tuple[str, Path]:
    script = tmp_path / "scripts" / "job.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(SCRIPT)
    (tmp_path / "work").mkdir(exist_ok=True)
    command = (sys.executable, "../scripts/job.py", mode)  # relative to the job's folder
    spec = LaunchSpec("j", 1, command, "file:///unused", workdir=str(tmp_path / "work"))
    iid = provider.launch(spec, MARKET, f"j-{mode}").instance_id
    return iid, script


def _seen(provider: LocalProvider, iid: str) -> dict[str, object]:
    deadline = time.monotonic() + 10
    while not provider.log_path(iid).read_text().strip():
        assert time.monotonic() < deadline, "the job printed nothing"
        time.sleep(0.02)
    seen: dict[str, object] = json.loads(provider.log_path(iid).read_text().splitlines()[0])
    return seen


def _ended(provider: LocalProvider, iid: str) -> tuple[InstanceState, int | None]:
    deadline = time.monotonic() + 10
    while (status := provider.status(iid)).state.is_live:
        assert time.monotonic() < deadline, "the job never ended"
        time.sleep(0.02)
    return status.state, status.exit_code


def test_the_script_runs_as_python_script_would(provider: LocalProvider, tmp_path: Path) -> None:
    iid, script = _launch(provider, tmp_path, "exit")
    pid = json.loads((provider.state_dir / "instances" / iid / "record.json").read_text())["pid"]
    assert _seen(provider, iid) == {
        "name": "__main__",
        "argv": ["../scripts/job.py", "exit"],
        "path0": str(script.parent.resolve()),
        "cwd": str(tmp_path / "work"),
        "job": "j",
        "stdin": "",
        "group_leader": pid,
        "sigterm_default": True,
    }
    assert _ended(provider, iid) == (InstanceState.EXITED, 3)


def test_an_uncaught_exception_exits_1_with_its_traceback(provider: LocalProvider, tmp_path: Path) -> None:
    iid, _ = _launch(provider, tmp_path, "raise")
    assert _ended(provider, iid) == (InstanceState.EXITED, 1)
    assert "ValueError: boom" in provider.log_path(iid).read_text()


def test_a_terminate_records_the_signal_and_a_group_kill_records_nothing(
    provider: LocalProvider, tmp_path: Path
) -> None:
    iid, _ = _launch(provider, tmp_path, "sleep")
    _seen(provider, iid)
    provider.terminate(iid)
    assert _ended(provider, iid) == (InstanceState.TERMINATED, 128 + signal.SIGTERM)
    iid, _ = _launch(provider, tmp_path, "sleep again")
    _seen(provider, iid)
    pid = json.loads((provider.state_dir / "instances" / iid / "record.json").read_text())["pid"]
    os.killpg(pid, signal.SIGKILL)
    assert _ended(provider, iid) == (InstanceState.EXITED, None)


def test_the_zygote_ends_when_stopped_though_another_process_holds_its_channel(tmp_path: Path) -> None:
    """Under xdist a worker runs other modules' tests, and a process started or forked there can
    hold a copy of the channel; closing the test's descriptor then was no end for the zygote,
    which ``stop`` killed after its 10 s wait. (Not the cause of this module's slow teardowns in
    CI: there every fixture, the zygote's included, finishes at once; see ``SLOW_TEARDOWN_S``.)"""
    made = Zygote.start(("json",), tmp_path / "zygote-output")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(made.channel.fileno(),)
    )
    try:
        made.stop()
        assert made.process.returncode == 0  # it ended by itself, not by stop's SIGKILL
    finally:
        holder.kill()
        holder.wait()
