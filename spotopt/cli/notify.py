"""``spotopt notify``: try a sink now, and list what the outbox holds and where it went."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from sqlalchemy import and_, select

from spotopt.cli.common import FormatOption, WideOption, state
from spotopt.db.models import Notification, NotifyDelivery
from spotopt.errors import ConfigError, InputError
from spotopt.notify.deliver import FILTERED
from spotopt.notify.sinks import DeliveryError, by_name, configured
from spotopt.render import Format, iso, render, say
from spotopt.settings import Settings

app = typer.Typer(
    no_args_is_help=True,
    help="Notifications: the events the daemon delivers to webhooks, Slack, e-mail or a command.",
)

SINKS = ("webhook", "slack", "email", "command")


@app.command("test")
def test(
    sink: Annotated[str, typer.Argument(help="The sink to try: webhook, slack, email or command.")],
) -> None:
    """Send a ``notify.test`` event to SINK now, as the daemon would (signed, with an id), and say
    whether it acknowledged it. Nothing is written to the history."""
    if sink not in SINKS:
        raise InputError(f"SINK: {sink!r} is not a sink; use one of {', '.join(SINKS)}")
    settings = Settings()
    chosen = by_name(configured(settings), sink)
    if chosen is None:
        raise ConfigError(
            f"SINK: the {sink} sink is not set up; set its SPOTOPT_NOTIFY_* settings "
            "(docs/guides/notifications.md)"
        )
    now = datetime.now(UTC)
    event = {"id": uuid.uuid4().hex, "event": "notify.test", "job": None, "at": iso(now)}
    try:
        chosen.send(event, settings.notify_timeout_s)
    except DeliveryError as exc:
        raise ConfigError(f"{sink}: {exc}") from None
    say(f"{sink} acknowledged test event {event['id']}")


def _state(delivery: NotifyDelivery | None) -> str:
    """One word for where an event stands with a sink."""
    if delivery is None or (delivery.delivered_at is None and not delivery.attempts):
        return "waiting"
    if delivery.delivered_at is not None:
        return "filtered" if delivery.last_error == FILTERED else "delivered"
    return "failing"


@app.command("list")
def list_cmd(
    ctx: typer.Context,
    failed: Annotated[
        bool, typer.Option("--failed", help="Only deliveries tried and not yet acknowledged.")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="The newest N events.")] = 50,
    fmt: FormatOption = Format.TABLE,
    wide: WideOption = False,
) -> None:
    """The outbox's newest events, one row per event and sink that has seen it: delivered,
    failing (tried, to be tried again at ``next_try_at``), waiting or filtered out."""
    db = state(ctx).db()
    query = (
        select(Notification, NotifyDelivery)
        .outerjoin(NotifyDelivery, NotifyDelivery.notification_id == Notification.id)
        .order_by(Notification.id.desc(), NotifyDelivery.sink)
    )
    if failed:
        query = query.where(and_(NotifyDelivery.delivered_at.is_(None), NotifyDelivery.attempts > 0))
    with db.session() as session:
        ids = select(Notification.id).order_by(Notification.id.desc()).limit(limit).scalar_subquery()
        rows: list[dict[str, Any]] = [
            {
                "id": event.key,
                "event": event.kind,
                "job": event.job_name,
                "at": event.at,
                "sink": delivery.sink if delivery is not None else None,
                "state": _state(delivery),
                "attempts": delivery.attempts if delivery is not None else 0,
                "next_try_at": delivery.next_try_at if delivery is not None else None,
                "delivered_at": delivery.delivered_at if delivery is not None else None,
                "last_error": delivery.last_error if delivery is not None else None,
            }
            for event, delivery in session.execute(query.where(Notification.id.in_(ids)))
        ]
    render(
        rows,
        fmt,
        title="Notifications (newest first)",
        columns=(
            "id",
            "event",
            "job",
            "at",
            "sink",
            "state",
            "attempts",
            "next_try_at",
            "delivered_at",
            "last_error",
        ),
        wide_only=("id", "delivered_at"),
        wide=wide,
        clip=("last_error",),
        empty="no failed delivery" if failed else "no event yet (the daemon writes them as jobs change)",
    )
