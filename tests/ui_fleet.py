"""A fleet for the dashboard, metrics and Datasette tests: jobs in every state, placements
(one preempted), moves (done and open), prices that change, capacity observations and a job
whose name is markup."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import select

from spotopt.db.engine import Database
from spotopt.db.models import JOB_STATES, CapacityObservation, ManagedJob
from spotopt.mover import jobs
from tests.helpers import ingest, price
from tests.mover_rows import AWS_V100, AZURE_V100, GCP_V100, T0, market_id, move, place, seed_markets

MARKUP = "<b>bold</b> & <script>document.title='pwned'</script>"
"""Text a browser would run or render if the dashboard did not escape it: the moving job's name
(``jobs submit`` refuses such a name, so the fill renames the row as a hand-edited or older
database could hold it), its run command and its open move's reason."""

PATHS = {
    "pending": [],
    "launching": ["launching"],
    "running": ["launching", "running"],
    "moving": ["launching", "running", "moving"],
    "recovering": ["launching", "running", "recovering"],
    "done": ["launching", "running", "done"],
    "failed": ["launching", "failed"],
    "cancelled": ["cancelled"],
    "over-budget": ["launching", "running", "over-budget"],
}
"""How each job reaches its state (allowed transitions only)."""
assert set(PATHS) == set(JOB_STATES)

NAMES = {state: f"job-{state}" for state in JOB_STATES}


def _spec(name: str, budget: float) -> str:
    quoted = name.replace("'", "''")
    return f"""
jobs:
  - name: '{quoted}'
    throughput: {{V100: 2.5}}
    work: {{steps: 90000}}
    run: python train.py --note "{MARKUP}"
    checkpoint: {{uri: ckpt, every: 10m}}
    deadline: 72h
    budget_usd: {budget}
"""


def _walk(db: Database, job_id: int, states: list[str]) -> None:
    with db.session() as session:
        job = session.get(ManagedJob, job_id)
        assert job is not None
        for i, state in enumerate(states):
            jobs.record_transition(session, job, state, f"test: to {state}", T0 + timedelta(minutes=i + 1))


def fill(db: Database, tmp_path: Path) -> dict[str, int]:
    """Fill ``db``; returns job ids by state."""
    seed_markets(db)
    ingest(
        db,
        [
            price(AWS_V100, "2026-03-01 13:00", 1.10),
            price(AWS_V100, "2026-03-01 15:00", 0.80),
            price(GCP_V100, "2026-03-01 14:00", 0.95, cloud="gcp", region="us-central1", zone=None),
            price(AZURE_V100, "2026-03-01 16:00", 0.55, cloud="azure", region="eastus", zone=None),
        ],
    )
    aws, gcp, azure = (market_id(db, m) for m in (AWS_V100, GCP_V100, AZURE_V100))
    ids: dict[str, int] = {}
    for i, state in enumerate(JOB_STATES):
        path = tmp_path / f"job{i}.yaml"
        path.write_text(_spec(NAMES[state], 40.0 + 10 * i))
        ids[state] = int(jobs.submit(db, path, now=T0).id)
        _walk(db, ids[state], PATHS[state])
    h = timedelta(hours=1)
    # running: started on GCP, preempted, recovered onto AWS where it runs now.
    run = ids["running"]
    first = place(db, run, gcp, T0, T0 + 2 * h, "preempted", usd_per_hour=0.74)
    move(db, run, "start", "cheapest market", T0 - timedelta(minutes=5), to_placement=first, finished=T0)
    now_on = place(db, run, aws, T0 + 2 * h + timedelta(minutes=10), epoch=2)
    move(
        db,
        run,
        "recover",
        "preempted on gcp",
        T0 + 2 * h,
        from_placement=first,
        to_placement=now_on,
        finished=T0 + 2 * h + timedelta(minutes=10),
    )
    # launching: an open start move, no instance yet.
    place(db, ids["launching"], azure, None)
    move(db, ids["launching"], "start", "cheapest market", T0 + 3 * h, outcome=None, market=azure)
    # moving (the markup job): runs on AWS, an open move to Azure whose reason is markup too.
    on = place(db, ids["moving"], aws, T0 + h, usd_per_hour=0.9)
    move(
        db,
        ids["moving"],
        "move",
        f"cheaper: {MARKUP}",
        T0 + 4 * h,
        outcome=None,
        from_placement=on,
        market=azure,
    )
    # recovering: noticed on Azure.
    place(db, ids["recovering"], azure, T0, T0 + 3 * h, "noticed", usd_per_hour=0.6)
    # done and over-budget: ended instances.
    place(db, ids["done"], gcp, T0, T0 + 5 * h, "finished", usd_per_hour=0.74)
    place(db, ids["over-budget"], aws, T0, T0 + 6 * h, "over-budget", usd_per_hour=0.9)
    with db.session() as session:
        marked = session.get(ManagedJob, ids["moving"])
        assert marked is not None
        marked.name = MARKUP
        marked.placement_id = on
        running = session.get(ManagedJob, run)
        assert running is not None
        running.placement_id = now_on
        for job_id, steps in ((run, 30_000), (ids["moving"], 12_000), (ids["done"], 90_000)):
            job = session.get(ManagedJob, job_id)
            assert job is not None
            job.steps = steps
        session.add_all(
            CapacityObservation(market_id=m, observed_at=T0 + k * h, source="test", available=k % 3 != 1)
            for m in (aws, azure)
            for k in range(6)
        )
    return ids


def job_names(db: Database) -> list[str]:
    with db.session() as session:
        return list(session.scalars(select(ManagedJob.name).order_by(ManagedJob.id)))
