"""``spotopt plan`` and ``spotopt throughput`` end to end, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotopt.cli.app import app
from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history
from spotopt.types import InstanceTypeSpec, InterruptionObservation, MarketKey, MarketKind, PriceObservation

T0 = datetime(2025, 3, 1, tzinfo=UTC)
EXAMPLES = Path(__file__).parents[1] / "data" / "examples"
runner = CliRunner()


def seed(url: str) -> None:
    """Two test instance types (1x and 8x V100) with spot and on-demand prices and an advisor bucket."""
    one = InstanceTypeSpec("aws", "test.v100x1", "V100-16GB", 1)
    eight = InstanceTypeSpec("aws", "test.v100x8", "V100-16GB", 8)
    spot = MarketKey("aws", "us-east-1", "us-east-1a", "test.v100x1", MarketKind.SPOT)
    od = MarketKey("aws", "us-east-1", None, "test.v100x1", MarketKind.ON_DEMAND)
    big = MarketKey("aws", "us-east-1", None, "test.v100x8", MarketKind.ON_DEMAND)
    records = [
        one,
        eight,
        PriceObservation(spot, T0, 0.9),
        PriceObservation(od, T0, 3.0),
        PriceObservation(big, T0, 16.0),
        InterruptionObservation("aws", "us-east-1", None, "test.v100x1", T0, "advisor-bucket", 10, "5-10%"),
    ]
    db = open_history(url)
    try:
        run_ingest(db, "test", "seed", records)
    finally:
        db.dispose()


def write_jobs(tmp_path: Path, deadline: str) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        f"""
jobs:
  - name: resnet50
    throughput: {{V100: 2.4}}
    work: {{steps: 864000}}          # 100 h on one V100
    deadline: {deadline}
    checkpoint_gb: 0.1
    allow: {{instance_types: [test.v100x1, test.v100x8]}}
