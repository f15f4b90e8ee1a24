"""The solver says nothing (issue 36, item 11): HiGHS printed ``Running HiGHS … Copyright`` on
every command that plans (``plan``, ``whatif``, the daemon's rounds), on stderr since its
banner was kept off stdout, where it ran into the progress line (``10/12 0:00:01Running
HiGHS``). Its constructor prints it before any option can stop it; the installed console script
is run here, since only a real process's descriptors show a native library's output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SPOTOPT = Path(sys.executable).parent / "spotopt"
EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"
JOB = """\
jobs:
  - name: small
    throughput: {L4: 40, A100: 100}
    work: {steps: 20000}
    run: python train.py
    checkpoint: {uri: ckpt}
    budget_usd: 5
"""


def test_plan_whatif_and_a_daemon_round_print_no_solver_banner(tmp_path: Path) -> None:
    env = {**os.environ, "SPOTOPT_DB_URL": f"sqlite:///{tmp_path / 'h.sqlite'}", "COLUMNS": "120"}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    (tmp_path / "job.yaml").write_text(JOB, encoding="utf-8")
    commands = [
        ["import", "csv", str(EXAMPLES / "prices.csv")],
        ["jobs", "submit", "job.yaml"],
        ["plan", "job.yaml"],
        ["whatif", "job.yaml", "--strategies", "spot"],
        ["daemon", "run", "--once", "--dry-run"],
    ]
    for args in commands:
        done = subprocess.run(
            [str(SPOTOPT), *args], env=env, cwd=tmp_path, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, (args, done.stderr)
        assert "HiGHS" not in done.stderr + done.stdout, (args, done.stderr)
