"""Issue 37: throughput estimates across exact GPU models, counts and nodes, with intervals, and
``spotopt throughput estimate`` as the installed console script prints it."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotopt.catalog import gpu_models, interconnects
from spotopt.jobspec import parse_jobs
from spotopt.throughput import JobThroughput, StoredFigure
from spotopt.throughput.scaling import Point, Topology, default_topology, fit, iteration_ratio
from tests.helpers import strict_json

SPOTOPT = Path(sys.executable).parent / "spotopt"


def one_job(**fields: object):  # type: ignore[no-untyped-def]
    return parse_jobs({"jobs": [{"name": "j", "work": {"steps": 10}, **fields}]}).jobs[0]


def refs(table: dict[str, dict[str, float]]) -> list[StoredFigure]:
    return [StoredFigure(w, g, 1, v, "imported") for w, figs in table.items() for g, v in figs.items()]


def test_catalog_has_datasheet_peaks_and_links() -> None:
    a40, a80 = gpu_models()["A100-40GB"], gpu_models()["A100-80GB"]
    assert (a40.fp16_tflops, a40.fp32_tflops, a40.memory_bandwidth_gbs) == (312, 19.5, 1555)
    assert a80.memory_bandwidth_gbs == 2039 and a80.source_url.startswith("https://")
    assert all(
        m.fp16_tflops > 0 and m.fp32_tflops > 0 and m.memory_bandwidth_gbs > 0 for m in gpu_models().values()
    )
    p4d, g4dn = interconnects()[("aws", "p4d.24xlarge")], interconnects()[("aws", "g4dn.12xlarge")]
    assert (p4d.gpu_link, p4d.gpu_link_gbs, p4d.network_gbps) == ("nvswitch", 600, 400)
    assert (g4dn.gpu_link, g4dn.gpu_link_gbs, g4dn.network_gbps) == ("pcie", 32, 50)
    assert default_topology("A100-40GB").gpus_per_node in (8, 16)


def test_references_are_kept_per_exact_gpu_model() -> None:
    """A100-40GB and A100-80GB were one family "A100" (the later row overwrote the other)."""
    stored = refs(
        {
            "r1": {"V100-16GB": 1.0, "A100-40GB": 2.0, "A100-80GB": 3.0},
            "r2": {"V100-16GB": 2.0, "A100-40GB": 4.0, "A100-80GB": 6.0},
        }
    )
    book = JobThroughput(one_job(throughput={"V100-16GB": 1.5}), stored)
    on40, on80 = book.at("A100-40GB", 1), book.at("A100-80GB", 1)
    assert on40 is not None and on80 is not None and on40.estimated and on80.estimated
    assert on40.steps_per_s == pytest.approx(3.0, rel=0.05)
    assert on80.steps_per_s == pytest.approx(4.5, rel=0.05)
    assert set(on80.references) == {"r1", "r2"}


def test_one_kind_known_and_no_reference_on_the_target_uses_the_datasheet_prior() -> None:
    stored = refs({"r1": {"V100-16GB": 1.0, "T4": 0.4}, "r2": {"V100-16GB": 3.0, "T4": 1.1}})
    book = JobThroughput(one_job(throughput={"V100-16GB": 2.0}), stored)
    fig = book.at("H100-80GB", 1)
    assert fig is not None and fig.estimated and "datasheet" in fig.note
    assert fig.low is not None and fig.high is not None and fig.low < fig.steps_per_s < fig.high
    assert fig.steps_per_s > 2.0  # an H100 is faster than a V100 by its datasheet
    slower = book.at("T4", 1)
    assert slower is not None and slower.steps_per_s < 2.0


def test_measured_figures_win_and_are_exact() -> None:
    stored = [*refs({"r1": {"V100-16GB": 1.0, "T4": 0.4}}), StoredFigure("j", "T4", 1, 0.7, "measured")]
    book = JobThroughput(one_job(throughput={"V100-16GB": 2.0}), stored)
    fig = book.at("T4", 1)
    assert fig is not None and (fig.steps_per_s, fig.source, fig.interval) == (0.7, "measured", (0.7, 0.7))


def test_a_job_measured_only_at_eight_gpus_has_a_figure_at_four() -> None:
    book = JobThroughput(one_job(throughput={"A100-40GB": {8: 10.0}}))
    four, one = book.at("A100-40GB", 4), book.at("A100-40GB", 1)
    assert four is not None and four.estimated and 4.5 <= four.steps_per_s <= 5.5
    assert one is not None and one.estimated and 1.2 <= one.steps_per_s <= 1.4
    assert book.at("A100-40GB", 8).steps_per_s == 10.0  # type: ignore[union-attr]


def test_several_nodes_are_slower_than_one_over_a_slower_network() -> None:
    book = JobThroughput(one_job(throughput={"T4": 1.0}))
    topo = Topology(4, 32.0, 10.0)
    inside = book.at("T4", 4, nodes=1, topology=topo)
    across = book.at("T4", 4, nodes=4, topology=topo)
    assert inside is not None and across is not None and across.steps_per_s < inside.steps_per_s < 4.0


def test_iteration_model_fit_follows_the_points_from_its_hardware_default() -> None:
    """Points made by the model itself (G = 4 GB, no overlap, 2 % of a step per extra GPU on a
    node) on one node and across two: the fit moves the gradient volume from the hardware default
    (50 MB for this step time on an A10) to near the truth, and the 8-GPU figures follow."""
    topo = Topology(8, 64.0, 100.0)
    grad, t1, contention = 4e9, 0.2, 0.02

    def truth(gpus: int, nodes: int, step: float) -> float:
        comm = grad / topo.bandwidth_bytes_s(nodes) / step
        return gpus / (step * iteration_ratio(gpus, nodes, comm, 1.0, contention))

    layout = [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2)]
    points = [Point("A10", n, m, truth(n, m, t1), topo) for n, m in layout]
    assert fit(points[:1]).grad_bytes is None  # one GPU only: the default, per GPU model
    model = fit(points)
    assert model.grad_bytes is not None and grad / 1.5 < model.grad_bytes < grad * 1.5
    for nodes in (1, 2):
        assert model.steps_per_s(1 / t1, "A10", 8, nodes, topo) == pytest.approx(
            truth(8, nodes, t1), rel=0.05
        )
    assert model.steps_per_s(1 / t1, "A10", 8, 2, topo) < model.steps_per_s(1 / t1, "A10", 8, 1, topo)


def test_estimate_command_prints_json_per_job_gpu_count_and_nodes(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    env |= {"SPOTOPT_DB_URL": f"sqlite:///{tmp_path / 'h.sqlite'}"}
    (tmp_path / "refs.csv").write_text(
        "workload,gpu_model,gpu_count,steps_per_s\n"
        "r1,V100-16GB,1,1.0\nr1,A100-40GB,1,2.0\nr1,A100-80GB,1,3.0\n"
        "r2,V100-16GB,1,2.0\nr2,A100-40GB,1,4.0\nr2,A100-80GB,1,6.0\n"
    )
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - name: lm\n    throughput: {V100-16GB: 1.5}\n    work: {steps: 100}\n"
    )

    def spotopt(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(SPOTOPT), *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
        )

    assert spotopt("throughput", "import", "refs.csv").returncode == 0
    done = spotopt(
        "throughput", "estimate", "jobs.yaml", "--gpus", "A100,V100-16GB,RTX-PRO-6000",
        "--counts", "1,4", "--nodes", "1,2", "--format", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = strict_json(done.stdout)
    by = {(r["gpu_model"], r["gpu_count"], r["nodes"]): r for r in rows}
    for row in rows:
        assert {"job", "gpu_model", "gpu_count", "nodes", "steps_per_s", "low", "high", "source"} <= set(row)
        assert row["job"] == "lm" and row["low"] <= row["steps_per_s"] <= row["high"]
    assert by[("V100-16GB", 1, 1)]["source"] == "spec" and by[("V100-16GB", 1, 1)]["steps_per_s"] == 1.5
    assert by[("A100-40GB", 1, 1)]["steps_per_s"] == pytest.approx(3.0, rel=0.05)
    assert by[("A100-80GB", 1, 1)]["steps_per_s"] == pytest.approx(4.5, rel=0.05)
    assert by[("RTX-PRO-6000", 1, 1)]["source"] == "estimated"  # no reference there: its datasheet
    assert by[("A100-80GB", 4, 2)]["steps_per_s"] < by[("A100-80GB", 4, 1)]["steps_per_s"]
    assert ("A100-80GB", 1, 2) not in by  # fewer GPUs than nodes
    assert math.isclose(by[("V100-16GB", 4, 1)]["gpu_count"], 4)

    bad = spotopt("throughput", "estimate", "jobs.yaml", "--counts", "0")
    assert bad.returncode != 0 and "--counts" in bad.stderr and "whole number" in bad.stderr