"""
    )
    return path


def plan_json(db_url: str, *args: str) -> dict:  # type: ignore[type-arg]
    result = runner.invoke(
        app, ["--db", db_url, "plan", *args, "--at", "2025-03-02T00:00Z", "--format", "json"]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_plan_json_schema_and_choice(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    doc = plan_json(db_url, str(write_jobs(tmp_path, "200h")), "--policy", "min-cost-slo")
    assert doc["status"] == "optimal"
    assert isinstance(doc["total_cost_usd"], float)
    (job,) = doc["jobs"]
    assert {"name", "cost_usd", "finish_hours", "allocation"} <= set(job)
    (item,) = job["allocation"]
    assert {"cloud", "region", "zone", "instance_type", "market", "share"} <= set(item)
    # spot at 0.9/h loses a little to preemptions; 8x V100 packed costs 2/h per job: spot wins
    assert (item["instance_type"], item["market"], item["zone"]) == ("test.v100x1", "spot", "us-east-1a")
    assert item["share"] == pytest.approx(1.0)
    assert item["rate_source"] == "advisor-bucket" and item["checkpoint_interval_s"] > 0
    # the run plus the start-up (restart_s defaults to 300 s), both at the spot price
    assert job["cost_usd"] == pytest.approx(0.9 * (job["finish_hours"] + 300 / 3600))
    assert job["runner_up"]["usd_per_step"] > item["usd_per_step"]
    assert doc["total_cost_usd"] == pytest.approx(job["cost_usd"])


def test_tight_deadline_mixes_markets_or_fails_clearly(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    result = runner.invoke(
        app,
        [
            "--db",
            db_url,
            "plan",
            str(write_jobs(tmp_path, "50h")),
            "--policy",
            "min-cost-slo",
            "--at",
            "2025-03-02",
        ],
    )
    assert result.exit_code == 4
    # the plan keeps a reserve before the deadline (a period, a restart, preemption spread)
    assert "resnet50: needs 100.0 h" in result.output and "misses by 5" in result.output
    assert "reserve" in result.output


def test_table_output_and_unknown_policy(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    jobs = str(write_jobs(tmp_path, "200h"))
    ok = runner.invoke(app, ["--db", db_url, "plan", jobs, "--policy", "min-cost", "--at", "2025-03-02"])
    assert ok.exit_code == 0, ok.output
    assert "min-cost: optimal" in ok.output
    csv = runner.invoke(
        app, ["--db", db_url, "plan", jobs, "--policy", "min-cost", "--at", "2025-03-02", "-f", "csv"]
    )
    assert csv.output.splitlines()[1].startswith("resnet50,aws/us-east-1a,test.v100x1,spot,1,1.0,")
    bad = runner.invoke(app, ["--db", db_url, "plan", jobs, "--policy", "min-cots"])
    assert bad.exit_code == 2 and "did you mean 'min-cost'" in bad.output


def test_budget_policy_and_bad_spec(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    doc = plan_json(
        db_url, str(write_jobs(tmp_path, "200h")), "--policy", "min-makespan-budget", "--budget", "500"
    )
    assert doc["total_cost_usd"] <= 500 + 1e-6
    assert doc["makespan_hours"] < 110
    bad = tmp_path / "bad.yaml"
    bad.write_text("jobs:\n  - name: x\n    work: {gpu_days: -1, gpu: V100}\n")
    result = runner.invoke(app, ["--db", db_url, "plan", str(bad)])
    assert result.exit_code == 2 and "jobs[0] (x).work.gpu_days: must be > 0" in result.output


def test_throughput_import_and_list(db_url: str) -> None:
    path = str(EXAMPLES / "throughputs.csv")
    first = runner.invoke(app, ["--db", db_url, "throughput", "import", path])
    assert first.exit_code == 0 and "15 new" in first.output
    again = runner.invoke(app, ["--db", db_url, "throughput", "import", path])
    assert "0 new, 0 updated" in again.output
    listed = runner.invoke(
        app, ["--db", db_url, "throughput", "list", "--workload", "cyclegan", "-f", "json"]
    )
    assert [r["gpu_model"] for r in json.loads(listed.output)] == ["K80", "P100", "V100"]


def test_plan_on_old_prices_warns_and_shows_when_each_price_was_seen(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    jobs = write_jobs(tmp_path, "300h")
    fresh = runner.invoke(
        app, ["--db", db_url, "plan", str(jobs), "--policy", "min-cost", "--at", "2025-03-02T00:00Z"]
    )
    assert fresh.exit_code == 0 and "warning" not in fresh.stderr
    old = runner.invoke(
        app,
        [
            "--db",
            db_url,
            "plan",
            str(jobs),
            "--policy",
            "min-cost",
            "--at",
            "2025-06-01T00:00Z",
            "-f",
            "json",
        ],
    )
    assert old.exit_code == 0, old.output
    report = json.loads(old.stdout)
    assert len(report["warnings"]) == 1 and "2025-03-01" in report["warnings"][0]
    assert "warning:" in old.stderr
    item = report["jobs"][0]["allocation"][0]
    assert item["price_observed_at"] == "2025-03-01T00:00:00Z" and item["price_source"] == "test"


def test_budget_with_a_policy_that_ignores_it_is_refused(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    jobs = str(write_jobs(tmp_path, "200h"))
    result = CliRunner().invoke(app, ["--db", db_url, "plan", jobs, "--policy", "min-cost", "--budget", "5"])
    assert result.exit_code == 2 and "--budget" in result.output and "min-makespan-budget" in result.output


def test_stale_price_warning_counts_jobs_on_stale_prices_and_names_aws_only_for_aws_spot() -> None:
    from datetime import UTC, datetime

    from spotopt.plan import stale_price_warnings

    at = datetime(2025, 3, 1, tzinfo=UTC)
    old = datetime(2025, 1, 1, tzinfo=UTC)
    gcp = {"cloud": "gcp", "region": "us-central1", "zone": None, "instance_type": "a2-highgpu-1g"}
    item = {**gcp, "market": "spot", "price_observed_at": old, "price_age_days": 59.0, "stale": True}
    fresh = {"name": "fresh", "stale": False, "allocation": [{**item, "stale": False}]}
    jobs = [{"name": f"j{i}", "stale": True, "allocation": [item]} for i in range(5)]
    (warning,) = stale_price_warnings(at, [*jobs, fresh], 7.0)
    assert warning.startswith("5 of the 6 planned jobs ('j0', 'j1', 'j2', ...)") and "AWS" not in warning
    assert "within 7 days" in warning and "2025-01-01, 59 days old" in warning
    aws = {**item, "cloud": "aws", "region": "us-east-1", "zone": "us-east-1a", "instance_type": "p3.2xlarge"}
    (both,) = stale_price_warnings(at, [*jobs, {"name": "a", "stale": True, "allocation": [aws]}], 7.0)
    assert (
        both.startswith("6 of the 6 planned jobs") and "AWS records a spot price only when it changes" in both
    )
    assert stale_price_warnings(at, [fresh], 7.0) == []


def test_plan_table_keeps_secondary_columns_for_wide(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    jobs = str(write_jobs(tmp_path, "200h"))
    args = ["--db", db_url, "plan", jobs, "--policy", "min-cost", "--at", "2025-03-02"]
    narrow = CliRunner().invoke(app, args)
    wide = CliRunner().invoke(app, [*args, "--wide"])
    assert narrow.exit_code == wide.exit_code == 0, narrow.output
    assert "--wide adds" in narrow.output and "--wide adds" not in wide.output
    # The secondary columns' headers (a single row too wide for the screen shows its fields
    # down the screen, each with its value: spotopt.render).
    for header in ("gpus", "share", "usd per step", "runner up", "throughput"):
        assert header in wide.output, header
    assert "usd per step" not in narrow.output and "runner up" not in narrow.output
