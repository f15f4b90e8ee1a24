"""Fidelity: the real daemon replaying a recorded market pays what the what-if engine predicted.

One small case: one job of about three simulated hours on AWS p3.2xlarge, whose cheapest zone
changes after two hours, replayed with no preemptions. The daemon runs for real (executor,
journal, lease, checkpoints, ``local`` processes running the stand-in workload) on the
simulated clock; the what-if engine replays the same history from the same start.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotopt.db.engine import Database
from spotopt.jobspec import parse_jobs
from spotopt.mover.standin import Rates, Workload
from tests.helpers import ingest
from tests.mover_world import on_demand, spot

START = datetime(2024, 3, 1, tzinfo=UTC)
JOB = {
    "name": "small",
    "throughput": {"V100": 1.0},
    "work": {"steps": 10000},
    "restart_s": 300,
    "checkpoint_s": 30,
    "allow": {"clouds": ["aws"], "markets": ["spot", "on-demand"], "instance_types": ["p3.2xlarge"]},
}


def history(db: Database) -> None:
    before = START - timedelta(days=1)
    ingest(
        db,
        [
            spot("us-east-1a", 0.90, before),
            spot("us-east-1b", 1.20, before),
            spot("us-east-1b", 0.30, START + timedelta(hours=1, minutes=30)),
            on_demand(3.06, before),
        ],
    )


def test_the_replayed_daemon_pays_what_the_whatif_predicted(db: Database, tmp_path: Path) -> None:
    from spotopt.mover.replay import FidelityRequest, fidelity

    history(db)
    out = fidelity(db, FidelityRequest(spec=parse_jobs({"jobs": [JOB]}), start=START), tmp_path / "replay")
    (row,) = out.rows
    print(row)
    assert row["realised_moves"] == row["predicted_moves"]
    assert math.isfinite(row["realised_finish_hours"])
    assert abs(row["cost_diff"]) < 0.02
    assert abs(row["finish_diff"]) < 0.02


def test_the_standin_trains_restarts_and_checkpoints_in_simulated_time() -> None:
    rates = Rates(
        work_steps=1000, restart_s=100, checkpoint_s=10, options={"m|1": {"steps_per_s": 1.0, "tau_s": 60}}
    )
    load = Workload.entering(0.0, 0.0, rates, "m|1")
    assert load.advance(100.0) == [] and load.step == 0  # the restart: no progress
    assert load.next_event() == pytest.approx(150.0)  # 50 s of training, then a 10 s periodic write
    assert load.advance(155.0) == [] and load.step == pytest.approx(50.0)  # writing: no progress
    assert load.advance(160.0) == [pytest.approx(50.0)]
    assert load.advance(170.0) == [] and load.step == pytest.approx(60.0)
    load.begin_checkpoint(170.0)  # the daemon asks: the write takes checkpoint_s from now
    assert load.next_event() == pytest.approx(180.0)
    assert load.advance(180.0) == [pytest.approx(60.0)]
    assert load.next_event() == pytest.approx(230.0)
    written = load.advance(5000.0)
    # 940 more steps at 50 per 60 s cycle: 18 periodic writes, then the work is done mid-cycle.
    assert len(written) == 18 and load.mode == "done" and load.step == 1000
    assert load.cursor == pytest.approx(180.0 + 18 * 60.0 + 40.0)
    assert load.next_event() is None
