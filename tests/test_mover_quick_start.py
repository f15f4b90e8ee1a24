"""The README's mover quick start, run line by line on a fresh database, ends with the job done
(issue 21, finding 11). Each ``spotopt`` line runs as the installed program would; the line
ending in ``&`` is the daemon, started in the background and stopped by the ``kill %1`` line
(SIGTERM) once ``jobs show`` says ``done``."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"
LIMIT_S = 180.0


def quick_start() -> list[str]:
    text = README.read_text(encoding="utf-8")
    block = text.split("Try it on one machine with the example training job", 1)[1]
    block = block.split("```bash", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.strip().splitlines() if line.strip()]


def test_the_mover_quick_start_runs_as_written(tmp_path: Path) -> None:
    shutil.copytree(EXAMPLES, tmp_path / "data" / "examples")  # the job writes beside its file
    env = {
        **os.environ,
        "SPOTOPT_DB_URL": f"sqlite:///{tmp_path / 'history.sqlite'}",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",  # `python`: this one
        "XDG_DATA_HOME": str(tmp_path / "data-home"),  # the local provider's default state dir
    }
    lines = quick_start()
    assert lines[0].startswith("spotopt import") and lines[-1] == "kill %1"
    daemon: subprocess.Popen[str] | None = None
    try:
        for line in lines:
            if line == "kill %1":
                assert daemon is not None
                daemon.send_signal(signal.SIGTERM)
                _out, err = daemon.communicate(timeout=120)
                assert daemon.returncode == 0, err
                continue
            background = line.endswith("&")
            argv = [sys.executable, "-m", *shlex.split(line.rstrip("&"))]
            if background:
                daemon = subprocess.Popen(argv, cwd=tmp_path, env=env, text=True, stderr=subprocess.PIPE)
                continue
            done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
            assert done.returncode == 0, (line, done.stderr)
            if line.startswith("spotopt daemon run --dry-run"):
                # A fresh price (the catalog's on-demand list prices, dated when the catalog was
                # made) wins over the example's 2024 spot prices; once every price is stale the
                # cheapest is used, and the daemon says how old it is (setting price_max_age_days).
                assert "start" in done.stdout
                assert "last observed" in done.stderr or "/on-demand" in done.stdout, done.stderr
            if line.startswith("spotopt jobs show"):
                deadline = time.monotonic() + LIMIT_S
                while not re.search(r"state\s+│\s+done\s", done.stdout):
                    assert time.monotonic() < deadline, done.stdout
                    time.sleep(0.5)
                    done = subprocess.run(
                        argv, cwd=tmp_path, env=env, capture_output=True, text=True, check=True
                    )
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert (tmp_path / "data" / "examples" / "example-out" / "weights.npy").exists()
