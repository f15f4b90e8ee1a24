"""``spotopt jobs show``: where a job runs, its progress, moves, preemptions, spend and cost to
finish, from placements and moves written as the executor writes them (SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from sqlalchemy import update

from spotopt import render
from spotopt.db.engine import Database
from spotopt.db.models import ManagedJob
from spotopt.mover import jobs, status
from tests.helpers import cli, ingest, price, strict_json
from tests.mover_rows import AWS_V100, AZURE_V100, T0, market_id, move, place, seed_markets, submit


def running_job(db: Database, tmp_path: Path, started: datetime = T0) -> dict[str, int]:
    """resnet (90,000 steps at an expected 2.5 steps/s on a V100): two hours on AWS spot until a
    preemption, then on Azure spot from ``started + 2h`` at $0.60/h, halfway done, with a move
    back to AWS under way."""
    seed_markets(db)
    job = submit(db, tmp_path)
    aws, azure = market_id(db, AWS_V100), market_id(db, AZURE_V100)
    first = place(db, job, aws, started, started + timedelta(hours=2), "preempted", epoch=1)
    second = place(db, job, azure, started + timedelta(hours=2), None, epoch=2, usd_per_hour=0.6)
    move(db, job, "start", "cheapest market", started, to_placement=first, cost_usd=6.1)
    move(
        db,
        job,
        "recover",
        "preemption notice",
        started + timedelta(hours=2),
        from_placement=first,
        to_placement=second,
        cost_usd=4.2,
        finished=started + timedelta(hours=2, minutes=5),
    )
    move(
        db,
        job,
        "move",
        "aws spot 40% cheaper",
        started + timedelta(hours=3),
        outcome=None,
        from_placement=second,
        market=aws,
        saving_usd=1.25,
        cost_usd=0.1,
    )
    with db.session() as session:
        row = session.get(ManagedJob, job)
        assert row is not None
        for state in ("launching", "running"):
            jobs.record_transition(session, row, state, "test", started)
        session.execute(
            update(ManagedJob)
            .where(ManagedJob.id == job)
            .values(
                placement_id=second,
                epoch=2,
                steps=45_000,
                steps_per_s=2.3,
                checkpoint_name="ckpt-00045000",
                checkpoint_step=45_000,
                heartbeat_at=started + timedelta(hours=4),
            )
        )
    return {"job": job, "first": first, "second": second, "aws": aws, "azure": azure}


def test_status_from_placements_moves_and_the_heartbeat(db: Database, tmp_path: Path) -> None:
    ids = running_job(db, tmp_path)
    # Azure's price halves at T0+3h: the spend is time-weighted, the cost to finish uses today's.
    ingest(db, [price(AZURE_V100, "2026-03-01 15:00", 0.30, cloud="azure", region="eastus", zone=None)])
    now = T0 + timedelta(hours=4)
    _, doc, history = status.show(db, "resnet", now)
    assert [e.to_state for e in history] == ["pending", "launching", "running"]
    assert doc["placement"]["instance_id"].startswith("i-")
    assert doc["placement"] | {"instance_id": None} == {
        "id": ids["second"],
        "market": "azure/eastus/-/Standard_NC6s_v3/spot",
        "provider": "local",
        "instance_id": None,
        "epoch": 2,
        "state": "running",
        "gpus": 1,
        "started_at": T0 + timedelta(hours=2),
        "usd_per_hour": pytest.approx(0.30),
    }
    assert doc["progress"] == {
        "steps": 45_000,
        "work_steps": 90_000,
        "done_fraction": 0.5,
        "steps_per_s_measured": 2.3,
        "steps_per_s_expected": 2.5,
        "expected_source": "spec",
        "heartbeat_at": T0 + timedelta(hours=4),
    }
    assert doc["checkpoint_verified"] == {"name": "ckpt-00045000", "step": 45_000}
    assert doc["preemptions"] == 1
    # AWS: 2 h at $0.90 (reclaimed after its first hour: billed); Azure: 1 h at $0.60 + 1 h at $0.30
    assert doc["spent_usd"] == pytest.approx(1.8 + 0.6 + 0.3)
    # 45,000 steps left at 2.5 steps/s = 5 h at today's $0.30/h
    assert doc["expected_cost_to_finish_usd"] == pytest.approx(1.5)
    aws = "aws/us-east-1/us-east-1a/p3.2xlarge/spot"
    azure = "azure/eastus/-/Standard_NC6s_v3/spot"
    summary = [
        (m["kind"], m["outcome"], m["from_market"], m["to_market"], m["saving_usd"], m["cost_usd"])
        for m in doc["moves"]
    ]
    assert summary == [
        ("start", "done", None, aws, 0.0, 6.1),
        ("recover", "done", aws, azure, 0.0, 4.2),
        ("move", None, azure, aws, 1.25, 0.1),  # still open: its target is the move's market
    ]
    assert doc["moves"][1]["finished_at"] == T0 + timedelta(hours=2, minutes=5)
    assert doc["moves"][2]["reason"] == "aws spot 40% cheaper" and doc["moves"][2]["step"] == "launching"


def test_a_job_placed_nowhere_has_no_expected_cost(db: Database, tmp_path: Path) -> None:
    ids = running_job(db, tmp_path)
    with db.session() as session:
        session.execute(
            update(ManagedJob).where(ManagedJob.id == ids["job"]).values(placement_id=ids["first"])
        )
    _, doc, _ = status.show(db, "resnet", T0 + timedelta(hours=4))
    # its placement has ended (preempted): the job runs nowhere until the executor relaunches it
    assert doc["placement"] is None and doc["expected_cost_to_finish_usd"] is None
    assert doc["progress"]["steps_per_s_expected"] is None and doc["progress"]["steps"] == 45_000


def wide_show(db_url: str, width: int, monkeypatch: pytest.MonkeyPatch) -> str:
    """``jobs show`` as a terminal ``width`` columns wide would print it."""
    monkeypatch.setattr(render, "_console", lambda out: Console(file=out, width=width))
    code, out, err = cli("--db", db_url, "jobs", "show", "resnet")
    assert code == 0, err
    return out


@pytest.mark.parametrize("width", [80, 120])
def test_cli_show_table_fits_the_terminal(
    db_url: str, db: Database, tmp_path: Path, width: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    running_job(db, tmp_path, started=datetime.now(UTC) - timedelta(hours=4))
    out = wide_show(db_url, width, monkeypatch)
    assert max(map(len, out.splitlines())) <= width
    for text in (
        "azure eastus Standard_NC6s_v3 spot (1 GPU)",
        "45,000 of 90,000 steps (50%)",
        "2.3 measured, 2.5 expected (spec)",
        "ckpt-00045000 (step 45,000)",
        "of $50.00 budget, at most $4.00/h",
        "3 (2 done, 1 open)",
        "recover: done",
        "move: open, at launching",
        "expected cost $0.10, saving $1.25",
        "aws spot 40% cheaper",
        "State transitions",
    ):
        assert text in out, text


def test_cli_show_json_has_the_issue_keys(db_url: str, db: Database, tmp_path: Path) -> None:
    running_job(db, tmp_path, started=datetime.now(UTC) - timedelta(hours=4))
    code, out, err = cli("--db", db_url, "jobs", "show", "resnet", "--format", "json")
    assert code == 0, err
    doc: dict[str, Any] = strict_json(out)
    assert {"state", "moves", "preemptions", "spent_usd", "expected_cost_to_finish_usd"} <= set(doc)
    assert (doc["state"], doc["preemptions"], len(doc["moves"])) == ("running", 1, 3)
    assert doc["moves"][0]["kind"] == "start" and doc["moves"][0]["created_at"].endswith("Z")
    # 2 h of AWS at $0.90 plus the Azure instance up to now (about 2 h at $0.60)
    assert 1.8 + 1.19 < doc["spent_usd"] < 1.8 + 1.3
    assert doc["expected_cost_to_finish_usd"] == pytest.approx(5 * 0.6)
    assert doc["placement"]["provider"] == "local" and doc["checkpoint_verified"]["step"] == 45_000
