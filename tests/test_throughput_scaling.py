"""Issue 37, counts and nodes: the iteration-time model carries a node's host contention beside
the all-reduce, so one node's losses extrapolate to more GPUs on it and do not count against
the network across nodes (Sia's and Pollux's measured traces show both)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotopt.throughput.scaling import Point, Topology, fit
from tests.helpers import strict_json

SPOTOPT = Path(sys.executable).parent / "spotopt"
NVSWITCH = Topology(8, 600.0, 400.0)  # a p4d.24xlarge: NVSwitch inside, 400 Gbit/s across


def test_losses_on_a_fast_node_grow_with_the_gpus_on_it() -> None:
    """1.8 steps/s on 2 GPUs, 1.0 on one, over NVSwitch: the all-reduce of any plausible gradient
    volume takes milliseconds there, so the 10 % loss is mostly the node's (a share of a step per
    extra GPU): 4 GPUs lose about three such shares (3.0 steps/s if all of it), 8 about seven
    (4.5). The ring all-reduce alone, volume 2(d-1)/d, saturates: 3.4 and 7.0 at most, and
    pulled towards its hardware default it did not even reproduce the 2-GPU point (2.0)."""
    model = fit([Point("A100-40GB", 1, 1, 1.0, NVSWITCH), Point("A100-40GB", 2, 1, 1.8, NVSWITCH)])
    assert model.steps_per_s(1 / model.step_s["A100-40GB"], "A100-40GB", 2, 1, NVSWITCH) == pytest.approx(
        1.8, rel=0.03
    )
    assert 2.9 < model.steps_per_s(1.0, "A100-40GB", 4, 1, NVSWITCH) < 3.3
    assert 4.4 < model.steps_per_s(1.0, "A100-40GB", 8, 1, NVSWITCH) < 5.5


def test_one_gpu_per_node_escapes_the_hosts_contention() -> None:
    """The same job on 8 GPUs spread one per node over a 400 Gbit/s network shares no host, so it
    beats 8 GPUs on one host (as Sia's V100 traces show for yolov3 and imagenet); a model with the
    all-reduce as the only loss has it the other way round."""
    model = fit([Point("A100-40GB", 1, 1, 1.0, NVSWITCH), Point("A100-40GB", 2, 1, 1.8, NVSWITCH)])
    inside = model.steps_per_s(1.0, "A100-40GB", 8, 1, NVSWITCH)
    spread = model.steps_per_s(1.0, "A100-40GB", 8, 8, NVSWITCH)
    assert inside * 1.2 < spread < 8.0


def test_estimate_command_extrapolates_a_one_node_loss(tmp_path: Path) -> None:
    """Through the installed console script: a job measured at 1 and 2 GPUs of an A100-40GB gets
    4- and 8-GPU figures on one node that keep losing the measured share per extra GPU."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    env |= {"SPOTOPT_DB_URL": f"sqlite:///{tmp_path / 'h.sqlite'}"}
    (tmp_path / "jobs.yaml").write_text(
        "jobs:\n  - name: lm\n    throughput: {A100-40GB: {1: 1.0, 2: 1.8}}\n    work: {steps: 100}\n"
    )
    done = subprocess.run(
        [str(SPOTOPT), "throughput", "estimate", "jobs.yaml", "--gpus", "A100-40GB", "--counts", "4,8",
         "--format", "json"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    by = {r["gpu_count"]: r for r in strict_json(done.stdout)}
    share = 2 / 1.8 - 1
    for count in (4, 8):
        row = by[count]
        assert row["source"] == "estimated" and row["nodes"] == 1
        # between the full measured share per extra GPU and 70 % of it (the prior pulls it down)
        assert (
            count / (1 + (count - 1) * share) < row["steps_per_s"] < count / (1 + (count - 1) * share * 0.7)
        )
        assert row["low"] < row["steps_per_s"] < row["high"]
