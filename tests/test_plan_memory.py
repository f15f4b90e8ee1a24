"""A job's memory needs (``memory:`` in the spec) rule out the GPUs that cannot hold it
(issue 37): ``spotopt plan`` never offers them and says why, through the console script."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotopt.errors import InputError
from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history
from spotopt.jobspec import parse_jobs
from spotopt.types import InstanceTypeSpec, MarketKey, MarketKind, PriceObservation
from tests.helpers import console

T0 = datetime(2025, 3, 1, tzinfo=UTC)


def spotopt(db_url: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return console(db_url, *args)


def seed(url: str) -> None:
    """A cheap 24 GB L4 and an 8 x 80 GB H100 server, on demand."""
    l4 = InstanceTypeSpec("aws", "test.l4x1", "L4", 1)
    h100 = InstanceTypeSpec("aws", "test.h100x8", "H100-80GB", 8)
    records: list[InstanceTypeSpec | PriceObservation] = [
        l4,
        h100,
        PriceObservation(MarketKey("aws", "us-east-1", None, "test.l4x1", MarketKind.ON_DEMAND), T0, 0.8),
        PriceObservation(MarketKey("aws", "us-east-1", None, "test.h100x8", MarketKind.ON_DEMAND), T0, 98.0),
    ]
    db = open_history(url)
    try:
        run_ingest(db, "test", "seed", records)
    finally:
        db.dispose()


def write_jobs(tmp_path: Path, memory: str) -> Path:
    """A 13B-parameter model trained with Adam in mixed precision: 16 bytes per parameter."""
    path = tmp_path / "jobs.yaml"
    path.write_text(
        f"""
jobs:
  - name: llm13b
    throughput: {{L4: 0.5, H100-80GB: 1.0}}
    work: {{steps: 3600}}
    gpus: {{min: 1, max: 8}}
    memory: {memory}
"""
    )
    return path


def plan_json(db_url: str, jobs: Path) -> dict:
    done = spotopt(
        db_url, "plan", jobs, "--policy", "min-cost", "--at", "2025-03-02T00:00Z", "--format", "json"
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_13b_adam_refused_on_one_l4_offered_on_eight_h100_with_zero3(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    doc = plan_json(db_url, write_jobs(tmp_path, "{parameters: 13B, optimizer: adam, zero_stage: 3}"))
    (job,) = doc["jobs"]
    (item,) = job["allocation"]
    # the L4 at $0.80/h would be the cheapest per step (0.5 steps/s) were memory ignored
    assert (item["gpu"], item["gpus"]) == ("H100-80GB", 8)
    excluded = {(x["gpu_model"], x["gpu_count"]): x["reason"] for x in job["excluded"]}
    assert excluded[("L4", 1)] == "needs 208 GB per GPU, has 24"
    # ZeRO-3 over 8 GPUs: 26 GB each; over 2: 104 GB, more than an H100 holds
    assert ("H100-80GB", 8) not in excluded
    assert excluded[("H100-80GB", 2)] == "needs 104 GB per GPU, has 80"
    assert ("H100-80GB", 4) not in excluded


def test_without_zero_no_gpu_holds_it_and_plan_says_why(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    done = spotopt(db_url, "plan", write_jobs(tmp_path, "{parameters: 13B}"), "--at", "2025-03-02T00:00Z")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "job 'llm13b' has no usable option: memory" in done.stderr
    assert "needs 208 GB per GPU, has 80" in done.stderr


def test_table_names_what_memory_rules_out(db_url: str, tmp_path: Path) -> None:
    seed(db_url)
    jobs = write_jobs(tmp_path, "{peak_gb: 30}")
    done = spotopt(db_url, "plan", jobs, "--policy", "min-cost", "--at", "2025-03-02T00:00Z")
    assert done.returncode == 0, done.stderr
    assert "test.h100x8" in done.stdout and "test.l4x1" not in done.stdout
    assert "llm13b: not offered L4 x1: needs 30 GB per GPU, has 24" in " ".join(done.stderr.split())


@pytest.mark.parametrize(
    ("memory", "per_gpu"),
    [
        ({"parameters": "1B"}, {1: 16.0, 8: 16.0}),
        ({"parameters": 1e9, "zero_stage": 1}, {1: 16.0, 4: 4 + 12 / 4}),
        ({"parameters": "1b", "zero_stage": 2, "activations_gb": 2}, {4: 2 + 14 / 4 + 2}),
        ({"parameters": "1000M", "precision": "fp32", "optimizer": "sgd"}, {1: 12.0}),
        ({"parameters": "1B", "optimizer": "none"}, {1: 4.0}),
        ({"peak_gb": 70}, {1: 70.0, 8: 70.0}),
    ],
)
def test_memory_counts_as_zero_paper(memory: dict, per_gpu: dict[int, float]) -> None:
    spec = parse_jobs({"jobs": [{"name": "j", "work": {"steps": 1}, "memory": memory}]})
    need = spec.jobs[0].memory
    assert need is not None
    for gpus, gb in per_gpu.items():
        assert need.per_gpu_gb(gpus) == pytest.approx(gb)


@pytest.mark.parametrize(
    ("memory", "message"),
    [
        ({}, "give exactly one of parameters"),
        ({"parameters": "13B", "peak_gb": 40}, "give exactly one of parameters"),
        ({"parameters": "13 bytes"}, "not a parameter count"),
        ({"parameters": "13B", "zero_stage": 4}, "memory.zero_stage"),
    ],
)
def test_memory_errors_name_the_field(memory: dict, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_jobs({"jobs": [{"name": "j", "work": {"steps": 1}, "memory": memory}]})


def test_throughput_estimate_marks_rows_that_do_not_fit(db_url: str, tmp_path: Path) -> None:
    jobs = write_jobs(tmp_path, "{parameters: 13B, zero_stage: 3}")
    done = spotopt(
        db_url,
        "throughput",
        "estimate",
        jobs,
        "--gpus",
        "L4,H100-80GB",
        "--counts",
        "1,8",
        "--format",
        "json",
    )
    assert done.returncode == 0, done.stderr
    rows = {(r["gpu_model"], r["gpu_count"]): r["memory"] for r in json.loads(done.stdout)}
    assert rows[("L4", 1)] == "needs 208 GB per GPU, has 24"
    assert rows[("H100-80GB", 1)] == "needs 208 GB per GPU, has 80"
    assert rows[("H100-80GB", 8)] is None
