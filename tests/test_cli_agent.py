"""``spotopt agent run-local``: one command runs a script under the agent and resumes it until done."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from spotopt.checkpoints import Location, list_checkpoints
from spotopt.cli.app import app

EXAMPLE = Path(__file__).resolve().parents[1] / "data" / "examples" / "train_numpy.py"

CRASHES_ONCE = """
import os, sys
from pathlib import Path
from spotopt import agent
marker = Path(sys.argv[1])
start = agent.start_step()
for step in range(start, 4):
    agent.progress(step + 1)
    with agent.checkpoint(step + 1) as d:
        (d / "step").write_text(str(step + 1))
    if step + 1 == 2 and not marker.exists():
        marker.write_text("crashed")
        os._exit(9)  # dies like a segfault, after the checkpoint of step 2
print("started at", start)
agent.finish()
"""


def _run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str):  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    return CliRunner().invoke(app, ["agent", "run-local", *args])


def test_the_example_runs_in_one_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    result = _run(
        tmp_path,
        monkeypatch,
        str(EXAMPLE),
        "--checkpoint-every",
        "0.05s",
        "--format",
        "json",
        "--",
        "--steps",
        "40",
        "--out",
        "result",
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["epoch"], r["state"], r["exit_code"], r["finished_step"]) for r in rows] == [
        (1, "exited", 0, 40)
    ]
    assert np.load(tmp_path / "result" / "losses.npy").shape == (40,)
    assert list_checkpoints(Location(str(tmp_path / "spotopt-checkpoints")), "train_numpy")[0].step == 40


def test_a_crashed_job_is_relaunched_from_its_last_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "crashy.py"
    script.write_text(CRASHES_ONCE)
    result = _run(
        tmp_path,
        monkeypatch,
        str(script),
        "--store",
        f"file://{tmp_path / 'ck'}",
        "--format",
        "json",
        "--",
        str(tmp_path / "marker"),
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["epoch"], r["exit_code"], r["finished_step"]) for r in rows] == [(1, 9, None), (2, 0, 4)]
    assert "started at 2" in Path(rows[1]["log"]).read_text()


def test_a_job_that_never_finishes_fails_after_its_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "fails.py"
    script.write_text("import sys\nsys.exit(4)\n")
    result = _run(tmp_path, monkeypatch, str(script), "--restarts", "1")
    assert result.exit_code == 3
    assert "job fails did not finish" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["missing.py"], "SCRIPT: missing.py is not a file"),
        ([str(EXAMPLE), "--store", "ftp://x/y"], "--store: unknown URL scheme 'ftp'"),
        ([str(EXAMPLE), "--checkpoint-every", "often"], "--checkpoint-every: 'often' is not a duration"),
        ([str(EXAMPLE), "--checkpoint-every", "0s"], "--checkpoint-every: '0s' must be longer than 0s"),
        ([str(EXAMPLE), "--job", "a/b"], "--job: 'a/b' is not a job name"),
        ([str(EXAMPLE), "--storage-options", "[1]"], "--storage-options: must be a JSON object"),
        ([str(EXAMPLE), "--store", "/etc/hostname/store"], "--store: cannot write to"),
    ],
)
def test_bad_input_names_the_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    result = _run(tmp_path, monkeypatch, *args)
    assert result.exit_code == 2
    assert message in result.stderr
    assert not (tmp_path / "spotopt-local").exists()


def test_a_missing_backend_extra_names_the_pip_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "adlfs", None)
    result = _run(tmp_path, monkeypatch, str(EXAMPLE), "--store", "az://container/ckpt")
    assert result.exit_code == 2
    assert 'pip install "spotopt-gpu[azure-storage]"' in result.stderr


def test_ctrl_c_makes_the_job_checkpoint_and_stop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "steps.log"

    def sleep(seconds: float) -> None:  # the user presses Ctrl-C once the job has made progress
        if log.exists() and log.read_text().count("\n") >= 5:
            raise KeyboardInterrupt
        time.sleep(seconds)

    monkeypatch.setattr("spotopt.cli.agent.sleep", sleep)
    args = ["--checkpoint-every", "1h", "--format", "json", "--", "--steps", "100000", "--log", str(log)]
    result = _run(tmp_path, monkeypatch, str(EXAMPLE), *args)
    assert result.exit_code == 3 and "did not finish (last state terminated)" in result.stderr
    (row,) = json.loads(result.stdout)
    assert row["exit_code"] == 0  # the agent saved and stopped within the grace period
    job_log = Path(row["log"]).read_text()
    assert "stopped at step" in job_log and "(SIGTERM)" in job_log
    (saved,) = list_checkpoints(Location(str(tmp_path / "spotopt-checkpoints")), "train_numpy")
    assert saved.step >= 5


def test_sigterm_to_the_command_makes_the_job_checkpoint_and_stop(tmp_path: Path) -> None:
    """``kill`` (SIGTERM) to ``spotopt agent run-local`` stops the training process too: it runs
    in a process group of its own, which the command's own death would leave running."""
    log = tmp_path / "steps.log"
    args = ["--checkpoint-every", "1h", "--", "--steps", "10000000", "--log", str(log)]
    command = [sys.executable, "-m", "spotopt", "agent", "run-local", str(EXAMPLE), *args]
    cli = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and log.read_text().count("\n") >= 5):
            assert cli.poll() is None and time.monotonic() < deadline, cli.communicate()
            time.sleep(0.05)
        cli.send_signal(signal.SIGTERM)
        _out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert cli.returncode == 3 and b"did not finish (last state terminated)" in err
    (record,) = (tmp_path / "spotopt-local" / "instances").glob("*/record.json")
    assert not Path(f"/proc/{json.loads(record.read_text())['pid']}").exists()
    (saved,) = list_checkpoints(Location(str(tmp_path / "spotopt-checkpoints")), "train_numpy")
    assert saved.step >= 5
