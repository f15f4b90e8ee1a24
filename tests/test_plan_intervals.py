"""Deadlines are planned with the pessimistic end of an estimate, costs with its expected value
(issue 37): through ``spotopt plan``, the installed console script."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spotopt.agent.steady import WARMUP_STEPS
from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history
from spotopt.render import usd
from spotopt.types import MarketKey, MarketKind, PriceObservation
from tests.helpers import console
from tests.l4_h100 import T0, seed


def spotopt(db_url: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return console(db_url, *args)


def ok(db_url: str, *args: str | Path) -> str:
    done = spotopt(db_url, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def world(db_url: str, tmp_path: Path) -> tuple[str, Path]:
    """One L4 and one H100 on demand, the references that estimate a job's L4 speed from its
    H100 one, and a job known on H100 only (7 steps/s), due in 32 h."""
    seed(db_url, tmp_path)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n  - name: train\n    throughput: {H100-80GB: 7.0}\n"
        "    work: {steps: 100000}\n    deadline: 32h\n"
    )
    return db_url, jobs


def plan(db_url: str, jobs: Path) -> dict[str, Any]:
    out = ok(
        db_url, "plan", jobs, "--policy", "min-cost-slo", "--at", "2025-03-02T00:00Z", "--format", "json"
    )
    (job,) = json.loads(out)["jobs"]
    return job


def l4_estimate(db_url: str, jobs: Path) -> dict[str, Any]:
    out = ok(db_url, "throughput", "estimate", jobs, "--gpus", "L4", "--format", "json")
    (row,) = json.loads(out)
    return row


def test_an_estimate_whose_low_end_misses_the_deadline_is_not_trusted(world: tuple[str, Path]) -> None:
    db_url, jobs = world
    est = l4_estimate(db_url, jobs)
    assert est["source"] == "estimated"
    # on the L4 the expected speed makes the deadline (100k steps in ~23 h), the low end does not
    assert 100000 / est["steps_per_s"] / 3600 < 26 < 32 < 100000 / est["low"] / 3600
    job = plan(db_url, jobs)
    # planned at the low end: the H100 takes the part of the work the L4 may not finish in time
    # (the expected figure put it all on the L4); the hours are the pessimistic ones
    hours = {a["gpu"]: a["hours"] for a in job["allocation"]}
    low = {"L4": est["low"], "H100-80GB": 7.0}
    assert hours.get("H100-80GB", 0.0) > 0.5
    assert sum(h * low[g] * 3600 for g, h in hours.items()) == pytest.approx(100000, rel=1e-3)
    assert job["finish_hours"] <= 32


def test_the_same_figure_measured_takes_the_cheap_gpu(world: tuple[str, Path], tmp_path: Path) -> None:
    db_url, jobs = world
    est = l4_estimate(db_url, jobs)
    (tmp_path / "measured.csv").write_text(
        f"workload,gpu_model,gpu_count,steps_per_s,source\ntrain,L4,1,{est['steps_per_s']!r},measured\n"
    )
    ok(db_url, "throughput", "import", tmp_path / "measured.csv")
    job = plan(db_url, jobs)
    assert [(a["gpu"], a["throughput_source"]) for a in job["allocation"]] == [("L4", "measured")]
    # costs are priced with the expected value: the L4's $/step is its price over that speed
    # (and the start's restart, 300 s of it over the job's 23 h)
    (item,) = job["allocation"]
    assert item["usd_per_step"] == pytest.approx(0.8 / (est["steps_per_s"] * 3600), rel=0.005)


def test_plan_marks_the_estimate_and_names_the_profile_that_settles_a_close_choice(
    world: tuple[str, Path],
) -> None:
    db_url, jobs = world
    jobs.write_text(jobs.read_text().replace("    deadline: 32h\n", "    run: python train.py\n"))
    est = l4_estimate(db_url, jobs)
    doc = json.loads(ok(db_url, "plan", jobs, "--at", "2025-03-02T00:00Z", "--format", "json"))
    (job,) = doc["jobs"]
    (item,) = job["allocation"]
    assert (item["gpu"], item["throughput_source"]) == ("L4", "estimated")
    assert (item["throughput_low"], item["throughput_high"]) == pytest.approx((est["low"], est["high"]))
    # the H100 at $12/h is dearer per step even were the L4 at its low end: nothing to settle
    assert not any("profile" in w for w in doc["warnings"])
    db = open_history(db_url)
    try:  # the H100 at $5/h: cheaper per step than the L4 at the L4's low end
        h100 = MarketKey("aws", "us-east-1", None, "test.h100x1", MarketKind.ON_DEMAND)
        run_ingest(db, "test", "cheaper", [PriceObservation(h100, T0.replace(hour=12), 5.0)])
    finally:
        db.dispose()
    done = spotopt(db_url, "plan", jobs, "--at", "2025-03-02T00:00Z", "--wide")
    assert done.returncode == 0, done.stderr
    assert f"estimated {est['low']:.3g}-{est['high']:.3g}/s" in done.stdout
    warning = " ".join(done.stderr.split())
    assert "job 'train': the choice of L4 x1 over H100-80GB x1 rests on an estimate" in warning
    # a profile of 100 steps after the warm-up ones at the low end, plus the job's 300 s start
    cost = 0.8 * (300 + (WARMUP_STEPS + 100) / est["low"]) / 3600
    assert (
        f"`spotopt throughput profile {jobs} --gpu L4 --steps 100` would settle it for about {usd(cost)}"
        in (warning)
    )
