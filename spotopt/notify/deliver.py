"""Delivery: at least once, in order per job per sink, with exponential backoff, never for long.

``deliver`` is the bounded step the daemon runs at the end of each round. Per sink, it takes the
oldest undelivered events (at most ``limit``) in outbox order. An event whose job has an earlier
event not yet acknowledged by that sink waits behind it (order per job); a failure is retried
after ``BACKOFF_S`` doubled per attempt, capped at ``BACKOFF_CAP_S``, by the injected clock (so
a simulated outage is simulated minutes); a sink found unreachable gets nothing more this round.
Each outcome is committed right after the send: a process killed between the send and that
commit sends the event again after its restart, with the same key (at least once), and a
receiver drops the repeat by that key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.orm import Session

from spotopt.db.engine import Database
from spotopt.db.models import Notification, NotifyDelivery, NotifySink
from spotopt.notify.outbox import body
from spotopt.notify.sinks import DeliveryError, Sink

BACKOFF_S = 10.0
"""Wait before the second try of an event; doubled after each failed try."""
BACKOFF_CAP_S = 600.0
"""The longest wait between tries: a receiver back from an outage hears within ten minutes."""
BACKLOG = timedelta(days=1)
"""A sink seen for the first time is sent the events of the last day, not the whole history."""
FILTERED = "filtered out by the sink's settings"
"""``last_error`` of an event a sink's filter left out (recorded as done, never sent)."""


def backoff_s(attempts: int) -> float:
    """Seconds to wait after ``attempts`` failed tries (1 → ``BACKOFF_S``)."""
    return float(min(BACKOFF_CAP_S, BACKOFF_S * 2.0 ** (attempts - 1)))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one sink's step did."""

    sink: str
    delivered: int = 0
    failed: int = 0
    waiting: int = 0


def _sink_row(session: Session, name: str, now: datetime) -> NotifySink:
    """The sink's row, made at its first sight with ``since_id`` at the first event of ``BACKLOG``."""
    row = session.get(NotifySink, name)
    if row is None:
        first = session.scalar(select(func.min(Notification.id)).where(Notification.at >= now - BACKLOG))
        newest = session.scalar(select(func.max(Notification.id))) or 0
        row = NotifySink(name=name, since_id=first if first is not None else newest + 1, failures_in_a_row=0)
        session.add(row)
        session.flush()
    return row


def _unacknowledged(sink: str, since_id: Any) -> ColumnElement[bool]:
    """The events from ``since_id`` on that ``sink`` has not acknowledged (or filtered out)."""
    done = select(NotifyDelivery.notification_id).where(
        NotifyDelivery.sink == sink, NotifyDelivery.delivered_at.is_not(None)
    )
    return and_(Notification.id >= since_id, Notification.id.not_in(done))


def _pending(session: Session, sink: str, since_id: int, limit: int) -> list[int]:
    """Ids of the events ``sink`` has not had acknowledged, oldest first."""
    query = select(Notification.id).where(_unacknowledged(sink, since_id))
    return list(session.scalars(query.order_by(Notification.id).limit(limit)))


def deliver_sink(db: Database, sink: Sink, now: datetime, *, timeout_s: float, limit: int = 50) -> Outcome:
    """One sink's bounded step (see the module docstring)."""
    with db.session() as session:
        ids = _pending(session, sink.name, _sink_row(session, sink.name, now).since_id, limit)
    blocked: set[str | None] = set()
    delivered = failed = waiting = 0
    for event_id in ids:
        with db.session() as session:
            row = session.get(Notification, event_id)
            assert row is not None
            job, kind, event = row.job_name, row.kind, body(row)
            state = session.get(NotifyDelivery, (event_id, sink.name)) or NotifyDelivery(
                notification_id=event_id, sink=sink.name, attempts=0
            )
            session.add(state)
            if not sink.filter.wants(kind, job):
                state.delivered_at, state.last_error = now, FILTERED
                continue
            if job in blocked or (state.next_try_at is not None and state.next_try_at > now):
                blocked.add(job)
                waiting += 1
                continue
        error = _send(sink, event, timeout_s)
        with db.session() as session:
            _record(session, sink.name, event_id, now, error)
        if error is None:
            delivered += 1
            continue
        failed += 1
        blocked.add(job)
        if error.down:
            break
    return Outcome(sink.name, delivered, failed, waiting)


def _send(sink: Sink, event: dict[str, object], timeout_s: float) -> DeliveryError | None:
    """Send one event; its failure as a ``DeliveryError`` (any other error named by its type
    only: its text could hold the sink's URL)."""
    try:
        sink.send(event, timeout_s)
    except DeliveryError as exc:
        return exc
    except Exception as exc:  # a sink set up wrong (a URL that is no URL) must not fail the round
        return DeliveryError(f"{sink.name}: {type(exc).__name__} (check the sink's settings)", down=True)
    return None


def _record(session: Session, sink: str, event_id: int, now: datetime, error: DeliveryError | None) -> None:
    """The try's outcome on the delivery and on the sink's run of failures."""
    state = session.get(NotifyDelivery, (event_id, sink), with_for_update=True)
    row = session.get(NotifySink, sink, with_for_update=True)
    assert state is not None and row is not None
    state.attempts += 1
    if error is None:
        state.delivered_at, state.next_try_at, state.last_error = now, None, None
        row.failures_in_a_row, row.last_error, row.last_delivered_at = 0, None, now
    else:
        state.next_try_at = now + timedelta(seconds=backoff_s(state.attempts))
        state.last_error = str(error)
        row.failures_in_a_row += 1
        row.last_error = str(error)


def deliver(db: Database, sinks: Sequence[Sink], now: datetime, *, timeout_s: float) -> list[Outcome]:
    """Every sink's step, one after the other (a sink that is down costs one ``timeout_s``)."""
    return [deliver_sink(db, sink, now, timeout_s=timeout_s) for sink in sinks]


def failing(session: Session, at_least: int) -> list[NotifySink]:
    """Sinks whose last ``at_least`` or more tries all failed."""
    return list(
        session.scalars(
            select(NotifySink).where(NotifySink.failures_in_a_row >= at_least).order_by(NotifySink.name)
        )
    )


def undelivered(session: Session, sink: str) -> int:
    """Events ``sink`` has yet to acknowledge (from its ``since_id`` on)."""
    since = select(NotifySink.since_id).where(NotifySink.name == sink).scalar_subquery()
    query = select(func.count()).select_from(Notification).where(_unacknowledged(sink, since))
    return int(session.scalar(query) or 0)
