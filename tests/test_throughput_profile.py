"""``spotopt throughput profile`` (issue 37 item 2): a job run briefly under its agent becomes a
measured figure, warm-up left out, every instance ended, the budget respected; and the agent's
heartbeat rate (what the daemon records) leaves the warm-up out the same way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from spotopt.agent import Agent, AgentConfig
from spotopt.agent.steady import WARMUP_STEPS, steady_rate
from spotopt.checkpoints import Location, grant_lease, read_heartbeat
from spotopt.clouds.common.base import InstanceState
from spotopt.clouds.local.provider import LocalProvider, group_members
from spotopt.db.engine import Database
from spotopt.errors import InputError
from spotopt.jobspec import parse_jobs
from spotopt.mover import profile as profiling
from tests.helpers import ingest, price, strict_json

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"
SPOTOPT = Path(sys.executable).with_name("spotopt")
STEP_DELAY_S = 0.005
"""The example trainer sleeps this long per step here, so it can never exceed 1/STEP_DELAY_S."""


def test_steady_rate_starts_past_the_warm_up() -> None:
    # 10 slow warm-up steps in the first 5 s, then 100 steps/s
    reports = [(0.0, 0), (5.0, 10), (6.0, 110), (7.0, 210)]
    rate = steady_rate(reports, 0, 10)
    assert rate is not None and (rate.steps_per_s, rate.steps, rate.seconds) == (100.0, 200, 2.0)
    assert steady_rate(reports, 0, 0).steps_per_s == pytest.approx(30.0)  # type: ignore[union-attr]
    assert steady_rate(reports, 150, 10) is None  # one report past a restart at 150: no rate yet
    assert steady_rate([(1.0, 50), (1.0, 60)], 0, 10) is None  # no time between them


def test_an_agents_heartbeat_rate_never_spans_its_warm_up(tmp_path: Path) -> None:
    """The daemon records each heartbeat's rate as the measured figure: a first interval holding
    compilation (here 10 s for the first 20 steps) must not count. Old code: 2.0 steps/s."""
    now = [datetime(2026, 11, 1, tzinfo=UTC).timestamp()]
    url = f"file://{tmp_path / 'store'}"
    grant_lease(Location(url), "job", datetime.fromtimestamp(now[0], UTC))
    env = {"SPOTOPT_JOB": "job", "SPOTOPT_EPOCH": "1", "SPOTOPT_CHECKPOINT_URI": url, "SPOTOPT_CLOUD": "none"}
    env |= {"SPOTOPT_HEARTBEAT_EVERY": "10s", "SPOTOPT_SCRATCH_DIR": str(tmp_path / "scratch")}
    agent = Agent(AgentConfig.from_environ(env), clock=lambda: now[0], warn=lambda _m: None, background=False)
    agent.resume()
    rates = []
    for step in (0, 2 * WARMUP_STEPS, 2 * WARMUP_STEPS + 500):
        agent.progress(step)
        agent.poll_once()
        beat = read_heartbeat(Location(url), "job", 1)
        assert beat is not None and beat.step == step
        rates.append(beat.steps_per_s)
        now[0] += 10
    assert rates == [None, None, 50.0]


def _job_file(tmp_path: Path) -> Path:
    """data/examples/job.yaml, its trainer beside it, running long and at most 1/STEP_DELAY_S
    steps/s, without its spec figure for L4 (which would win over any measurement)."""
    (tmp_path / "train_numpy.py").write_text((EXAMPLES / "train_numpy.py").read_text())
    spec = yaml.safe_load((EXAMPLES / "job.yaml").read_text())
    job = spec["jobs"][0]
    job["run"] = f"{sys.executable} train_numpy.py --steps 1000000 --step-delay {STEP_DELAY_S}"
    del job["throughput"]["L4"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _instances(state: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in sorted(state.glob("instances/*/record.json"))]


def test_profile_through_the_console_script_stores_a_measured_figure(tmp_path: Path) -> None:
    _job_file(tmp_path)
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    env["SPOTOPT_DB_URL"] = f"sqlite:///{tmp_path / 'h.sqlite'}"
    (tmp_path / "refs.csv").write_text(
        "workload,gpu_model,gpu_count,steps_per_s\nref,L4,1,10\nref,A10G,1,12\n"
    )

    def spotopt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SPOTOPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )

    def l4_estimate() -> dict[str, object]:
        out = spotopt("throughput", "estimate", "job.yaml", "--gpus", "L4", "--format", "json")
        assert out.returncode == 0, out.stderr
        (row,) = strict_json(out.stdout)
        return dict(row)

    def stored() -> list[dict[str, object]]:
        out = spotopt("throughput", "list", "--workload", "example", "--format", "json")
        assert out.returncode == 0, out.stderr
        return list(strict_json(out.stdout))

    assert spotopt("import", "csv", str(EXAMPLES / "prices.csv")).returncode == 0
    assert spotopt("throughput", "import", "refs.csv").returncode == 0
    before = l4_estimate()
    assert before["source"] == "estimated"

    # the budget: a run bills at least the cloud's minute at the cheapest L4 market's price
    refused = spotopt("throughput", "profile", "job.yaml", "--gpu", "L4", "--budget-usd", "0.0001",
                      "--state-dir", str(state))  # fmt: skip
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("error: --budget-usd:") and refused.stderr.count("\n") == 1
    assert _instances(state) == [] and stored() == []

    rows = []
    for _ in range(2):  # a second profile replaces the figure: still one measured row
        out = spotopt("throughput", "profile", "job.yaml", "--gpu", "L4", "--steps", "20",
                      "--budget-usd", "1", "--state-dir", str(state), "--format", "json")  # fmt: skip
        assert out.returncode == 0, out.stderr
        (row,) = strict_json(out.stdout)
        rows.append(row)
        measured = row["steps_per_s"]
        assert 0 < measured <= 1 / STEP_DELAY_S and row["steps"] >= 20 and row["ended"] == "measured"
        assert (row["job"], row["gpu_model"], row["gpu_count"], row["warmup_steps"]) == (
            "example",
            "L4",
            1,
            10,
        )
        assert row["error"] == pytest.approx(row["estimated"] / measured - 1)
        assert 0 < row["cost_usd"] <= 1
        (figure,) = stored()
        assert (figure["source"], figure["steps_per_s"]) == ("measured", measured)
        assert "after 10 warm-up steps" in str(figure["note"])
    assert rows[0]["estimated"] == pytest.approx(before["steps_per_s"])  # the estimate's error, shown
    assert rows[1]["estimate_source"] == "measured"  # the second run compares with the first

    after = l4_estimate()
    assert (after["source"], after["steps_per_s"]) == ("measured", measured)
    records = _instances(state)
    assert len(records) == 2 and all(
        r["tags"]["spotopt:profile"] == "example" and r["tags"]["spotopt:db"] for r in records
    )
    for record in records:  # every process the provider started is gone, its children too
        assert group_members(int(str(record["pid"]))) == []
        assert (state / "instances" / str(record["instance_id"]) / "exit_code").exists()
    assert not (tmp_path / "example-checkpoints").exists()  # the job's real store was not touched


def test_ctrl_c_during_a_profile_ends_the_instance(db: Database, tmp_path: Path) -> None:
    ingest(db, [price("g5.xlarge", (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M"), 1.0)])
    spec = parse_jobs(yaml.safe_load(_job_file(tmp_path).read_text()), "job.yaml")
    with db.session() as session:
        (run,) = profiling.plan_runs(
            session, spec.jobs, tmp_path, "A10G", [1], steps=5, seconds=None, warmup_steps=2,
            budget_usd=None, now=datetime.now(UTC),
        )  # fmt: skip
        with pytest.raises(InputError, match="--budget-usd"):
            profiling.plan_runs(
                session, spec.jobs, tmp_path, "A10G", [1], steps=5, seconds=None, warmup_steps=2,
                budget_usd=0.001, now=datetime.now(UTC),
            )  # fmt: skip
    provider = LocalProvider(tmp_path / "state", grace_s=10.0)
    launched: list[str] = []

    def interrupt(_s: float) -> None:
        launched.extend(i.instance_id for i in provider.list_instances())
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        profiling.profile(provider, run, steps=5, seconds=None, warmup_steps=2, limit_s=60.0, wait=interrupt)
    (instance_id,) = launched
    assert provider.status(instance_id).state is InstanceState.TERMINATED
    record = _instances(tmp_path / "state")[0]
    assert group_members(int(str(record["pid"]))) == []


def test_a_job_that_fails_at_once_measures_nothing_and_stores_nothing(db: Database, tmp_path: Path) -> None:
    ingest(db, [price("g5.xlarge", (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M"), 1.0)])
    spec = yaml.safe_load(_job_file(tmp_path).read_text())
    spec["jobs"][0]["run"] = f"{sys.executable} -c 'raise SystemExit(3)'"
    jobs = parse_jobs(spec, "job.yaml").jobs
    with db.session() as session:
        (run,) = profiling.plan_runs(
            session, jobs, tmp_path, "A10G", [1], steps=5, seconds=None, warmup_steps=2,
            budget_usd=None, now=datetime.now(UTC),
        )  # fmt: skip
    result = profiling.profile(LocalProvider(tmp_path / "state"), run, steps=5, seconds=None, warmup_steps=2,
                               limit_s=60.0)  # fmt: skip
    assert (result.rate, result.ended) == (None, "job exited (exited, status 3)")
    with db.session() as session:
        profiling.store_result(session, result, 2, datetime.now(UTC))
        assert profiling.stored_figures(session) == []


def test_a_spot_instance_the_market_takes_back_in_its_first_hour_costs_the_profile_nothing(
    db: Database, tmp_path: Path
) -> None:
    """AWS charges nothing for a spot instance it interrupts in its first hour
    (``spotopt.clouds.aws.billing``): a profile whose instance is reclaimed reports $0, not the
    60 s minimum (old code), so the runs after it keep that budget."""
    ingest(db, [price("g5.xlarge", (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M"), 1.0)])
    jobs = parse_jobs(yaml.safe_load(_job_file(tmp_path).read_text()), "job.yaml").jobs
    with db.session() as session:
        (run,) = profiling.plan_runs(
            session, jobs, tmp_path, "A10G", [1], steps=5, seconds=None, warmup_steps=2,
            budget_usd=None, now=datetime.now(UTC),
        )  # fmt: skip
    assert str(run.market.kind) == "spot"
    provider = LocalProvider(tmp_path / "state", grace_s=10.0)

    def reclaim(_s: float) -> None:  # the market takes it back at the loop's first pause
        for instance in provider.list_instances():
            provider.reclaim(instance.instance_id)

    result = profiling.profile(provider, run, steps=10**9, seconds=None, warmup_steps=2, limit_s=60.0,
                               wait=reclaim)  # fmt: skip
    assert (result.ended, result.cost_usd) == ("job exited (preempted)", 0.0)
