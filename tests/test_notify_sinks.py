"""The other ways an event leaves: a local command, ``spotopt notify test`` through the installed
console script, and the sweep's finding (an instance billing with no placement) told to the
webhook by a real ``daemon run --once`` on the local provider (issue 40)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from spotopt.clouds.common.base import DATABASE_TAG, LaunchSpec
from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.identity import database_id_of
from spotopt.db.models import NotifyDelivery
from spotopt.history.ingest import run_ingest
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.notify.sinks import Command
from tests.helpers import cli, console
from tests.mover_rows import T0, seed_markets
from tests.mover_world import a_day_ago, now, on_demand, spot
from tests.notify_receiver import Receiver, serve
from tests.test_notify import _kinds, _submit, _walk

APPEND = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read() + '\\n')"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found, server = serve()
    yield found
    server.shutdown()


def test_a_local_command_gets_each_event_on_stdin_and_a_failing_one_is_tried_again(
    db: Database, tmp_path: Path
) -> None:
    seed_markets(db)
    _submit(db, tmp_path, "cmd")
    _walk(db, "cmd", ("launching", "start"), ("running", "start: up"), ("done", "finished"))
    clock = [T0 + timedelta(days=1)]
    failing = Command((sys.executable, "-c", "raise SystemExit(3)"))
    Daemon(db, None, DaemonSettings(sinks=(failing,)), clock=lambda: clock[0]).notify()
    with db.session() as session:
        [tried] = session.scalars(select(NotifyDelivery).where(NotifyDelivery.attempts > 0))
        assert tried.last_error == "the command exited with status 3" and tried.delivered_at is None

    out = tmp_path / "events.jsonl"
    fixed = Command((sys.executable, "-c", APPEND, str(out)))
    clock[0] += timedelta(hours=1)
    Daemon(db, None, DaemonSettings(sinks=(fixed,)), clock=lambda: clock[0]).notify()
    events = [json.loads(line) for line in out.read_text().splitlines()]
    assert (
        [(e["job"], e["event"]) for e in events]
        == _kinds(db)
        == [("cmd", "job.started"), ("cmd", "job.done")]
    )


def test_notify_test_sends_a_signed_event_and_names_a_missing_sink(
    db_url: str, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOTOPT_NOTIFY_WEBHOOK_URL", receiver.url)
    monkeypatch.setenv("SPOTOPT_NOTIFY_WEBHOOK_SECRET", "shared")
    done = console(db_url, "notify", "test", "webhook")
    assert done.returncode == 0, done.stderr
    [request] = receiver.requests
    assert request.body["event"] == "notify.test" and request.headers["X-Spotopt-Signature"].startswith(
        "sha256="
    )
    assert request.body["id"] in done.stdout
    code, _out, err = cli("--db", db_url, "notify", "test", "slack")
    assert code != 0 and "SPOTOPT_NOTIFY_" in err and "slack" in err
    code, _out, err = cli("--db", db_url, "notify", "test", "pager")
    assert code != 0 and "SINK: 'pager' is not a sink" in err
    receiver.status = 500
    code, _out, err = cli("--db", db_url, "notify", "test", "webhook")
    assert code != 0 and "the webhook answered HTTP 500" in err and receiver.url not in err


def test_an_instance_billing_with_no_placement_is_told_once(
    db_url: str, db: Database, tmp_path: Path, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_ingest(db, "test", "test", [spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago())])
    state_dir = tmp_path / "local"
    provider = LocalProvider(state_dir)
    spec = LaunchSpec(
        "ghost", 1, ("sleep", "600"), f"file://{tmp_path}/s", tags={DATABASE_TAG: database_id_of(db)}
    )
    leaked = provider.launch(spec, spot("us-east-1a", 0.9, now()).market, "ghost-m1").instance_id
    monkeypatch.setenv("SPOTOPT_NOTIFY_WEBHOOK_URL", receiver.url)
    try:
        for _ in range(2):
            code, _out, err = cli("--db", db_url, "daemon", "run", "--once", "--state-dir", state_dir)
            assert code == 0, err
    finally:
        for instance in provider.list_instances():
            provider.terminate(instance.instance_id)
    [body] = receiver.bodies()
    assert body["event"] == "daemon.leaked_instance" and body["job"] is None
    assert body["instance"] == leaked and body["why"] == "no placement has its key"
