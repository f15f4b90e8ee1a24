"""The daemon's Prometheus metrics (``spotopt.mover.metrics``): scraped over HTTP and every value
checked against the history, on SQLite and PostgreSQL; a real ``daemon run --metrics-port``
process; the Grafana dashboard queries only metrics that exist."""

from __future__ import annotations

import json
import os
import re
import socket
import time
import urllib.request
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from spotopt.db.engine import Database
from spotopt.db.models import JOB_STATES, DaemonTick, ManagedJob, Placement
from spotopt.mover import ledger
from spotopt.mover import status as job_status
from spotopt.mover.eventlog import log_event
from spotopt.mover.leader import Leadership
from spotopt.mover.ledger import market_key
from spotopt.mover.metrics import registry, serve
from spotopt.mover.observed import PREEMPTION_ENDS
from spotopt.providers.base import market_label
from tests.helpers import cli
from tests.mover_rows import T0
from tests.servers import free_port, spotopt_server
from tests.ui_fleet import fill

NOW = T0 + timedelta(days=2)
GRAFANA = Path(__file__).parents[1] / "docs" / "grafana" / "spotopt.json"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(url: str) -> Samples:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return _samples(text)


def _samples(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


def _of(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {labels: value for (n, labels), value in samples.items() if n == name}


def _ticks(db: Database) -> None:
    """One finished tick (3 s), one that never finished, and the newest, still running."""
    with db.session() as session:
        for start, end in ((T0, T0 + timedelta(seconds=3)), (T0 + timedelta(hours=1), None), (NOW, None)):
            session.add(DaemonTick(started_at=start, finished_at=end, host="h", pid=1, dry_run=False))


def test_every_metric_equals_the_history(db: Database, tmp_path: Path) -> None:
    fill(db, tmp_path)
    _ticks(db)
    leadership = Leadership(db)
    assert leadership.try_acquire()
    port = free_port()
    server = serve(db, port, clock=lambda: NOW)
    try:
        samples = _scrape(f"http://127.0.0.1:{port}/metrics")
    finally:
        server.shutdown()
        server.server_close()
        leadership.release()

    with db.session() as session:
        jobs = session.execute(select(ManagedJob.name, ManagedJob.state, ManagedJob.budget_usd)).all()
        states = Counter(state for _, state, _ in jobs)
        preempted = session.execute(
            select(Placement.end_reason, Placement.market_id, func.count())
            .where(Placement.end_reason.in_(PREEMPTION_ENDS))
            .group_by(Placement.end_reason, Placement.market_id)
        ).all()
        preemptions = {
            (("kind", reason), ("market", market_label(market_key(session, m)))): float(n)
            for reason, m, n in preempted
        }
    assert _of(samples, "spotopt_jobs") == {(("state", s),): float(states[s]) for s in JOB_STATES}
    spent, rates, moves = {}, {}, Counter[tuple[tuple[str, str], ...]]()
    for name, _, _ in jobs:
        _, intervals = job_status.ledger(db, name, NOW)
        spent[(("job", name),)] = ledger.total_usd(intervals)  # `jobs cost`'s total
        _, status, _ = job_status.show(db, name, NOW)
        if status["placement"] is not None:
            key = (("job", name), ("market", status["placement"]["market"]))
            rates[key] = status["placement"]["usd_per_hour"]
        for m in status["moves"]:
            moves[
                (("kind", m["kind"]), ("market", m["to_market"] or ""), ("outcome", m["outcome"] or "open"))
            ] += 1
    assert _of(samples, "spotopt_job_spent_usd") == pytest.approx(spent)
    assert _of(samples, "spotopt_job_budget_usd") == {(("job", n),): b for n, _, b in jobs}
    assert _of(samples, "spotopt_job_spend_usd_per_hour") == pytest.approx(rates)
    assert len(rates) == 2
    assert samples[("spotopt_spend_usd_per_hour", ())] == pytest.approx(sum(rates.values()))
    assert _of(samples, "spotopt_moves_total") == {k: float(n) for k, n in moves.items()}
    assert _of(samples, "spotopt_preemptions_total") == preemptions and len(preemptions) == 2
    assert samples[("spotopt_ticks_total", ())] == 1
    assert samples[("spotopt_ticks_unfinished_total", ())] == 1
    assert samples[("spotopt_last_tick_duration_seconds", ())] == 3
    assert samples[("spotopt_last_tick_timestamp_seconds", ())] == (T0 + timedelta(seconds=3)).timestamp()
    assert samples[("spotopt_leader", ())] == 1

    assert _of(samples, "spotopt_leader_info") == {
        (("host", socket.gethostname()), ("pid", str(os.getpid()))): 1
    }
    assert _of(samples, "spotopt_round_errors_total") == {(("round", "poll"),): 0, (("round", "tick"),): 0}
    checked = {
        "spotopt_jobs",
        "spotopt_job_spent_usd",
        "spotopt_job_budget_usd",
        "spotopt_job_spend_usd_per_hour",
        "spotopt_spend_usd_per_hour",
        "spotopt_moves_total",
        "spotopt_preemptions_total",
        "spotopt_ticks_total",
        "spotopt_ticks_unfinished_total",
        "spotopt_last_tick_duration_seconds",
        "spotopt_last_tick_timestamp_seconds",
        "spotopt_leader",
        "spotopt_leader_info",
        "spotopt_round_errors_total",
    }
    assert {name for name, _ in samples} == checked  # no metric left unchecked


def test_failed_rounds_are_counted_from_the_scheduler_log(sqlite_db: Database) -> None:
    import logging

    found, failures = registry(sqlite_db)
    mover = logging.getLogger("spotopt.mover")
    mover.addHandler(failures)
    level = mover.level
    mover.setLevel(logging.INFO)
    try:
        log_event("poll-failed", error="OperationalError: database is locked")
        log_event("tick-failed", error="ProviderError: boom")
        log_event("poll-failed", error="again")
        log_event("tick", decisions=0)
    finally:
        mover.removeHandler(failures)
        mover.setLevel(level)
    errors = _of(_samples(generate_latest(found).decode()), "spotopt_round_errors_total")
    assert errors == {(("round", "poll"),): 2, (("round", "tick"),): 1}


def test_daemon_run_serves_metrics(sqlite_db: Database, tmp_path: Path) -> None:
    """A real daemon process: leads, ticks once at start, and its endpoint says so."""
    url = str(sqlite_db.engine.url)
    port = free_port()
    metrics = f"http://127.0.0.1:{port}/metrics"
    args = ["--db", url, "daemon", "run", "--metrics-port", str(port), "--period", "1h", "--poll", "1h"]
    with spotopt_server(
        [*args, "--state-dir", str(tmp_path / "state")], metrics, tmp_path / "daemon.log"
    ) as proc:
        deadline = time.monotonic() + 60
        samples = _scrape(metrics)
        while samples[("spotopt_ticks_total", ())] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
            samples = _scrape(metrics)
        assert samples[("spotopt_ticks_total", ())] == 1
        assert samples[("spotopt_leader", ())] == 1
        assert [dict(k)["pid"] for k in _of(samples, "spotopt_leader_info")] == [str(proc.pid)]
        assert sum(_of(samples, "spotopt_jobs").values()) == 0


def test_metrics_port_needs_a_running_daemon(sqlite_db: Database) -> None:
    code, _, err = cli("--db", str(sqlite_db.engine.url), "daemon", "run", "--once", "--metrics-port", "9100")
    assert code == 2
    assert "--metrics-port" in err


def test_grafana_dashboard_queries_only_exported_metrics(sqlite_db: Database, tmp_path: Path) -> None:
    fill(sqlite_db, tmp_path)
    _ticks(sqlite_db)
    found, _ = registry(sqlite_db, lambda: NOW)
    exported = {name for name, _ in _samples(generate_latest(found).decode())}
    dashboard = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    queried = {name for expr in exprs for name in re.findall(r"\bspotopt_[a-z_]+", expr)}
    assert queried <= exported, queried - exported
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {"${datasource}"}
    # Every family is graphed somewhere (leader_info is for a table a user adds, not needed).
    assert exported - queried <= {"spotopt_leader_info"}
