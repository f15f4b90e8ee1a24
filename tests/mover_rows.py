"""Rows the executor would write (markets, a managed job, placements, moves), built directly so
the ledger, ``jobs show``/``cost``/``budget`` and the observed-data writers are tested without it."""

from __future__ import annotations

import itertools
from datetime import datetime
from pathlib import Path

from sqlalchemy import select

from spotopt.db.engine import Database
from spotopt.db.models import InstanceType, JobMove, Market, Placement
from spotopt.mover import jobs
from spotopt.types import MarketKind
from tests.helpers import ingest, price, t

T0 = t("2026-03-01 12:00")

AWS_V100 = "p3.2xlarge"
GCP_V100 = "n1-standard-8+1xnvidia-tesla-v100"
AZURE_V100 = "Standard_NC6s_v3"

JOB = """
jobs:
  - name: resnet
    throughput: {V100: 2.5}
    work: {steps: 90000}
    run: python train.py
    checkpoint: {uri: ckpt, every: 10m}
    budget_usd: 50
    max_usd_per_hour: 4
"""

_keys = itertools.count()


def seed_markets(db: Database) -> None:
    """One-V100 markets on each cloud, priced from ``T0 - 1h``: AWS spot $0.90 and on-demand
    $3.06, GCP spot $0.74, Azure spot $0.60 (all bundled catalog types)."""
    ingest(
        db,
        [
            price(AWS_V100, "2026-03-01 11:00", 0.90),
            price(AWS_V100, "2026-03-01 11:00", 3.06, zone=None, kind=MarketKind.ON_DEMAND),
            price(GCP_V100, "2026-03-01 11:00", 0.74, cloud="gcp", region="us-central1", zone=None),
            price(AZURE_V100, "2026-03-01 11:00", 0.60, cloud="azure", region="eastus", zone=None),
        ],
    )


def market_id(db: Database, instance_type: str, kind: str = "spot") -> int:
    with db.session() as session:
        found = session.scalar(
            select(Market.id)
            .join(InstanceType, InstanceType.id == Market.instance_type_id)
            .where(InstanceType.name == instance_type, Market.kind == kind)
        )
    assert found is not None, f"no {kind} market of {instance_type}"
    return found


def submit(db: Database, tmp_path: Path, spec: str = JOB) -> int:
    path = tmp_path / "job.yaml"
    path.write_text(spec)
    return int(jobs.submit(db, path, now=T0).id)


def place(
    db: Database,
    job_id: int,
    market: int,
    started: datetime | None,
    ended: datetime | None = None,
    reason: str | None = None,
    *,
    usd_per_hour: float = 0.9,
    instances: float = 1.0,
    epoch: int = 1,
    gpus: int = 1,
    provider: str = "local",
) -> int:
    """A placement as the executor leaves it: running while ``ended`` is None, else ended."""
    key = next(_keys)
    state = "launching" if started is None else "running" if ended is None else "ended"
    with db.session() as session:
        row = Placement(
            job_id=job_id,
            epoch=epoch,
            key=f"job{job_id}-p{key}",
            provider=provider,
            market_id=market,
            gpus=gpus,
            instances=instances,
            usd_per_hour=usd_per_hour,
            instance_id=None if started is None else f"i-{key:04d}",
            state=state,
            created_at=started or T0,
            started_at=started,
            ended_at=ended,
            end_reason=reason,
        )
        session.add(row)
        session.flush()
        return row.id


def move(
    db: Database,
    job_id: int,
    kind: str,
    reason: str,
    at: datetime,
    *,
    outcome: str | None = "done",
    from_placement: int | None = None,
    to_placement: int | None = None,
    market: int | None = None,
    saving_usd: float = 0.0,
    cost_usd: float = 0.0,
    finished: datetime | None = None,
) -> int:
    with db.session() as session:
        row = JobMove(
            job_id=job_id,
            kind=kind,
            reason=reason,
            step="finished" if outcome else "launching",
            from_placement_id=from_placement,
            to_placement_id=to_placement,
            market_id=market,
            gpus=1,
            saving_usd=saving_usd,
            cost_usd=cost_usd,
            outcome=outcome,
            created_at=at,
            updated_at=finished or at,
            finished_at=finished,
        )
        session.add(row)
        session.flush()
        return row.id
