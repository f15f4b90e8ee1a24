"""``spotopt daemon run`` and ``spotopt daemon status`` as a user runs them: a dry run changes
nothing, ``--once`` starts a job on the local provider, the long-running daemon ticks on its
period and stops cleanly on SIGTERM, and bad options are one-line errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import func, select

from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import DaemonTick, JournalEntry, Meta, Placement
from spotopt.history.ingest import run_ingest
from spotopt.mover import jobs as jobstore
from spotopt.mover.leader import LEADER_KEY, LeaderRecord, Leadership
from tests.helpers import cli, strict_json
from tests.mover_world import a_day_ago, job_yaml, make_world, now, on_demand, spot


@pytest.fixture
def submitted(db: Database, tmp_path: Path) -> Iterator[Path]:
    run_ingest(db, "test", "test", [spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago())])
    jobstore.submit(db, job_yaml(tmp_path))
    (tmp_path / "mlp.until").write_text("5", encoding="utf-8")
    state_dir = tmp_path / "local"
    yield state_dir
    if state_dir.exists():
        provider = LocalProvider(state_dir)
        for instance in provider.list_instances():
            provider.terminate(instance.instance_id)


def rows(db: Database, model: type) -> int:
    with db.session() as session:
        return int(session.scalar(select(func.count()).select_from(model)) or 0)


def test_a_dry_run_shows_the_moves_and_changes_nothing(db_url: str, db: Database, submitted: Path) -> None:
    code, out, err = cli("--db", db_url, "daemon", "run", "--dry-run", "--format", "json")
    assert code == 0, err
    doc = strict_json(out)
    assert [(d["job"], d["kind"]) for d in doc["decisions"]] == [("mlp", "start")]
    assert doc["decisions"][0]["to"] == "aws/us-east-1a/p3.2xlarge/spot"
    assert "event=decide dry_run=True job=mlp kind=start" in err
    assert (rows(db, Placement), rows(db, JournalEntry)) == (0, 0)
    assert jobstore.get_job(db, "mlp").state == "pending"
    code, out, _ = cli("--db", db_url, "daemon", "status", "--format", "json")
    status = strict_json(out)
    assert code == 0 and status["jobs"] == {"pending": 1}
    assert status["last_tick"] is None and rows(db, DaemonTick) == 0  # a dry run writes nothing
    assert status["open_moves"] == []
    code, out, _ = cli("--db", db_url, "daemon", "run", "--dry-run")
    assert code == 0 and "Moves the daemon would make" in out and "start" in out


def test_once_starts_the_job_on_the_local_provider(db_url: str, db: Database, submitted: Path) -> None:
    code, out, err = cli(
        "--db",
        db_url,
        "daemon",
        "run",
        "--once",
        "--provider",
        "local",
        "--state-dir",
        submitted,
        "--format",
        "json",
    )
    assert code == 0, err
    assert len(strict_json(out)["opened_moves"]) == 1
    (placement,) = _placements(db)
    assert placement.state == "running" and placement.instance_id is not None
    assert LocalProvider(submitted).status(placement.instance_id).state.is_live
    code, out, _ = cli("--db", db_url, "daemon", "status")
    assert code == 0 and "launching 1" in out and "confirm" in out


def test_once_does_nothing_while_another_daemon_leads(db_url: str, db: Database, submitted: Path) -> None:
    other = Leadership(db)
    assert other.try_acquire()
    try:
        code, _out, err = cli("--db", db_url, "daemon", "run", "--once", "--state-dir", submitted)
    finally:
        other.release()
    assert code == 0 and "another daemon leads" in err
    assert rows(db, Placement) == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--period", "0s"], "--period/--poll: give a duration above zero"),
        (["--period", "often"], "--period: 'often' is not a duration"),
        (["--collect-cron", "every hour"], "--collect-cron: 'every hour' is not a crontab schedule"),
        (["--provider", "locl", "--once"], "provider 'locl' is unknown; did you mean local?"),
    ],
)
def test_bad_options_are_one_line_errors(
    db_url: str, db: Database, submitted: Path, args: list[str], message: str
) -> None:
    code, _out, err = cli("--db", db_url, "daemon", "run", *args)
    assert code == 2 or (code != 0 and "provider" in message)
    assert message in err and "Traceback" not in err
    assert rows(db, DaemonTick) == 0


def _placements(db: Database) -> list[Placement]:
    with db.session() as session:
        return list(session.scalars(select(Placement).order_by(Placement.id)))


def test_the_daemon_ticks_on_its_period_and_stops_cleanly_on_sigterm(
    db_url: str, db: Database, submitted: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "SPOTOPT_DB_URL": db_url}
    daemon = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "spotopt",
            "daemon",
            "run",
            "--period",
            "5s",
            "--poll",
            "0.2s",
            "--state-dir",
            str(submitted),
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        limit = time.monotonic() + 120
        while rows(db, DaemonTick) < 2 and time.monotonic() < limit and daemon.poll() is None:
            time.sleep(0.1)
        assert rows(db, DaemonTick) >= 2
        daemon.send_signal(signal.SIGTERM)
        _out, err = daemon.communicate(timeout=120)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    assert daemon.returncode == 0, err
    assert "event=shutdown signal=SIGTERM" in err
    assert "another daemon leads" not in err and "waiting to lead" not in err  # it was alone
    assert "event=launch" in err and jobstore.get_job(db, "mlp").state in ("launching", "running")
    with db.session() as session:
        assert all(t.finished_at is not None for t in session.scalars(select(DaemonTick)))


def test_status_says_whether_the_leader_lives_and_how_the_last_round_went(
    db_url: str, db: Database, submitted: Path
) -> None:
    code, out, _ = cli("--db", db_url, "daemon", "run", "--once", "--state-dir", submitted)
    assert code == 0
    code, out, _ = cli("--db", db_url, "daemon", "status")
    assert "no daemon runs now" in out and "finished" in out and " ago)" in out
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    record = LeaderRecord(socket.gethostname(), int(gone.stdout), datetime.now(UTC))
    with db.session() as session:
        session.merge(Meta(key=LEADER_KEY, value=record.to_json()))
    code, out, _ = cli("--db", db_url, "daemon", "status", "--format", "json")
    assert code == 0 and strict_json(out)["leader"]["alive"] is False
    code, out, _ = cli("--db", db_url, "daemon", "status")
    assert "that process is gone" in out


def test_guardrails_reach_the_daemon_from_its_options_and_the_jobs_spec(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    """A voluntary move can be tried at once: the job's own ``guardrails: {min_dwell_s: 0}``
    lets the dry run move a job that just started, which the daemon's default two hours of
    dwell would keep where it is; the daemon's options still apply (``--max-usd-per-hour`` below
    the new market's price keeps it where it is)."""
    world = make_world(db, tmp_path)
    try:
        world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
        spec = job_yaml(tmp_path)
        text = spec.read_text()
        assert "    restart_s: 10\n" in text
        own = "    restart_s: 10\n    guardrails: {min_dwell_s: 0}\n"
        spec.write_text(text.replace("    restart_s: 10\n", own))
        jobstore.submit(db, spec)
        world.hold("mlp", 20)
        world.daemon.tick()
        world.until("the job to run", lambda: world.job().state == "running" and world.job().steps >= 20)
        world.prices(spot("us-east-1b", 0.3, now()))
        dry = ["--db", db_url, "daemon", "run", "--dry-run", "--period", "5s", "--format", "json"]
        code, out, err = cli(*dry, "--max-usd-per-hour", "0.25")
        assert code == 0 and strict_json(out)["decisions"] == [], err
        code, out, err = cli(*dry)
        assert code == 0, err
        assert [d["kind"] for d in strict_json(out)["decisions"]] == ["move"]
        code, _, err = cli(*dry, "--launch-timeout", "0s")
        assert code == 2 and "--launch-timeout: '0s' must be longer than 0s" in err
        code, _, err = cli(*dry, "--store-outage", "soon")
        assert code == 2 and "--store-outage" in err and "\n" not in err.strip()
    finally:
        world.stop_all()


def test_status_lists_the_jobs_waiting_and_why(db_url: str, db: Database, tmp_path: Path) -> None:
    run_ingest(db, "test", "test", [spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago())])
    jobstore.submit(db, job_yaml(tmp_path, name="poor", budget=0.01))
    code, out, _ = cli("--db", db_url, "daemon", "status", "--format", "json")
    (waiting,) = strict_json(out)["waiting"]
    assert (waiting["job"], waiting["state"]) == ("poor", "pending")
    assert "no round has placed it" in waiting["why"]
    code, _, err = cli("--db", db_url, "daemon", "run", "--once", "--state-dir", tmp_path / "local")
    assert code == 0, err
    code, out, _ = cli("--db", db_url, "daemon", "status", "--format", "json")
    (waiting,) = strict_json(out)["waiting"]
    assert waiting["state"] == "over-budget" and "would exceed budget_usd $0.01" in waiting["why"]
    code, out, _ = cli("--db", db_url, "daemon", "status")
    assert code == 0 and "Jobs waiting, and why" in out and "poor" in out
