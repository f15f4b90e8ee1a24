"""A managed job's steps/s where it runs, marked as an estimate where it is one (issue 37):
``jobs show`` (the console script, table and JSON) and the dashboard's job page (a real server
read by headless Chromium) give the figure, its 80 % interval, its source and its references."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from spotopt.db.models import ManagedJob
from spotopt.history.setup import open_history
from spotopt.mover import jobs
from tests.browser import chromium
from tests.helpers import console
from tests.mover_rows import AWS_V100, market_id, place, seed_markets, submit
from tests.servers import free_port, spotopt_server

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

REFERENCES = """workload,gpu_model,gpu_count,steps_per_s
ref-a,T4,1,1.0
ref-a,V100-16GB,1,2.0
ref-b,T4,1,2.0
ref-b,V100-16GB,1,5.0
ref-c,T4,1,1.5
ref-c,V100-16GB,1,3.3
"""
JOB = """
jobs:
  - name: resnet
    throughput: {T4: 1.0}
    work: {steps: 90000}
    run: python train.py
    checkpoint: {uri: ckpt, every: 10m}
    budget_usd: 50
"""
"""Known on a T4 only, running on an AWS V100 (p3.2xlarge): its speed there is an estimate."""


def ok(db_url: str, *args: str | Path) -> str:
    done = console(db_url, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def world(module_db_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job running on an AWS V100 for the last hour; what ``throughput estimate`` says of
    its speed there."""
    where = tmp_path_factory.mktemp("estimates")
    (where / "refs.csv").write_text(REFERENCES)
    ok(module_db_url, "throughput", "import", where / "refs.csv")
    db = open_history(module_db_url)
    try:
        seed_markets(db)
        job = submit(db, where, JOB)
        started = datetime.now(UTC) - timedelta(hours=1)
        placement = place(db, job, market_id(db, AWS_V100), started)
        with db.session() as session:
            row = session.get(ManagedJob, job)
            assert row is not None
            for state in ("launching", "running"):
                jobs.record_transition(session, row, state, "test", started)
            session.execute(
                update(ManagedJob)
                .where(ManagedJob.id == job)
                .values(placement_id=placement, steps=3_000, steps_per_s=0.9, heartbeat_at=started)
            )
    finally:
        db.dispose()
    (where / "job.yaml").write_text(JOB)
    out = ok(module_db_url, "throughput", "estimate", where / "job.yaml", "--gpus", "V100-16GB", "-f", "json")
    (estimate,) = json.loads(out)
    assert estimate["source"] == "estimated" and estimate["low"] < estimate["steps_per_s"] < estimate["high"]
    return {"url": module_db_url, "dir": where, "estimate": estimate}


def marked(estimate: dict[str, Any]) -> str:
    """How an estimate reads wherever a person reads it."""
    return (
        f"≈ {estimate['steps_per_s']:.3g} steps/s (estimated, {estimate['low']:.3g}–{estimate['high']:.3g}, "
        "from ref-a, ref-b, ref-c)"
    )


def test_jobs_show_json_gives_the_figure_its_interval_source_and_references(world: dict[str, Any]) -> None:
    doc = json.loads(ok(world["url"], "jobs", "show", "resnet", "--format", "json"))
    est = world["estimate"]
    assert doc["throughput"] == {
        "steps_per_s": pytest.approx(est["steps_per_s"]),
        "low": pytest.approx(est["low"]),
        "high": pytest.approx(est["high"]),
        "source": "estimated",
        "references": ["ref-a", "ref-b", "ref-c"],
    }
    assert doc["progress"]["steps_per_s_expected"] == pytest.approx(est["steps_per_s"])


def test_jobs_show_table_marks_the_estimate(world: dict[str, Any]) -> None:
    out = " ".join(ok(world["url"], "jobs", "show", "resnet").replace("│", " ").split())
    est = world["estimate"]
    assert (
        f"0.9 measured, ≈ {est['steps_per_s']:.3g} expected (estimated, {est['low']:.3g}–{est['high']:.3g}, "
        "from ref-a, ref-b, ref-c)"
    ) in out


@pytest.fixture(scope="module")
def server(world: dict[str, Any]) -> Iterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    args = ["--db", world["url"], "ui", "--port", str(port), "--state-dir", str(world["dir"] / "state")]
    with spotopt_server(args, base + "/", world["dir"] / "ui.log"):
        yield base


def test_the_job_page_marks_the_estimate(
    world: dict[str, Any], server: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with chromium(tmp_path_factory.mktemp("chromium-profile")) as browser:
        browser.get(f"{server}/jobs/resnet")
        WebDriverWait(browser, 60).until(lambda b: b.find_elements(By.ID, "job-throughput"))  # type: ignore[attr-defined]
        shown = browser.find_element(By.ID, "job-throughput")  # type: ignore[attr-defined]
        assert shown.text == marked(world["estimate"])
        assert "estimate" in shown.get_attribute("class").split()
