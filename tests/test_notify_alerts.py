"""The example Prometheus alerting rules (docs/prometheus/spotopt-alerts.yml) parse as PromQL and
select only series, with only labels, that the daemon exports (as the Grafana dashboard is
checked in tests/test_metrics.py); the notification metrics among them."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import promql_parser
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from spotopt.db.engine import Database
from spotopt.db.models import DaemonTick, NotifySink
from spotopt.mover.metrics import registry
from tests.mover_rows import T0
from tests.ui_fleet import fill

RULES = Path(__file__).parents[1] / "docs" / "prometheus" / "spotopt-alerts.yml"
NOW = T0 + timedelta(days=2)


def _exported(db: Database, tmp_path: Path) -> dict[str, set[str]]:
    """Every sample name the daemon exports over a filled history with a sink, and its labels."""
    fill(db, tmp_path)
    with db.session() as session:
        session.add(DaemonTick(started_at=T0, finished_at=T0, host="h", pid=1, dry_run=False))
        session.add(NotifySink(name="webhook", since_id=1, failures_in_a_row=4, last_error="HTTP 500"))
    found, _ = registry(db, lambda: NOW)
    labels: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(found).decode()):
        for sample in family.samples:
            labels.setdefault(sample.name, set()).update(sample.labels)
    return labels


def _selectors(expr: promql_parser.Expr) -> list[promql_parser.VectorSelector]:
    found: list[promql_parser.VectorSelector] = []

    def visit(node: promql_parser.Expr) -> bool:
        if isinstance(node, promql_parser.VectorSelector):
            found.append(node)
        return True

    promql_parser.walk(expr, visit)
    return found


def test_alerting_rules_query_only_exported_metrics(sqlite_db: Database, tmp_path: Path) -> None:
    exported = _exported(sqlite_db, tmp_path)
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]
    assert len({rule["alert"] for rule in rules}) == len(rules) >= 5
    queried = set()
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        expr = promql_parser.parse(rule["expr"])  # a ValueError names what does not parse
        for selector in _selectors(expr):
            assert selector.name in exported, (rule["alert"], selector.name)
            assert {m.name for m in selector.matchers.matchers} <= exported[selector.name], rule["alert"]
            queried.add(selector.name)
    assert {"spotopt_notify_failures_in_a_row", "spotopt_notify_undelivered"} <= queried
    assert exported["spotopt_notify_failures_in_a_row"] == {"sink"}
