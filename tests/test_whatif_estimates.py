"""The what-if decides as ``spotopt plan`` does where a figure is an estimate (issue 37): the
``spotopt`` strategy plans deadlines at the low end of the estimate's 80 % interval, replays the
job at the estimate's point, and its output says which speeds were estimates. Through the
installed console script."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import console
from tests.l4_h100 import seed

AT = "2025-03-01T00:00Z"


def ok(db_url: str, *args: str | Path) -> str:
    done = console(db_url, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def world(db_url: str, tmp_path: Path) -> tuple[str, Path]:
    """An L4 and an H100, spot and on demand, priced at T0; the references that estimate a
    job's H100 speed from its L4 one; a job known on the L4 only (1.5 steps/s, its spec), 100k
    steps due in 10 h: the L4 alone cannot make it, the H100 can, and how long the job may first
    run on the cheap L4 depends on how fast the H100 is taken to be."""

    seed(db_url, tmp_path, spot=True)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n  - name: train\n    throughput: {L4: 1.5}\n    work: {steps: 100000}\n    deadline: 10h\n"
    )
    return db_url, jobs


def plan(db_url: str, jobs: Path) -> dict[str, Any]:
    (job,) = json.loads(ok(db_url, "plan", jobs, "--at", AT, "--format", "json"))["jobs"]
    return job


def whatif(db_url: str, jobs: Path, *args: str) -> str:
    return ok(
        db_url, "whatif", jobs, "--start", AT, "--strategies", "spotopt", "--preemptions", "none", *args
    )


def h100_estimate(db_url: str, jobs: Path) -> dict[str, Any]:
    out = ok(db_url, "throughput", "estimate", jobs, "--gpus", "H100-80GB", "--format", "json")
    (row,) = json.loads(out)
    return row


def hours(placement: dict[str, Any]) -> float:
    span = datetime.fromisoformat(placement["to"]) - datetime.fromisoformat(placement["from"])
    return span / timedelta(hours=1)


def test_the_whatif_runs_the_cheap_leg_as_long_as_plan_plans_it(world: tuple[str, Path]) -> None:
    db_url, jobs = world
    est = h100_estimate(db_url, jobs)
    assert est["source"] == "estimated" and est["low"] < est["steps_per_s"]
    job = plan(db_url, jobs)
    legs = [(a["gpu"], a["market"], a["hours"]) for a in job["allocation"]]
    assert [(g, m) for g, m, _ in legs] == [("L4", "spot"), ("H100-80GB", "spot")]
    doc = json.loads(whatif(db_url, jobs, "--format", "json"))
    ran = [(p["gpu"], p["market"], hours(p), p["throughput_source"]) for p in doc["placements"]]
    # the what-if's first decision is plan's first leg, and it leaves the L4 when plan's L4 hours
    # are spent (rounded to the 1 h tick): the H100 counted at its low end needs the rest; at
    # the point figure the L4 leg ran 5 h, plan's 2.4 h planned at the point
    assert [(g, m, s) for g, m, _, s in ran] == [
        ("L4", "spot", "spec"),
        ("H100-80GB", "spot", "estimated"),
    ]
    assert abs(ran[0][2] - legs[0][2]) < 1.0
    # the replay runs the H100 at the estimate's point: the job is done early, the deadline met
    (row,) = doc["results"]
    assert row["deadline_met"] is True
    assert row["throughput_source"] == "estimated, spec"
    work_on_h100 = 100000 - 1.5 * 3600 * ran[0][2]
    restart_h = 300 / 3600
    assert row["finish_hours"] == pytest.approx(
        ran[0][2] + restart_h + work_on_h100 / (est["steps_per_s"] * 3600), abs=0.2
    )


def test_the_whatif_table_marks_the_estimated_speed(world: tuple[str, Path]) -> None:
    db_url, jobs = world
    out = " ".join(whatif(db_url, jobs, "--wide").split())
    assert "throughput source" in out and "estimated, spec" in out
    assert "throughput_source estimated: the job ran on a GPU it has no figure for" in out
    assert "plans its deadline at the low end of the estimate's 80 % interval" in out
    # a job known where it runs: no estimate, no column, no note
    jobs.write_text(jobs.read_text().replace("{L4: 1.5}", "{L4: 1.5, H100-80GB: 8.0}"))
    out = " ".join(whatif(db_url, jobs, "--wide").split())
    assert "throughput source" not in out and "estimate" not in out
    (row,) = json.loads(whatif(db_url, jobs, "--format", "json"))["results"]
    assert row["throughput_source"] == "spec"
