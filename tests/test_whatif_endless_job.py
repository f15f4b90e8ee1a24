"""A what-if with a job that cannot finish (1e-6 steps/s on 1e15 steps, issue 36 item 20) sets
it aside as the decision core does, with a one-line note naming it, and replays the others in
seconds (it replayed a ten-year window hour by hour: stopped after 13 minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SPOTOPT = Path(sys.executable).parent / "spotopt"
HEALTHY = "  - name: example\n    throughput: {K80: 1.0, V100: 2.4}\n    work: {steps: 20000}\n"
ENDLESS = "  - name: endless\n    throughput: {K80: 0.000001}\n    work: {steps: 1e15}\n"


def _whatif(tmp_path: Path, *jobs: str) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "jobs.yaml"
    spec.write_text("jobs:\n" + "".join(jobs), encoding="utf-8")
    env = {
        **os.environ,
        "SPOTOPT_DB_URL": f"sqlite:///{tmp_path / 'h.sqlite'}",
        "XDG_DATA_HOME": str(tmp_path),
    }
    return subprocess.run(
        [str(SPOTOPT), "whatif", "--example", str(spec), "--format", "json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,  # a finishing replay takes seconds; the old decade-long window, minutes
    )


def test_an_endless_job_is_set_aside_and_the_others_replayed(tmp_path: Path) -> None:
    done = _whatif(tmp_path, HEALTHY, ENDLESS)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout[: done.stdout.rindex("}") + 1])
    assert out["window_hours"] < 24 * 365
    assert {p["job"] for p in out["placements"]} == {"example"}
    (note,) = [n for n in out["notes"] if "endless" in n]
    assert note.startswith("job 'endless' set aside: it needs 2.778e+17 h") and note.endswith("not replayed")
    assert "\n" not in note


def test_a_what_if_of_only_an_endless_job_says_why_in_one_line(tmp_path: Path) -> None:
    done = _whatif(tmp_path, ENDLESS)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert "job 'endless' set aside" in line and "no job left to replay" in line
