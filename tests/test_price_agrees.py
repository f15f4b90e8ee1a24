"""One price from the history to the ledger (issue 22): the slot price ``spotopt plan`` shows, the
daemon decides at, the move and the placement record, the budget checks read and the ledger
bills are one figure, to the last bit, through the real path (the SQL history, ``spotopt plan``,
a daemon round that launches, the ledger, ``jobs show``). On SQLite and PostgreSQL.

The market is one a job shares with others (``gpu`` billing: 5 of a p2.16xlarge's 16 K80s, 3
jobs per instance) at a price where two rules for a slot's share differ in floating point
(``4.32 / 3 != 4.32 * (1 / 3)``): a stage pricing the slot by a rule of its own shows here.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from spotopt.db.engine import Database
from spotopt.db.models import JobMove, ManagedJob, Placement
from spotopt.decide.guardrails import Guardrails
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.mover.ledger import fleet_usd_per_hour, intervals, spent_by_job, spent_usd
from spotopt.mover.status import job_status
from spotopt.price import per_slot, usd_for
from tests.helpers import cli, ingest, price, strict_json
from tests.mover_rows import T0
from tests.test_ledger_egress import StubProvider

P2 = "p2.16xlarge"
USD = 4.32
JOBS_PER_INSTANCE = 3  # floor(16 GPUs / 5 per job)
JOB = f"""
jobs:
  - name: bert
    gpus: 5
    throughput: {{K80: 0.5}}
    work: {{steps: 90000}}
    run: python train.py
    checkpoint: {{uri: ckpt, every: 10m}}
    budget_usd: 500
    allow: {{instance_types: [{P2}], markets: [spot]}}
"""


def test_plan_decision_launch_and_ledger_agree_on_a_shared_slot_s_price(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    assert USD / JOBS_PER_INSTANCE != USD * (1 / JOBS_PER_INSTANCE)  # the case that can disagree
    ingest(db, [price(P2, "2026-03-01 11:00", USD)])
    spec = tmp_path / "jobs.yaml"
    spec.write_text(JOB, encoding="utf-8")

    code, out, err = cli(
        "--db", db_url, "plan", spec, "--at", T0.isoformat(), "--billing", "gpu", "-f", "json"
    )
    assert code == 0, err
    (shown,) = strict_json(out)["jobs"][0]["allocation"]
    assert (shown["instance_type"], shown["jobs_per_instance"]) == (P2, JOBS_PER_INSTANCE)
    planned = per_slot(shown["usd_per_hour"], shown["jobs_per_instance"])

    job_id = jobstore.submit(db, spec, now=T0).id
    settings = DaemonSettings(billing="gpu", guardrails=Guardrails(period_h=1.0))
    report = Daemon(db, StubProvider(), settings, clock=lambda: T0).tick()
    (decided,) = report.decisions
    assert decided["usd_per_hour"] == planned

    later = T0 + timedelta(minutes=90)
    with db.session() as session:
        move = session.scalars(select(JobMove).where(JobMove.job_id == job_id)).one()
        placement = session.scalars(select(Placement).where(Placement.job_id == job_id)).one()
        assert placement.started_at == T0  # launched: the ledger bills it from here
        assert move.price == placement.price
        assert (placement.usd_per_hour, placement.price.jobs_per_instance) == (planned, JOBS_PER_INSTANCE)
        (row,) = intervals(session, job_id, later)
        assert row.usd_per_hour == planned
        assert (row.billed_s, row.cost_usd) == (5400.0, usd_for(planned, 5400.0))
        assert (
            spent_usd(session, job_id, later)
            == spent_by_job(session, [job_id], later)[job_id]
            == row.cost_usd
        )
        assert fleet_usd_per_hour(session, later) == planned  # the fleet's spend-rate cap
        managed = session.get(ManagedJob, job_id)
        assert managed is not None
        shown_by_jobs_show = job_status(session, managed, jobstore.job_spec(managed), later)["placement"]
        assert shown_by_jobs_show["usd_per_hour"] == planned
