"""Notifications (issue 40): each event kind is written to the outbox in the transaction of its
state change and reaches real local receivers (the webhook, signed, and Slack's format) on
SQLite and PostgreSQL; a receiver down for ten simulated minutes gets every event afterwards,
in order per job; a failing sink shows on ``daemon status``."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlalchemy import select

from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import ManagedJob, Notification
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.mover.executor import Executor
from spotopt.notify.deliver import BACKOFF_CAP_S
from spotopt.notify.sinks import Filter, Slack, Webhook
from tests.helpers import console, strict_json
from tests.mover_rows import AWS_V100, JOB, T0, market_id, place, seed_markets
from tests.notify_receiver import Receiver, serve

SECRET = "s3cr3t-for-the-hmac-9f1c"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found, server = serve()
    yield found
    found.release.set()
    server.shutdown()


@pytest.fixture
def slack() -> Iterator[Receiver]:
    found, server = serve()
    yield found
    server.shutdown()


def _submit(db: Database, tmp: Path, name: str, extra: str = "") -> ManagedJob:
    path = tmp / f"{name}.yaml"
    path.write_text(JOB.replace("name: resnet", f"name: {name}") + extra)
    return jobstore.submit(db, path, now=T0)


def _walk(db: Database, name: str, *steps: tuple[str, str]) -> None:
    """Take job ``name`` through ``(state, reason)`` steps, one transaction each, an hour apart."""
    for hour, (to_state, reason) in enumerate(steps, start=1):
        with db.session() as session:
            job = jobstore.find_job(session, name, lock=True)
            jobstore.record_transition(session, job, to_state, reason, T0 + timedelta(hours=hour))


def _kinds(db: Database) -> list[tuple[str | None, str]]:
    with db.session() as session:
        return [
            (n, k)
            for n, k in session.execute(
                select(Notification.job_name, Notification.kind).order_by(Notification.id)
            )
        ]


def _verify(request_raw: bytes, header: str) -> bool:
    """What a receiver does (docs/guides/notifications.md): recompute the HMAC of the raw body."""
    expected = "sha256=" + hmac.new(SECRET.encode(), request_raw, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, header)


def test_every_event_kind_reaches_the_webhook_signed_and_slack(
    db: Database, tmp_path: Path, receiver: Receiver, slack: Receiver
) -> None:
    seed_markets(db)
    _submit(db, tmp_path, "lifecycle")
    _walk(
        db,
        "lifecycle",
        ("launching", "start: aws/us-east-1a/p3.2xlarge"),
        ("running", "start: up"),
        ("moving", "price: cheaper"),
        ("running", "price: moved"),
        ("recovering", "lost: the instance was preempted"),
        ("running", "preempted: recovered"),
        ("recovering", "retry 1 of 3: the training process exited with status 1"),
        ("running", "retry: up again"),
        ("done", "finished: the agent marked the job complete"),
    )
    _submit(db, tmp_path, "crashy")
    log = tmp_path / "crashy.log"
    log.write_text("epoch 1\nTraceback (most recent call last):\nRuntimeError: CUDA error\n")
    _walk(db, "crashy", ("launching", "start"), ("running", "start: up"))
    with db.session() as session:
        job = jobstore.find_job(session, "crashy", lock=True)
        jobstore.after_failure(session, job, "exited with status 2", 2, T0 + timedelta(hours=3), str(log))
    _submit(db, tmp_path, "bye")
    _walk(db, "bye", ("cancelled", "cancelled by hand"))
    _submit(db, tmp_path, "spender")
    _walk(db, "spender", ("launching", "start"), ("running", "start: up"))
    spender = jobstore.get_job(db, "spender")
    place(db, spender.id, market_id(db, AWS_V100), T0, usd_per_hour=0.9)
    with db.session() as session:
        session.get(ManagedJob, spender.id).placement_id = place(  # type: ignore[union-attr]
            db, spender.id, market_id(db, AWS_V100), T0, usd_per_hour=0.9, epoch=2
        )
    provider = LocalProvider(tmp_path / "local")
    for hours in (30, 31, 45):  # $27 spent of $50 (54 %) twice, then $40.50 (81 %)
        Daemon(
            db, provider, DaemonSettings(), clock=lambda h=hours: T0 + timedelta(hours=h)
        )._enforce_budgets()
    _walk(db, "spender", ("over-budget", "budget: the next period would exceed budget_usd $50"))
    _submit(db, tmp_path, "late", "    deadline: 2026-03-02T12:00:00Z\n")
    Executor(db, provider, clock=lambda: T0).open_move(
        "late",
        "start",
        "deadline: aws/us-east-1/p3.2xlarge on-demand",
        market_id=market_id(db, AWS_V100, "on-demand"),
    )

    assert _kinds(db) == [
        ("lifecycle", "job.started"),
        ("lifecycle", "job.moved"),
        ("lifecycle", "job.preempted"),
        ("lifecycle", "job.recovered"),
        ("lifecycle", "job.retried"),
        ("lifecycle", "job.recovered"),
        ("lifecycle", "job.done"),
        ("crashy", "job.started"),
        ("crashy", "job.failed"),
        ("bye", "job.cancelled"),
        ("spender", "job.started"),
        ("spender", "budget.threshold"),
        ("spender", "budget.threshold"),
        ("spender", "budget.threshold"),
        ("late", "deadline.at_risk"),
    ]
    sinks = (Webhook(receiver.url, SecretStr(SECRET)), Slack(SecretStr(slack.url)))
    Daemon(db, None, DaemonSettings(sinks=sinks), clock=lambda: T0 + timedelta(days=1)).notify()

    assert [(b["job"], b["event"]) for b in receiver.bodies()] == _kinds(db)
    for request in receiver.requests:
        assert _verify(request.raw, request.headers["X-Spotopt-Signature"])
        assert request.headers["X-Spotopt-Event-Id"] == request.body["id"]
        assert {"id", "event", "job", "at"} <= set(request.body)
    bodies = receiver.bodies()
    assert len({b["id"] for b in bodies}) == len(bodies)
    by_kind = {b["event"]: b for b in bodies}
    assert by_kind["job.done"]["total_usd"] == 0.0 and by_kind["job.done"]["reason"].startswith("finished")
    assert "RuntimeError: CUDA error" in by_kind["job.failed"]["log_tail"]
    assert [b["percent"] for b in bodies if b["event"] == "budget.threshold"] == [50, 80, 100]
    assert by_kind["deadline.at_risk"]["move"] == "start"
    assert [r.headers["X-Spotopt-Event-Id"] for r in slack.requests] == [b["id"] for b in bodies]
    assert all(set(r.body) == {"text"} for r in slack.requests)
    assert slack.requests[-1].body["text"].startswith("spotopt: deadline.at_risk late")

    # Everything acknowledged: the next round sends nothing again.
    Daemon(db, None, DaemonSettings(sinks=sinks), clock=lambda: T0 + timedelta(days=1, hours=1)).notify()
    assert len(receiver.requests) == len(bodies) and len(slack.requests) == len(bodies)


def test_a_move_aborted_where_the_job_runs_is_no_news(db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    _submit(db, tmp_path, "stay")
    _walk(db, "stay", ("launching", "start"), ("running", "start: up"))
    with db.session() as session:
        job = jobstore.find_job(session, "stay", lock=True)
        jobstore.record_transition(session, job, "moving", "price: cheaper", T0 + timedelta(hours=3))
        jobstore.record_transition(
            session, job, "running", "move aborted: no capacity", T0 + timedelta(hours=4), announce=False
        )
    assert _kinds(db) == [("stay", "job.started")]


def test_a_rolled_back_state_change_leaves_no_event(db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    _submit(db, tmp_path, "undone")
    with pytest.raises(RuntimeError), db.session() as session:
        job = jobstore.find_job(session, "undone", lock=True)
        jobstore.record_transition(session, job, "cancelled", "by hand", T0)
        raise RuntimeError("the transaction fails after the change")
    assert jobstore.get_job(db, "undone").state == "pending"
    assert _kinds(db) == []


def test_a_receiver_down_ten_simulated_minutes_gets_every_event_in_order_per_job(
    db: Database, tmp_path: Path, receiver: Receiver
) -> None:
    seed_markets(db)
    for name in ("a", "b"):
        _submit(db, tmp_path, name)
    for step in range(3):  # a and b take turns: started, preempted, recovered
        for name in ("a", "b"):
            with db.session() as session:
                job = jobstore.find_job(session, name, lock=True)
                to_state = [("launching", "running"), ("recovering",), ("running",)][step]
                for state in to_state:
                    jobstore.record_transition(
                        session, job, state, f"{name} {state}", T0 + timedelta(minutes=step)
                    )
    clock = [T0 + timedelta(minutes=5)]
    daemon = Daemon(db, None, DaemonSettings(sinks=(Webhook(receiver.url, None),)), clock=lambda: clock[0])
    receiver.status = 503
    down_until = clock[0] + timedelta(minutes=10)
    while clock[0] < down_until:  # a round every 20 simulated seconds, the receiver down
        daemon.notify()
        clock[0] += timedelta(seconds=20)
    tried = len(receiver.requests)
    assert receiver.acknowledged == []
    assert tried < 30 / 2, "the backoff spaces the tries (a round every 20 s would be 30)"
    # Each round sent one request (the sink is down: nothing more that round), never b's before
    # a's older events were through.
    receiver.status = 200
    end = clock[0] + timedelta(seconds=BACKOFF_CAP_S)
    while clock[0] <= end:
        daemon.notify()
        clock[0] += timedelta(seconds=20)
    sent = {r.headers["X-Spotopt-Event-Id"]: r.body for r in receiver.requests}
    bodies = [sent[key] for key in receiver.acknowledged]  # in the order they were acknowledged
    with db.session() as session:
        keys = list(session.scalars(select(Notification.key).order_by(Notification.id)))
    assert sorted(receiver.acknowledged) == sorted(keys), "every event, each acknowledged once"
    for name in ("a", "b"):
        mine = [b["event"] for b in bodies if b["job"] == name]
        assert mine == ["job.started", "job.preempted", "job.recovered"]


def test_filters_pick_events_by_kind_and_job(db: Database, tmp_path: Path, receiver: Receiver) -> None:
    seed_markets(db)
    for name in ("train-big", "eval"):
        _submit(db, tmp_path, name)
        _walk(db, name, ("launching", "start"), ("running", "start: up"), ("failed", "broken"))
    sink = Webhook(receiver.url, None, Filter(events=("job.fail*",), jobs=("train-*",)))
    Daemon(db, None, DaemonSettings(sinks=(sink,)), clock=lambda: T0 + timedelta(hours=5)).notify()
    assert [(b["job"], b["event"]) for b in receiver.bodies()] == [("train-big", "job.failed")]


def test_a_failing_sink_is_reported_on_daemon_status_and_notify_list(
    db_url: str, db: Database, tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_markets(db)
    _submit(db, tmp_path, "x")
    _walk(db, "x", ("cancelled", "by hand"))
    receiver.status = 500
    daemon = Daemon(
        db, None, DaemonSettings(sinks=(Webhook(receiver.url, SecretStr(SECRET)),)), clock=lambda: T0
    )
    for minutes in range(0, 60, 5):
        daemon.clock = lambda m=minutes: T0 + timedelta(minutes=m)
        daemon.notify()
    monkeypatch.setenv("SPOTOPT_NOTIFY_FAILURES_ALERT", "3")
    status = strict_json(console(db_url, "daemon", "status", "--format", "json").stdout)
    [sink] = status["notify_sinks"]
    assert sink["sink"] == "webhook" and sink["failing"] and sink["failures_in_a_row"] >= 3
    assert sink["last_error"] == "the webhook answered HTTP 500 Internal Server Error"
    assert sink["undelivered"] == 1
    table = console(db_url, "daemon", "status").stdout
    assert "webhook FAILING" in table
    failed = strict_json(console(db_url, "notify", "list", "--failed", "--format", "json").stdout)
    assert [(r["event"], r["job"], r["sink"], r["state"]) for r in failed] == [
        ("job.cancelled", "x", "webhook", "failing")
    ]
    receiver.status = 200
    daemon.clock = lambda: T0 + timedelta(hours=2)
    daemon.notify()
    assert strict_json(console(db_url, "notify", "list", "--failed", "--format", "json").stdout) == []
    listed = strict_json(console(db_url, "notify", "list", "--format", "json").stdout)
    assert [r["state"] for r in listed] == ["delivered"]
    assert (
        strict_json(console(db_url, "daemon", "status", "--format", "json").stdout)["notify_sinks"][0][
            "failing"
        ]
        is False
    )


def test_job_done_tells_the_total_and_the_saving_against_on_demand(
    db: Database, tmp_path: Path, receiver: Receiver
) -> None:
    seed_markets(db)  # AWS V100: spot $0.90/h, on-demand $3.06/h
    job = _submit(db, tmp_path, "thrifty")
    _walk(db, "thrifty", ("launching", "start"), ("running", "start: up"))
    place(db, job.id, market_id(db, AWS_V100), T0, T0 + timedelta(hours=10), "exited", usd_per_hour=0.9)
    with db.session() as session:
        row = jobstore.find_job(session, "thrifty", lock=True)
        jobstore.record_transition(session, row, "done", "finished", T0 + timedelta(hours=10))
    Daemon(
        db, None, DaemonSettings(sinks=(Webhook(receiver.url, None),)), clock=lambda: T0 + timedelta(days=1)
    ).notify()
    done = receiver.bodies()[-1]
    assert done["event"] == "job.done"
    assert done["total_usd"] == pytest.approx(9.0)
    assert done["on_demand_usd"] == pytest.approx(30.6)
    assert done["saving_vs_on_demand_usd"] == pytest.approx(21.6)
