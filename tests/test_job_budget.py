"""``spotopt jobs budget``: raising a budget, leaving over-budget, and what re-submission does
afterwards (the spec hash leaves the budget out), on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from spotopt.db.engine import Database
from spotopt.db.models import JobEvent, ManagedJob
from spotopt.errors import InputError
from spotopt.mover import jobs
from tests.helpers import cli
from tests.mover_rows import AWS_V100, JOB, T0, market_id, place, seed_markets, submit

NOW = T0 + timedelta(hours=6)


def over_budget_job(db: Database, tmp_path: Path) -> int:
    """resnet has spent $3.60 (4 h of AWS spot at $0.90) and was stopped over-budget."""
    seed_markets(db)
    job = submit(db, tmp_path)
    place(db, job, market_id(db, AWS_V100), T0, T0 + timedelta(hours=4), "terminated")
    with db.session() as session:
        row = session.get(ManagedJob, job)
        assert row is not None
        for state in ("launching", "running", "over-budget"):
            jobs.record_transition(session, row, state, "test", T0 + timedelta(hours=4))
    return job


def snapshot(db: Database) -> dict[str, Any]:
    """Everything ``set_budget`` may change."""
    with db.session() as session:
        row = session.scalars(select(ManagedJob)).one()
        events = session.scalar(select(func.count()).select_from(JobEvent))
        return {
            "budget": (row.budget_usd, row.max_usd_per_hour),
            "state": row.state,
            "spec": row.spec_json,
            "sha": row.spec_sha256,
            "updated": row.updated_at,
            "events": events,
        }


def test_raising_the_budget_returns_an_over_budget_job_to_pending(db: Database, tmp_path: Path) -> None:
    over_budget_job(db, tmp_path)
    before = snapshot(db)
    change = jobs.set_budget(db, "resnet", 80, now=NOW)
    assert (change.spent_usd, change.from_state) == (pytest.approx(3.6), "over-budget")
    after = snapshot(db)
    assert after["budget"] == (80.0, 4.0) and after["state"] == "pending"
    assert after["sha"] == before["sha"]  # the same job: the hash leaves the budget out
    assert json.loads(after["spec"]) == json.loads(before["spec"]) | {"budget_usd": 80.0}
    last = jobs.events(db, "resnet")[-1]
    assert (last.from_state, last.to_state, last.at) == ("over-budget", "pending", NOW)
    assert last.reason == "budget raised from $50.00, at most $4.00/h to $80.00, at most $4.00/h"
    assert jobs.job_spec(jobs.get_job(db, "resnet")).budget_usd == 80.0


@pytest.mark.parametrize("usd", [3.6, 3.0, 0.5])
def test_a_budget_not_above_the_spend_is_refused_and_changes_nothing(
    db: Database, tmp_path: Path, usd: float
) -> None:
    over_budget_job(db, tmp_path)
    before = snapshot(db)
    with pytest.raises(InputError, match=r"USD: \$.* is not above the \$3.60 job 'resnet' has already spent"):
        jobs.set_budget(db, "resnet", usd, now=NOW)
    assert snapshot(db) == before


def test_a_running_job_keeps_running_and_the_rate_cap_may_change(db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    submit(db, tmp_path)
    change = jobs.set_budget(db, "resnet", 20, max_usd_per_hour=1.5, now=NOW)
    assert (change.spent_usd, change.from_state, change.job.state) == (0.0, "pending", "pending")
    assert snapshot(db)["budget"] == (20.0, 1.5) and snapshot(db)["events"] == 1
    spec = jobs.job_spec(jobs.get_job(db, "resnet"))
    assert (spec.budget_usd, spec.max_usd_per_hour) == (20.0, 1.5)


def test_a_final_job_or_a_bad_amount_is_refused(db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    submit(db, tmp_path)
    for usd, cap, field in [
        (0.0, None, "USD"),
        (float("inf"), None, "USD"),
        (10.0, -1.0, "--max-usd-per-hour"),
    ]:
        with pytest.raises(InputError, match=f"^{field}: .* is not a budget"):
            jobs.set_budget(db, "resnet", usd, cap)
    jobs.cancel(db, "resnet", "done with it")
    before = snapshot(db)
    with pytest.raises(InputError, match="job 'resnet' is cancelled; a final job's budget cannot change"):
        jobs.set_budget(db, "resnet", 100)
    assert snapshot(db) == before


def test_resubmitting_after_a_budget_change_is_a_no_op_that_keeps_the_new_budget(
    db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The budget lives in the row: the original file (budget 50) is still the same job, and
    the budget raised with ``jobs budget`` stays; any other change is another job."""
    over_budget_job(db, tmp_path)
    jobs.set_budget(db, "resnet", 80, now=NOW)
    before = snapshot(db)
    with caplog.at_level(logging.WARNING, logger="spotopt"):
        again = jobs.submit(db, tmp_path / "job.yaml")
    assert again.budget_usd == 80.0 and snapshot(db) == before
    assert "already submitted with budget $80.00, at most $4.00/h; the file's budget ($50.00" in caplog.text
    assert "`spotopt jobs budget resnet USD` changes it" in caplog.text
    caplog.clear()
    raised = tmp_path / "raised.yaml"  # the same directory: the same job if the spec agrees
    raised.write_text(JOB.replace("budget_usd: 50", "budget_usd: 80"))
    with caplog.at_level(logging.WARNING, logger="spotopt"):
        assert jobs.submit(db, raised).id == again.id
    assert caplog.text == ""  # the budget in effect: nothing to warn about
    raised.write_text(JOB.replace("steps: 90000", "steps: 95000"))
    with pytest.raises(InputError, match="exists with another spec"):
        jobs.submit(db, raised)
    assert snapshot(db) == before


def test_cli_budget(db_url: str, db: Database, tmp_path: Path) -> None:
    over_budget_job(db, tmp_path)
    before = snapshot(db)
    for args, message in [
        (("resnet", "2"), "USD: $2.00 is not above the $3.60 job 'resnet' has already spent"),
        (("resnet", "inf"), "USD: inf is not a budget"),
        (("resnet", "lots"), "error: USD: Input should be a valid number"),
        (("nope", "20"), "no managed job named 'nope'"),
        (("resnet", "20", "--max-usd-per-hour", "0"), "--max-usd-per-hour: 0.0 is not a budget"),
    ]:
        code, out, err = cli("--db", db_url, "jobs", "budget", *args)
        assert code == 2 and message in err and out == "", (args, err)
        assert snapshot(db) == before
    code, out, err = cli("--db", db_url, "jobs", "budget", "resnet", "20", "--max-usd-per-hour", "2.5")
    assert code == 0, err
    assert out.strip() == "resnet: budget $20.00, at most $2.50/h ($3.60 spent); over-budget -> pending"
    code, out, err = cli("--db", db_url, "jobs", "budget", "resnet", "25")
    assert code == 0 and out.strip() == "resnet: budget $25.00, at most $2.50/h ($3.60 spent)", err
