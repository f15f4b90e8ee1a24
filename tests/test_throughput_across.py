"""Issue 37: a job known on two GPU kinds is estimated on a third from its own slope on the GPU
speeds (how much it gains from a faster GPU), not only its level. The data are synthetic, from a
known ground truth ``ln steps/s = a[w] + s[w]·B[g]``: three references that gain from a faster GPU
and one host-bound (``s = 0``: the same speed on every GPU)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spotopt.jobspec import parse_jobs
from spotopt.throughput import JobThroughput, StoredFigure
from tests.helpers import console, strict_json

SPEED = {"T4": 0.0, "L4": 0.31, "V100-16GB": 0.6, "A100-40GB": 0.98}
"""The ground truth's log speed per GPU model (0.7 x the datasheet prior's spread from a T4)."""
REFERENCES = {"r1": (0.0, 1.0), "r2": (1.0, 1.2), "r3": (2.0, 0.8), "r4": (0.5, 0.0)}
"""workload -> (a, s): its size and how much it gains from a faster GPU."""


def truth(a: float, s: float) -> dict[str, float]:
    return {g: math.exp(a + s * b) for g, b in SPEED.items()}


def stored() -> list[StoredFigure]:
    return [
        StoredFigure(w, g, 1, v, "imported")
        for w, (a, s) in REFERENCES.items()
        for g, v in truth(a, s).items()
    ]


def book(throughput: dict[str, float]) -> JobThroughput:
    job = parse_jobs({"jobs": [{"name": "j", "work": {"steps": 10}, "throughput": throughput}]}).jobs[0]
    return JobThroughput(job, stored())


def test_a_host_bound_job_known_on_two_kinds_gains_nothing_on_a_third() -> None:
    """Before, the job's level plus each GPU's common speed-up (and a rank-one term shrunk to
    little) put it 8 % too fast on a V100 and 14 % too slow on an L4."""
    real = truth(1.5, 0.0)
    known = book({g: real[g] for g in ("T4", "A100-40GB")})
    for target in ("V100-16GB", "L4"):
        fig = known.at(target, 1)
        assert fig is not None and fig.estimated and fig.low is not None and fig.high is not None
        assert fig.steps_per_s == pytest.approx(real[target], rel=0.04)
        assert fig.low <= real[target] <= fig.high


def test_a_job_that_gains_like_the_references_keeps_their_speed_ups() -> None:
    real = truth(1.5, 1.0)
    fig = book({g: real[g] for g in ("T4", "A100-40GB")}).at("V100-16GB", 1)
    assert fig is not None and fig.steps_per_s == pytest.approx(real["V100-16GB"], rel=0.04)


def test_known_figures_that_fall_on_a_faster_gpu_give_one_level_everywhere() -> None:
    """A slope below every reference's (here negative: an odd figure on the faster GPU) is held at
    0, the lowest a job gains: the geometric mean of its figures on every other kind; before, the
    L4 came out faster than the V100 (by the job's residuals read as a rank-one term)."""
    known = book({"T4": 10.0, "A100-40GB": 5.0})
    for target in ("V100-16GB", "L4"):
        fig = known.at(target, 1)
        assert fig is not None and fig.steps_per_s == pytest.approx(math.sqrt(50.0), rel=1e-6)


def test_estimate_command_reads_the_jobs_slope(db_url: str, tmp_path: Path) -> None:
    """Through the installed console script, as a user checks it: import the references, then
    ``throughput estimate --format json`` for a host-bound job known on a T4 and an A100."""
    real = truth(1.5, 0.0)
    lines = ["workload,gpu_model,gpu_count,steps_per_s"]
    lines += [f"{f.workload},{f.gpu_model},1,{f.steps_per_s!r}" for f in stored()]
    (tmp_path / "refs.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - name: host\n    work: {steps: 100}\n"
        f"    throughput: {{T4: {real['T4']!r}, A100-40GB: {real['A100-40GB']!r}}}\n"
    )
    done = console(db_url, "throughput", "import", tmp_path / "refs.csv")
    assert done.returncode == 0, done.stderr
    done = console(
        db_url, "throughput", "estimate", tmp_path / "jobs.yaml", "--gpus", "L4,V100-16GB", "--counts", "1",
        "--format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = {r["gpu_model"]: r for r in strict_json(done.stdout) if r["gpu_count"] == 1}
    for target in ("L4", "V100-16GB"):
        row = rows[target]
        assert row["source"] == "estimated"
        assert row["steps_per_s"] == pytest.approx(real[target], rel=0.04)
        assert row["low"] <= real[target] <= row["high"]
