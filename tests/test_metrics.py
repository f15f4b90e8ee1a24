"""The daemon's Prometheus metrics (``spotopt.mover.metrics``): scraped over HTTP and every value
checked against the history, on SQLite and PostgreSQL; a real ``daemon run --metrics-port``
process; the Grafana dashboard queries only metrics that exist."""

from __future__ import annotations

import json
import os
import socket
import time
import urllib.request
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from spotopt.clouds.common.base import market_label
from spotopt.db.engine import Database
from spotopt.db.models import JOB_STATES, DaemonTick, ManagedJob, Placement
from spotopt.mover import ledger
from spotopt.mover import status as job_status
from spotopt.mover.eventlog import log_event
from spotopt.mover.leader import Leadership
from spotopt.mover.ledger import market_key
from spotopt.mover.metrics import registry, serve
from spotopt.mover.observed import PREEMPTION_ENDS
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
    spent, rates = {}, {}
    moves, open_moves = Counter[tuple[tuple[str, str], ...]](), Counter[tuple[tuple[str, str], ...]]()
    for name, _, _ in jobs:
        _, intervals = job_status.ledger(db, name, NOW)
        spent[(("job", name),)] = ledger.total_usd(intervals)  # `jobs cost`'s total
        _, status, _ = job_status.show(db, name, NOW)
        if status["placement"] is not None:
            key = (("job", name), ("market", status["placement"]["market"]))
            rates[key] = status["placement"]["usd_per_hour"]
        for m in status["moves"]:
            where = (("kind", m["kind"]), ("market", m["to_market"] or ""))
            if m["outcome"] is None:
                open_moves[where] += 1
            else:
                moves[(*where, ("outcome", m["outcome"]))] += 1
    assert _of(samples, "spotopt_job_spent_usd") == pytest.approx(spent)
    assert _of(samples, "spotopt_job_budget_usd") == {(("job", n),): b for n, _, b in jobs}
    assert _of(samples, "spotopt_job_spend_usd_per_hour") == pytest.approx(rates)
    assert len(rates) == 2
    assert samples[("spotopt_spend_usd_per_hour", ())] == pytest.approx(sum(rates.values()))
    assert _of(samples, "spotopt_moves_total") == {k: float(n) for k, n in moves.items()}
    assert _of(samples, "spotopt_moves_open") == {k: float(n) for k, n in open_moves.items()}
    assert moves and open_moves
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
        "spotopt_moves_open",
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


def _exported(db: Database, tmp_path: Path) -> dict[str, set[str]]:
    """Every sample name the daemon exports over the filled history, with its label names."""
    fill(db, tmp_path)
    _ticks(db)
    found, _ = registry(db, lambda: NOW)
    labels: dict[str, set[str]] = {}
    for name, sample_labels in _samples(generate_latest(found).decode()):
        labels.setdefault(name, set()).update(label for label, _ in sample_labels)
    return labels


def _selected(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    """The series selectors of a parsed query, wherever they sit (in calls, ranges, operands)."""
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(expr, visit)
    return found


def test_grafana_dashboard_queries_only_exported_metrics(sqlite_db: Database, tmp_path: Path) -> None:
    """Every panel's PromQL parses, selects only series the daemon exports, filters and groups
    only by labels those series carry; every exported family is graphed somewhere."""
    exported = _exported(sqlite_db, tmp_path)
    dashboard = json.loads(GRAFANA.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    queried = set()
    for text in exprs:
        expr = promql_parser.parse(text)  # a ValueError names what does not parse
        selectors = _selected(expr)
        assert selectors, text
        for selector in selectors:
            assert selector.name in exported, (text, selector.name)
            assert {m.name for m in selector.matchers.matchers} <= exported[selector.name], text
            queried.add(selector.name)
        grouped: set[str] = set()

        def visit(node: promql_parser.Expr, grouped: set[str] = grouped) -> bool:
            if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
                grouped.update(node.modifier.labels)
            return True

        promql_parser.walk(expr, visit)
        carried = set().union(*(exported[s.name] for s in selectors))
        assert grouped <= carried, (text, grouped - carried)
    # Every family is graphed somewhere (leader_info is for a table a user adds, not needed).
    assert set(exported) - queried <= {"spotopt_leader_info"}


def test_grafana_dashboard_loads_as_grafana_s_own_schema() -> None:
    """Decoded by Grafana's generated models (grafana-foundation-sdk, Grafana 11.6's schema, its
    panel plugins' options registered) and encoded again, the dashboard loses and changes
    nothing: every key is one Grafana knows, every value of the type it expects. Every panel is
    a known panel plugin, and every query a Prometheus query on the dashboard's data source
    variable. ``__inputs`` is Grafana's import wrapper, outside the dashboard model."""
    from grafana_foundation_sdk.cog import runtime
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.cog.plugins import register_default_plugins
    from grafana_foundation_sdk.models import prometheus
    from grafana_foundation_sdk.models.dashboard import Dashboard

    register_default_plugins()
    written = json.loads(GRAFANA.read_text())
    decoded = Dashboard.from_json(written)
    again = json.loads(json.dumps(decoded, cls=JSONEncoder))
    assert _lost(written, again) == ["/__inputs"]
    assert decoded.panels and len(decoded.panels) == len(written["panels"])
    for panel in decoded.panels:
        assert runtime.panelcfg_config(panel.type_val) is not None, panel.type_val
        assert panel.datasource is not None and panel.datasource.uid == "${datasource}"
        assert panel.targets and all(isinstance(t, prometheus.Dataquery) for t in panel.targets)
    assert [v["name"] for v in written["templating"]["list"]] == ["datasource"]


def _lost(written: Any, again: Any, path: str = "") -> list[str]:
    """Where ``again`` lacks or changed what ``written`` holds (it may add defaults)."""
    if isinstance(written, dict) and isinstance(again, dict):
        return [
            lost
            for key, value in written.items()
            for lost in ([f"{path}/{key}"] if key not in again else _lost(value, again[key], f"{path}/{key}"))
        ]
    if isinstance(written, list) and isinstance(again, list) and len(written) == len(again):
        return [
            lost
            for i, (w, a) in enumerate(zip(written, again, strict=True))
            for lost in _lost(w, a, f"{path}[{i}]")
        ]
    return [] if written == again else [path]


def test_moves_total_only_grows_as_a_move_finishes(sqlite_db: Database, tmp_path: Path) -> None:
    """A counter only grows: while a move is under way it is a gauge (``spotopt_moves_open``);
    once it finishes, the counter of its outcome takes it, and no series of the counter drops
    back or disappears (``outcome="open"`` did both)."""
    from spotopt.db.models import JobMove

    fill(sqlite_db, tmp_path)
    found, _ = registry(sqlite_db, lambda: NOW)
    before = _samples(generate_latest(found).decode())
    assert sum(_of(before, "spotopt_moves_open").values()) > 0
    with sqlite_db.session() as session:
        for row in session.scalars(select(JobMove).where(JobMove.outcome.is_(None))):
            row.outcome, row.step, row.finished_at = "done", "finished", NOW
    after = _samples(generate_latest(found).decode())
    total_before, total_after = _of(before, "spotopt_moves_total"), _of(after, "spotopt_moves_total")
    assert all(total_after.get(labels, 0.0) >= n for labels, n in total_before.items())
    assert sum(total_after.values()) == sum(total_before.values()) + sum(
        _of(before, "spotopt_moves_open").values()
    )
    assert sum(_of(after, "spotopt_moves_open").values()) == 0
