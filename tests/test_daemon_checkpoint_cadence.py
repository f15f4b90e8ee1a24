"""``spotopt daemon run --dry-run --period 1s`` on the quick-start job (issue 36): the planning
model checkpoints a job at the cadence its agent keeps (``checkpoint.every``), not at every 1 s
planning boundary, so the job is placed; a job that still has no usable option is named, with
why, rather than left out silently. Through the installed console script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

SPOTOPT = Path(sys.executable).parent / "spotopt"
EXAMPLES = Path(__file__).parents[1] / "data" / "examples"


def spotopt(tmp_path: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    assert SPOTOPT.exists(), f"{SPOTOPT}: install the package (pip install -e .) into this env"
    env = {
        **os.environ,
        "SPOTOPT_DB_URL": f"sqlite:///{tmp_path / 'history.sqlite'}",
        "XDG_DATA_HOME": str(tmp_path / "data-home"),
    }
    return subprocess.run(
        [str(SPOTOPT), *map(str, args)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def dry_run(tmp_path: Path, job_yaml: str) -> dict[str, Any]:
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    (tmp_path / "examples" / "job.yaml").write_text(job_yaml)
    for args in (("import", "csv", "examples/prices.csv"), ("jobs", "submit", "examples/job.yaml")):
        done = spotopt(tmp_path, *args)
        assert done.returncode == 0, done.stderr
    done = spotopt(tmp_path, "daemon", "run", "--dry-run", "--period", "1s", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_quick_start_job_is_placed_with_a_one_second_period(tmp_path: Path) -> None:
    # the example: checkpoint_s 1, checkpoint.every 30s; a checkpoint at every 1 s boundary
    # left it no time to train, so the dry run decided nothing and said nothing
    doc = dry_run(tmp_path, (EXAMPLES / "job.yaml").read_text())
    assert [(d["job"], d["kind"]) for d in doc["decisions"]] == [("example", "start")], doc
    assert not any("no usable option" in note for note in doc["notes"])


def test_a_job_with_no_usable_option_is_named_with_why(tmp_path: Path) -> None:
    text = (EXAMPLES / "job.yaml").read_text()
    assert "checkpoint: {uri: example-checkpoints, every: 30s}" in text
    doc = dry_run(tmp_path, text.replace(", every: 30s", ""))
    assert doc["decisions"] == []
    (note,) = [n for n in doc["notes"] if "no usable option" in n]
    assert note.startswith("job 'example' has no usable option: the planning model checkpoints it at every")
    assert "checkpoint.every" in note and "--period" in note
