"""Notifications through the installed ``spotopt``: a daemon SIGKILLed in the middle of a send
delivers the event after its restart with the same idempotency key, once per receiver that
acknowledges it; a sink's secrets appear nowhere in the daemon's log, the database or any
command's output (issue 40)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, select

from spotopt.db.engine import Database
from spotopt.db.models import Notification, NotifyDelivery
from tests.helpers import console, strict_json
from tests.mover_rows import JOB, seed_markets
from tests.notify_receiver import Receiver, serve

SPOTOPT = Path(sys.executable).parent / "spotopt"
HOOK_SECRET = "hook-secret-5b7e0d21"
SLACK_TOKEN = "slack-token-c41f9a77"
SMTP_PASSWORD = "smtp-password-0e3b66d8"
LIMIT_S = 120.0
"""Only a broken build waits this long for the daemon's request."""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found, server = serve()
    yield found
    found.release.set()
    server.shutdown()


def _daemon(db_url: str, tmp: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    """``spotopt daemon run --once`` on the local provider, as a user starts it."""
    return subprocess.Popen(
        [str(SPOTOPT), "--db", db_url, "daemon", "run", "--once", "--state-dir", str(tmp / "state")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def _cancelled_job(db_url: str, db: Database, tmp: Path) -> None:
    """A job submitted and cancelled through the CLI: a ``job.cancelled`` event in the outbox."""
    seed_markets(db)
    spec = tmp / "job.yaml"
    spec.write_text(JOB)
    assert console(db_url, "jobs", "submit", spec).returncode == 0
    done = console(db_url, "jobs", "cancel", "resnet")
    assert done.returncode == 0, done.stderr


def test_a_daemon_killed_mid_send_delivers_after_restart_with_the_same_key(
    db_url: str, db: Database, tmp_path: Path, receiver: Receiver
) -> None:
    _cancelled_job(db_url, db, tmp_path)
    env = {"SPOTOPT_NOTIFY_WEBHOOK_URL": receiver.url, "SPOTOPT_NOTIFY_WEBHOOK_SECRET": HOOK_SECRET}
    receiver.hang = True  # the request arrives and is never answered: the daemon is mid-send
    first = _daemon(db_url, tmp_path, env)
    try:
        assert receiver.arrived.wait(LIMIT_S), first.communicate(timeout=LIMIT_S)
        first.send_signal(signal.SIGKILL)
        first.wait(LIMIT_S)
    finally:
        first.kill()
    assert first.returncode == -signal.SIGKILL
    receiver.hang = False
    receiver.release.set()
    with db.session() as session:
        [key] = session.scalars(select(Notification.key))
        assert session.scalar(select(NotifyDelivery.delivered_at)) is None

    second = _daemon(db_url, tmp_path, env)
    _out, err = second.communicate(timeout=LIMIT_S)
    assert second.returncode == 0, err
    assert [r.headers["X-Spotopt-Event-Id"] for r in receiver.requests] == [key, key]
    assert receiver.acknowledged == [key]
    assert receiver.requests[1].body["event"] == "job.cancelled"

    third = _daemon(db_url, tmp_path, env)  # acknowledged: never sent again
    assert third.communicate(timeout=LIMIT_S) and third.returncode == 0
    assert receiver.acknowledged == [key] and len(receiver.requests) == 2


def _dump(db_url: str) -> str:
    """Every row of every table, as text (what a database dump holds)."""
    engine = create_engine(db_url)
    try:
        meta = MetaData()
        meta.reflect(engine)
        with engine.connect() as conn:
            return "\n".join(
                repr(row) for table in meta.sorted_tables for row in conn.execute(table.select())
            )
    finally:
        engine.dispose()


def test_a_sinks_secrets_are_nowhere_in_logs_database_or_output(
    db_url: str, db: Database, tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cancelled_job(db_url, db, tmp_path)
    receiver.status = 500  # failures: the errors are stored, shown and logged too
    env = {
        "SPOTOPT_NOTIFY_WEBHOOK_URL": receiver.url,
        "SPOTOPT_NOTIFY_WEBHOOK_SECRET": HOOK_SECRET,
        "SPOTOPT_NOTIFY_SLACK_URL": f"{receiver.url}/services/{SLACK_TOKEN}",
        "SPOTOPT_NOTIFY_SMTP_HOST": "127.0.0.1",
        "SPOTOPT_NOTIFY_SMTP_PORT": "9",  # nothing listens: a failure with the password set
        "SPOTOPT_NOTIFY_SMTP_USER": "ops",
        "SPOTOPT_NOTIFY_SMTP_PASSWORD": SMTP_PASSWORD,
        "SPOTOPT_NOTIFY_SMTP_FROM": "spotopt@example.com",
        "SPOTOPT_NOTIFY_SMTP_TO": "ops@example.com",
        "SPOTOPT_NOTIFY_FAILURES_ALERT": "1",
    }
    for name, value in env.items():  # the console helper passes os.environ on
        monkeypatch.setenv(name, value)
    seen = []
    daemon = _daemon(db_url, tmp_path, env)
    seen.extend(daemon.communicate(timeout=LIMIT_S))
    assert daemon.returncode == 0
    for args in (
        ("daemon", "status"),
        ("daemon", "status", "--format", "json"),
        ("notify", "list"),
        ("notify", "list", "--failed", "--format", "json"),
        ("notify", "list", "--format", "csv"),
        ("notify", "test", "webhook"),
        ("notify", "test", "slack"),
        ("notify", "test", "email"),
        ("jobs", "show", "resnet", "--format", "json"),
    ):
        done = console(db_url, *args)
        seen += [done.stdout, done.stderr]
    failed = strict_json(console(db_url, "notify", "list", "--failed", "--format", "json").stdout)
    assert {r["sink"] for r in failed} == {"webhook", "slack", "email"}, "each sink failed, its error stored"
    assert all(r["last_error"] for r in failed)
    seen.append(_dump(db_url))
    text = "\n".join(seen)
    for secret in (HOOK_SECRET, SLACK_TOKEN, SMTP_PASSWORD):
        assert secret not in text
    assert "the webhook answered HTTP 500" in text  # the errors themselves are shown
