"""Where a managed job stands: where it runs, how far it got, what it has spent and will spend.

``jobs show`` prints this. Every number comes from a place that already owns it: spend from the
ledger (``spotopt.mover.ledger``), the expected steps/s from the planner's own throughput book
(``spotopt.throughput.JobThroughput`` over the spec and the throughput store) and the work from
``spotopt.decide.options.work_steps``, so what ``show`` says agrees with what the planner decided on.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotopt.checkpoints import Manifest, read_lease, trusted_checkpoints
from spotopt.clouds.common.base import market_label
from spotopt.db.engine import Database
from spotopt.db.models import InstanceType, JobEvent, JobMove, JobProgress, ManagedJob, Market, Placement
from spotopt.decide.options import work_steps
from spotopt.errors import InputError
from spotopt.history.throughput_store import stored_figures
from spotopt.jobspec import Job
from spotopt.mover.executor import job_location
from spotopt.mover.jobs import find_job, job_events, job_spec
from spotopt.mover.ledger import Interval, intervals, market_key, slot_usd_per_hour, spent_usd
from spotopt.mover.observed import PREEMPTION_ENDS
from spotopt.throughput import Figure, JobThroughput


def ledger(db: Database, name: str, now: datetime) -> tuple[ManagedJob, list[Interval]]:
    """``jobs cost``: the job called ``name`` and every instance interval it used, billed to ``now``."""
    with db.session() as session:
        job = find_job(session, name)
        return job, intervals(session, job.id, now)


def show(db: Database, name: str, now: datetime) -> tuple[ManagedJob, dict[str, Any], list[JobEvent]]:
    """``jobs show``: the job, its ``job_status`` at ``now`` and its state transitions, read in one
    transaction (so spend, moves and state agree with each other)."""
    with db.session() as session:
        job = find_job(session, name)
        status = job_status(session, job, job_spec(job), now)
        return job, status, job_events(session, job)


def resume_checkpoint(job: ManagedJob) -> Manifest | None:
    """The checkpoint the job's next placement resumes from: the newest its store's lease
    trusts, as the agent chooses it (``spotopt.checkpoints.restore_latest``, which falls back
    to an older one only if this one's files no longer verify). None: it starts from step 0.

    Read from the store, not the job row: the row keeps the newest checkpoint a heartbeat
    reported, and a stop's own checkpoint (``jobs cancel``, a move) is written after the last
    heartbeat the daemon recorded.
    """
    loc = job_location(job)
    newest = trusted_checkpoints(loc, job.name, read_lease(loc, job.name))
    return newest[0] if newest else None


def newest_placement(db: Database, name: str) -> Placement | None:
    """The newest placement of ``name`` that got an instance (``jobs logs``): the one running,
    or the last that ran; None before the first launch."""
    with db.session() as session:
        job = find_job(session, name)
        found = session.scalar(
            select(Placement)
            .where(Placement.job_id == job.id, Placement.instance_id.is_not(None))
            .order_by(Placement.id.desc())
            .limit(1)
        )
        if found is not None:
            session.expunge(found)
        return found


def job_status(session: Session, job: ManagedJob, spec: Job, now: datetime) -> dict[str, Any]:
    """The live part of ``jobs show``: ``placement``, ``progress``, ``throughput``,
    ``checkpoint_verified``, ``moves``, ``preemptions``, ``spent_usd`` and
    ``expected_cost_to_finish_usd``.

    ``placement`` is None while the job runs nowhere, and so are the expected steps/s and the
    cost to finish (there is no GPU and no price to base them on). Running instances are billed
    up to ``now``.
    """
    book = JobThroughput(spec, stored_figures(session))
    try:
        work: float | None = work_steps(spec, book)
    except InputError:
        work = None  # work given in GPU-days of a GPU the job has no figure for: unknown in steps
    current = session.get(Placement, job.placement_id) if job.placement_id is not None else None
    if current is not None and current.state in ("ended", "failed"):
        current = None
    expected = _expected_figure(session, book, current) if current is not None else None
    slot_usd = slot_usd_per_hour(session, current, now, now) if current is not None else None
    remaining = None if work is None else max(work - job.steps, 0.0)
    moved = moves(session, job.id)
    to_finish = None
    if remaining is not None and expected is not None and slot_usd is not None:
        to_finish = remaining / (expected.steps_per_s * 3600.0) * slot_usd
    return {
        "placement": None if current is None else _placement(session, current, slot_usd),
        "progress": {
            "steps": job.steps,
            "work_steps": work,
            "done_fraction": None if not work else min(job.steps / work, 1.0),
            "steps_per_s_measured": measured_steps_per_s(session, job, current is not None),
            "steps_per_s_expected": None if expected is None else expected.steps_per_s,
            "expected_source": None if expected is None else expected.source,
            "heartbeat_at": job.heartbeat_at,
        },
        "throughput": None if expected is None else throughput(expected),
        "checkpoint_verified": _newest_checkpoint(job, moved),
        "moves": moved,
        "preemptions": preemptions(session, job.id),
        "spent_usd": spent_usd(session, job.id, now),
        "expected_cost_to_finish_usd": to_finish,
    }


def throughput(figure: Figure) -> dict[str, Any]:
    """The planner's figure for a placement as ``jobs show`` and the dashboard give it: steps/s,
    its 80 % interval (``low``/``high``; a figure as given is its own), its ``source`` (spec,
    measured, imported, estimated) and the reference workloads an estimate was made from."""
    low, high = figure.interval
    return {
        "steps_per_s": figure.steps_per_s,
        "low": low,
        "high": high,
        "source": figure.source,
        "references": list(figure.references),
    }


def throughput_words(figure: dict[str, Any]) -> tuple[str, str]:
    """A ``throughput`` as words: the number (an estimate's marked ``≈``) and where it came from
    (an estimate: its interval and references), so every place that prints one marks an
    estimate the same way: ``("≈ 2.5", "estimated, 1.9–3.1, from bert, cifar10")``."""
    if figure["source"] != "estimated":
        return f"{figure['steps_per_s']:.3g}", figure["source"]
    refs = ", ".join(figure["references"])
    detail = f"estimated, {figure['low']:.3g}–{figure['high']:.3g}" + (f", from {refs}" if refs else "")
    return f"≈ {figure['steps_per_s']:.3g}", detail


def measured_steps_per_s(session: Session, job: ManagedJob, running: bool) -> float | None:
    """What the job measured: while it runs, its newest heartbeat's steps/s; once it has
    stopped (done, cancelled, waiting), the average over its last placement's recorded
    progress. A finished or stopped agent's last heartbeat comes after its last step, so its
    own rate is 0 (``jobs show`` said ``0 measured`` for a job that ran 2,000 steps)."""
    if running or job.heartbeat_at is None:
        return job.steps_per_s
    epoch = select(func.max(JobProgress.epoch)).where(JobProgress.job_id == job.id).scalar_subquery()
    first = session.execute(
        select(JobProgress.at, JobProgress.steps)
        .where(JobProgress.job_id == job.id, JobProgress.epoch == epoch)
        .order_by(JobProgress.at, JobProgress.id)
        .limit(1)
    ).first()
    if first is None or job.heartbeat_at <= first.at or job.steps <= first.steps:
        return job.steps_per_s
    return (job.steps - first.steps) / (job.heartbeat_at - first.at).total_seconds()


def _newest_checkpoint(job: ManagedJob, moved: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest verified checkpoint the daemon knows of: the newest heartbeat's, or a move's
    (a stop's or a move's own checkpoint, verified after the agent's last heartbeat was read)."""
    known = [(m["checkpoint_step"], m["checkpoint_name"]) for m in moved if m["checkpoint_name"]]
    if job.checkpoint_name is not None:
        known.append((job.checkpoint_step, job.checkpoint_name))
    if not known:
        return None
    step, name = max(known)
    return {"name": name, "step": step}


def _expected_figure(session: Session, book: JobThroughput, p: Placement) -> Figure | None:
    """The planner's steps/s for the placement's GPU model and GPU count."""
    gpu_model = session.scalar(
        select(InstanceType.gpu_model)
        .join(Market, Market.instance_type_id == InstanceType.id)
        .where(Market.id == p.market_id)
    )
    return None if gpu_model is None else book.at(gpu_model, p.gpus)


def _placement(session: Session, p: Placement, slot_usd: float | None) -> dict[str, Any]:
    return {
        "id": p.id,
        "market": market_label(market_key(session, p.market_id)),
        "provider": p.provider,
        "instance_id": p.instance_id,
        "epoch": p.epoch,
        "state": p.state,
        "gpus": p.gpus,
        "started_at": p.started_at,
        "usd_per_hour": slot_usd,
    }


def moves(session: Session, job_id: int) -> list[dict[str, Any]]:
    """Every move of the job (start, move, recover, stop), oldest first, with its markets."""
    rows = session.scalars(
        select(JobMove).where(JobMove.job_id == job_id).order_by(JobMove.created_at, JobMove.id)
    ).all()
    market_of = dict(
        session.execute(select(Placement.id, Placement.market_id).where(Placement.job_id == job_id)).all()
    )
    labels: dict[int, str] = {}

    def label(market_id: int | None) -> str | None:
        if market_id is None:
            return None
        if market_id not in labels:
            labels[market_id] = market_label(market_key(session, market_id))
        return labels[market_id]

    return [
        {
            "id": m.id,
            "kind": m.kind,
            "reason": m.reason,
            "step": m.step,
            "outcome": m.outcome,
            "from_market": label(market_of.get(m.from_placement_id) if m.from_placement_id else None),
            "to_market": label(market_of.get(m.to_placement_id) if m.to_placement_id else m.market_id),
            "gpus": m.gpus,
            "saving_usd": m.saving_usd,
            "cost_usd": m.cost_usd,
            "checkpoint_name": m.checkpoint_name,
            "checkpoint_step": m.checkpoint_step,
            "created_at": m.created_at,
            "finished_at": m.finished_at,
        }
        for m in rows
    ]


def preemptions(session: Session, job_id: int) -> int:
    """How many of the job's instances the cloud took away or gave notice to (``PREEMPTION_ENDS``)."""
    count = session.scalar(
        select(func.count())
        .select_from(Placement)
        .where(Placement.job_id == job_id, Placement.end_reason.in_(PREEMPTION_ENDS))
    )
    return int(count or 0)
