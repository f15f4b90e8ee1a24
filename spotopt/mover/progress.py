"""A managed job's progress over time: the points behind the dashboard's progress chart.

The job row keeps only the newest heartbeat (``ManagedJob.steps``), which is all a decision
needs; the chart needs the history. The executor hands every newer heartbeat to
``record_progress`` inside its own transaction (nothing here commits); ``progress_points`` reads
them back, ending on the job row's newest heartbeat so the chart ends where ``jobs show`` is.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotopt.db.models import JobProgress, ManagedJob

PROGRESS_EVERY = timedelta(minutes=5)
"""At most one point per job this often (heartbeats come every 30 s): 288 rows a job-day, enough
for a chart over hours to weeks. A new epoch is always recorded, so a restart is never thinned."""


def record_progress(session: Session, job_id: int, epoch: int, steps: int, at: datetime) -> None:
    """Add a point for ``job_id`` unless its newest point is of the same ``epoch`` and less than
    ``PROGRESS_EVERY`` before ``at``."""
    last = session.execute(
        select(JobProgress.at, JobProgress.epoch)
        .where(JobProgress.job_id == job_id)
        .order_by(JobProgress.at.desc(), JobProgress.id.desc())
        .limit(1)
    ).first()
    if last is None or last.epoch != epoch or at - last.at >= PROGRESS_EVERY:
        session.add(JobProgress(job_id=job_id, at=at, epoch=epoch, steps=steps))


def progress_points(session: Session, job: ManagedJob) -> list[tuple[datetime, int]]:
    """(time, steps) in time order: the recorded points, then the job row's newest heartbeat
    where it is later than the last of them (a point thinned away by ``PROGRESS_EVERY``)."""
    points = [
        (at, steps)
        for at, steps in session.execute(
            select(JobProgress.at, JobProgress.steps)
            .where(JobProgress.job_id == job.id)
            .order_by(JobProgress.at, JobProgress.id)
        )
    ]
    if job.heartbeat_at is not None and (not points or job.heartbeat_at > points[-1][0]):
        points.append((job.heartbeat_at, job.steps))
    return points
