"""Nonsense refused in one line naming the field, exit 2, nothing stored (issue 21, finding 8):
spec values that used to be taken for something else, daemon options that cannot work, and
paths that used to give a traceback or be created silently."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotopt.db.engine import Database
from spotopt.mover import jobs as jobstore
from tests.helpers import cli
from tests.mover_world import job_yaml

EXAMPLE_JOBS = Path(__file__).resolve().parents[1] / "data" / "examples" / "jobs.yaml"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (("budget_usd: 100.0", "budget_usd: true"), "budget_usd: Input should be a valid number"),
        (("budget_usd: 100.0", "budget_usd: 0.000001"), "budget_usd: must be >= 0.01"),
        (("steps: 400", "steps: 2000.5"), "work.steps: 2000.5 is not a whole number of steps"),
    ],
)
def test_spec_values_that_mean_nothing_are_refused(
    db_url: str, db: Database, tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = job_yaml(tmp_path)
    text = path.read_text(encoding="utf-8")
    assert change[0] in text
    path.write_text(text.replace(*change), encoding="utf-8")
    code, _, err = cli("--db", db_url, "jobs", "submit", path)
    assert code == 2 and message in err and "Traceback" not in err
    assert jobstore.list_jobs(db) == []


def test_yaml_nested_a_thousand_deep_is_refused_in_one_line(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("jobs: " + "[" * 1000 + "]" * 1000 + "\n", encoding="utf-8")
    code, _, err = cli("--db", db_url, "jobs", "submit", path)
    assert code == 2 and "nested too deeply to be a job spec" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--max-usd-per-hour", "0"], "--max-usd-per-hour: 0.0 is not a spend rate"),
        (["--max-usd-per-hour", "inf"], "--max-usd-per-hour: inf is not a spend rate"),
        (["--poll", "1h", "--period", "5s"], "--poll 1h: longer than --period 5s"),
        (["--state-dir", "{file}"], "is a file, not a directory"),
        (["--state-dir", "{tmp}/nonexistent/x/y"], "nonexistent/x does not exist (a typo?)"),
    ],
)
def test_daemon_options_that_cannot_work_are_refused(
    db_url: str, tmp_path: Path, options: list[str], message: str
) -> None:
    (tmp_path / "a-file").write_text("", encoding="utf-8")
    given = [o.format(file=tmp_path / "a-file", tmp=tmp_path) for o in options]
    code, _, err = cli("--db", db_url, "daemon", "run", "--once", *given)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "nonexistent").exists()


def test_replay_keep_where_nothing_can_be_made_is_refused(db_url: str, tmp_path: Path) -> None:
    code, _, err = cli("--db", db_url, "daemon", "replay", EXAMPLE_JOBS, "--example", "--keep", "/proc/x")
    assert code == 2 and "--keep /proc/x: cannot be made" in err and "Traceback" not in err, err
