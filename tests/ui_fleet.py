"""A fleet for the dashboard, metrics and Datasette tests: jobs in every state, placements
(one preempted), moves (done and open), progress over time, three days of prices that change and
of capacity observations with outages, and a job whose name is markup."""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotopt.db.engine import Database
from spotopt.db.models import JOB_STATES, CapacityObservation, JobProgress, ManagedJob
from spotopt.mover import jobs
from spotopt.types import MarketKey, MarketKind, PriceObservation
from tests.helpers import ingest
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


def _budget(state: str, i: int) -> float:
    """$40, $50, ...; the over-budget job's is below what its instance cost ($5.40)."""
    return 5.0 if state == "over-budget" else 40.0 + 10 * i


def _walk(db: Database, job_id: int, states: list[str], start: datetime) -> None:
    with db.session() as session:
        job = session.get(ManagedJob, job_id)
        assert job is not None
        for i, state in enumerate(states):
            jobs.record_transition(session, job, state, f"test: to {state}", start + timedelta(minutes=i + 1))


def _prices(db: Database, start: datetime) -> None:
    """Hourly spot prices over the three days before ``start`` and the eight hours after, gently
    varying (a fixed formula, no randomness), and AWS on-demand at its list price."""
    hours = range(-72, 9)
    spot = [
        (AWS_V100, "aws", "us-east-1", "us-east-1a", 0.92, 0.12),
        (GCP_V100, "gcp", "us-central1", None, 0.76, 0.05),
        (AZURE_V100, "azure", "eastus", None, 0.62, 0.09),
    ]
    records = [
        PriceObservation(
            MarketKey(cloud, region, zone, kind_of, MarketKind.SPOT),
            start + timedelta(hours=k),
            round(base + swing * math.sin((k + 5 * n) / 9), 4),
        )
        for n, (kind_of, cloud, region, zone, base, swing) in enumerate(spot)
        for k in hours
    ]
    records += [
        PriceObservation(
            MarketKey("aws", "us-east-1", None, AWS_V100, MarketKind.ON_DEMAND),
            start + timedelta(hours=k),
            3.06,
        )
        for k in hours[::24]
    ]
    ingest(db, records)


def _capacity(markets: list[int], start: datetime) -> list[CapacityObservation]:
    """Half-hourly observations from three days before ``start`` to eight hours after: each
    market out of capacity for a while on a fixed pattern of its own."""
    rows = []
    for n, market in enumerate(markets):
        for k in range(-144, 17):
            down = (k + 7 * n) % (24 + 6 * n) < 3 + 2 * n
            rows.append(
                CapacityObservation(
                    market_id=market,
                    observed_at=start + timedelta(minutes=30 * k),
                    source="test",
                    available=not down,
                )
            )
    return rows


def _progress(session: Session, job_id: int, lives: list[tuple[int, datetime, datetime, int, int]]) -> None:
    """Half-hourly progress points of each life (epoch, from, to, steps at from, steps at to),
    linear in between; the job row holds the last, as the executor leaves it."""
    for epoch, since, until, first, last in lives:
        count = max(int((until - since) / timedelta(minutes=30)), 1)
        for k in range(count + 1):
            at = since + (until - since) * k / count
            session.add(
                JobProgress(job_id=job_id, at=at, epoch=epoch, steps=first + (last - first) * k // count)
            )
    job = session.get(ManagedJob, job_id)
    assert job is not None
    job.steps, job.heartbeat_at = lives[-1][4], lives[-1][2]


def fill(db: Database, tmp_path: Path, start: datetime = T0) -> dict[str, int]:
    """Fill ``db`` with a fleet submitted at ``start`` and watched for eight hours after (the
    dashboard tests pass a ``start`` eight hours ago, so spends and dates read as a live fleet's);
    returns job ids by state."""
    seed_markets(db)
    _prices(db, start)
    aws, gcp, azure = (market_id(db, m) for m in (AWS_V100, GCP_V100, AZURE_V100))
    ids: dict[str, int] = {}
    for i, state in enumerate(JOB_STATES):
        path = tmp_path / f"job{i}.yaml"
        path.write_text(_spec(NAMES[state], _budget(state, i)))
        ids[state] = int(jobs.submit(db, path, now=start).id)
        _walk(db, ids[state], PATHS[state], start)
    h = timedelta(hours=1)
    # running: started on GCP, preempted, recovered onto AWS where it runs now.
    run = ids["running"]
    first = place(db, run, gcp, start, start + 2 * h, "preempted", usd_per_hour=0.74)
    move(db, run, "start", "cheapest market", start, to_placement=first, finished=start)
    now_on = place(db, run, aws, start + 2 * h + timedelta(minutes=10), epoch=2)
    move(
        db,
        run,
        "recover",
        "preempted on gcp",
        start + 2 * h,
        from_placement=first,
        to_placement=now_on,
        finished=start + 2 * h + timedelta(minutes=10),
    )
    # launching: an open start move, no instance yet.
    place(db, ids["launching"], azure, None)
    move(db, ids["launching"], "start", "cheapest market", start + 3 * h, outcome=None, market=azure)
    # moving (the markup job): runs on AWS, an open move to Azure whose reason is markup too.
    on = place(db, ids["moving"], aws, start + h, usd_per_hour=0.9)
    move(
        db,
        ids["moving"],
        "move",
        f"cheaper: {MARKUP}",
        start + 4 * h,
        outcome=None,
        from_placement=on,
        market=azure,
    )
    # recovering: noticed on Azure.
    place(db, ids["recovering"], azure, start, start + 3 * h, "noticed", usd_per_hour=0.6)
    # done and over-budget: ended instances.
    place(db, ids["done"], gcp, start, start + 5 * h, "finished", usd_per_hour=0.74)
    place(db, ids["over-budget"], aws, start, start + 6 * h, "over-budget", usd_per_hour=0.9)
    with db.session() as session:
        marked = session.get(ManagedJob, ids["moving"])
        assert marked is not None
        marked.name = MARKUP
        marked.placement_id = on
        running = session.get(ManagedJob, run)
        assert running is not None
        running.placement_id = now_on
        # The running job lost the steps past its last checkpoint (16,500) to the preemption.
        _progress(
            session,
            run,
            [
                (1, start, start + 2 * h, 0, 17_800),
                (2, start + 2 * h + timedelta(minutes=10), start + 8 * h, 16_500, 70_500),
            ],
        )
        _progress(session, ids["moving"], [(1, start + h, start + 8 * h, 0, 63_000)])
        _progress(session, ids["done"], [(1, start, start + 5 * h, 0, 90_000)])
        session.add_all(_capacity([aws, gcp, azure], start))
    return ids


def job_names(db: Database) -> list[str]:
    with db.session() as session:
        return list(session.scalars(select(ManagedJob.name).order_by(ManagedJob.id)))
