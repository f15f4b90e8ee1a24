"""An on-demand list price is never set aside for its age: it is in force until the cloud lists
another, and on-demand is where a deadline falls back to. A catalog's list prices are weeks old in
any replay and in any history that collects only spot prices; when the stale-price rule set them
aside, a job whose deadline only on-demand could meet was left on slow spot and missed it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from spotopt.decide.options import stale_price
from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history
from spotopt.types import InstanceTypeSpec, MarketKey, MarketKind, PriceObservation

SPOTOPT = Path(sys.executable).parent / "spotopt"
AT = datetime(2026, 1, 10, tzinfo=UTC)
JOBS = """
jobs:
  - name: tight
    throughput: {K80: 1.0, V100: 4.0}
    work: {steps: 36000}
    deadline: 12h
    allow: {instance_types: [test.k80x1, test.v100x1]}
"""
"""10 h on a K80, 2.5 h on a V100: a 12 h deadline leaves the K80 no room for a restart or the
deadline's reserve, so only the V100 (on-demand only here) makes it."""


def seed(url: str) -> None:
    """A K80 spot market priced an hour ago; a V100 on-demand list price 30 days old."""
    spot = MarketKey("aws", "us-east-1", "us-east-1a", "test.k80x1", MarketKind.SPOT)
    od = MarketKey("aws", "us-east-1", None, "test.v100x1", MarketKind.ON_DEMAND)
    db = open_history(url)
    try:
        run_ingest(
            db,
            "test",
            "seed",
            [
                InstanceTypeSpec("aws", "test.k80x1", "K80", 1),
                InstanceTypeSpec("aws", "test.v100x1", "V100-16GB", 1),
                PriceObservation(spot, AT - timedelta(hours=1), 0.2),
                PriceObservation(od, AT - timedelta(days=30), 3.0),
            ],
        )
    finally:
        db.dispose()


def test_plan_meets_the_deadline_on_a_month_old_on_demand_list_price(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    seed(url)
    (tmp_path / "jobs.yaml").write_text(JOBS)
    done = subprocess.run(
        [str(SPOTOPT), "--db", url, "plan", "jobs.yaml", "--at", AT.isoformat(), "--format", "json"],
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (job,) = report["jobs"]
    used = [item for item in job["allocation"] if item["share"] > 1e-6]
    (item,) = [item for item in used if item["market"] == "on-demand"]
    assert item["gpu"] == "V100-16GB"  # the K80 alone cannot make it: set aside, no plan met it
    assert abs(item["price_age_days"] - 30) < 1e-9 and item["stale"] is False
    assert job["stale"] is False and report["warnings"] == []


def test_the_rule_sets_aside_old_spot_prices_only() -> None:
    assert stale_price(24.0 * 30, "spot", 24.0 * 7)
    assert not stale_price(24.0 * 30, "on-demand", 24.0 * 7)
    assert not stale_price(24.0 * 6, "spot", 24.0 * 7)
