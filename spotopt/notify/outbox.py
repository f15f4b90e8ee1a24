"""The outbox: ``add`` writes one event inside the caller's transaction.

An event's ``key`` is its idempotency key, the id a receiver sees (``X-Spotopt-Event-Id``). It is
random (uuid4) for an event that happens once, and derived from ``dedupe`` (uuid5) for one that
a later round could find again (a budget threshold crossed, an instance left billing): the second
``add`` with the same ``dedupe`` finds the first and writes nothing, so a repeat is never sent.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotopt.db.models import ManagedJob, Notification

KINDS = (
    "job.started",
    "job.moved",
    "job.preempted",
    "job.recovered",
    "job.retried",
    "job.failed",
    "job.done",
    "job.cancelled",
    "budget.threshold",
    "deadline.at_risk",
    "daemon.leaked_instance",
    "daemon.rounds_failing",
    "daemon.leadership_lost",
    "daemon.prices_stale",
)
"""Every event kind the outbox holds (a sink's ``events`` filter names some of them)."""

_NAMESPACE = uuid.UUID("5f0c2a4e-9a51-4d7e-8d53-40e1c6f1a040")
"""Namespace of the keys derived from a ``dedupe`` string (fixed: a key must never change)."""


def add(
    session: Session,
    kind: str,
    at: datetime,
    *,
    job: ManagedJob | None = None,
    payload: dict[str, Any] | None = None,
    dedupe: str | None = None,
) -> Notification | None:
    """Write event ``kind`` of ``job`` (None: the daemon's own) at ``at`` in the caller's
    transaction; the row, or None when ``dedupe`` names an event already written."""
    if kind not in KINDS:
        raise ValueError(f"notification kind {kind!r} is not one of {', '.join(KINDS)}")
    key = _key(dedupe) if dedupe is not None else uuid.uuid4().hex
    if dedupe is not None and session.scalar(select(Notification.id).where(Notification.key == key)):
        return None
    row = Notification(
        key=key,
        kind=kind,
        job_id=None if job is None else job.id,
        job_name=None if job is None else job.name,
        at=at,
        payload=json.dumps(payload or {}, sort_keys=True, default=str),
    )
    session.add(row)
    return row


def _key(dedupe: str) -> str:
    return uuid.uuid5(_NAMESPACE, dedupe).hex


def written(session: Session, dedupes: list[str]) -> set[str]:
    """Those of ``dedupes`` whose event is already in the outbox, in one query (a daemon round
    checks every running job's crossed budget thresholds)."""
    keys = {_key(d): d for d in dedupes}
    if not keys:
        return set()
    found = session.scalars(select(Notification.key).where(Notification.key.in_(list(keys))))
    return {keys[k] for k in found}


def body(row: Notification) -> dict[str, Any]:
    """The JSON body every sink sends (the webhook as is): ``id``, ``event``, ``job``, ``at`` and
    the event's own fields (``reason``, ``total_usd``...), which never override those four."""
    return {
        **json.loads(row.payload),
        "id": row.key,
        "event": row.kind,
        "job": row.job_name,
        "at": row.at.isoformat().replace("+00:00", "Z"),
    }
