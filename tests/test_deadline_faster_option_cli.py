"""Through the console script, on SQLite and PostgreSQL: a job on a slow on-demand GPU that
cannot make its deadline there moves to a faster one in time (``spotopt whatif``, which decides
through the one decision core, as ``plan`` and the daemon do).

The world of the report: an L4 and an H100, on demand only ($0.8/h, $12/h); references that
estimate the job's H100 speed (8.6 steps/s, 5 at the low end) from its L4 figure (1.5 steps/s);
100k steps due in 8 h. The L4 alone needs 18.5 h: the job used to stay on it for 19 h.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history
from spotopt.types import InstanceTypeSpec, MarketKey, MarketKind, PriceObservation
from tests.helpers import console

T0 = datetime(2025, 3, 1, tzinfo=UTC)
REFERENCES = """workload,gpu_model,gpu_count,steps_per_s
ref-a,L4,1,1.0
ref-a,H100-80GB,1,6.0
ref-b,L4,1,2.0
ref-b,H100-80GB,1,8.0
ref-c,L4,1,1.5
ref-c,H100-80GB,1,10.5
"""


def test_the_whatif_moves_the_job_off_the_slow_on_demand_gpu_and_meets_the_deadline(
    db_url: str, tmp_path: Path
) -> None:
    def on_demand(instance_type: str) -> MarketKey:
        return MarketKey("aws", "us-east-1", None, instance_type, MarketKind.ON_DEMAND)

    db = open_history(db_url)
    try:
        run_ingest(
            db,
            "test",
            "seed",
            [
                InstanceTypeSpec("aws", "test.l4x1", "L4", 1),
                InstanceTypeSpec("aws", "test.h100x1", "H100-80GB", 1),
                PriceObservation(on_demand("test.l4x1"), T0, 0.8),
                PriceObservation(on_demand("test.h100x1"), T0, 12.0),
            ],
        )
    finally:
        db.dispose()
    (tmp_path / "refs.csv").write_text(REFERENCES)
    assert console(db_url, "throughput", "import", tmp_path / "refs.csv").returncode == 0
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n  - name: train\n    throughput: {L4: 1.5}\n    work: {steps: 100000}\n    deadline: 8h\n"
    )
    args = (
        "whatif",
        jobs,
        "--start",
        "2025-03-01T00:00Z",
        "--strategies",
        "spotopt",
        "--preemptions",
        "none",
    )
    done = console(db_url, *args, "--format", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    (result,) = [r for r in doc["results"] if r["strategy"] == "spotopt"]
    assert result["deadline_met"] is True
    ran = [(p["instance_type"], p["market"]) for p in doc["placements"]]
    assert ran == [("test.l4x1", "on-demand"), ("test.h100x1", "on-demand")]
    # the cheap L4 runs while the H100, counted at its low end, still makes the deadline after it
    first = doc["placements"][0]
    l4_h = (datetime.fromisoformat(first["to"]) - datetime.fromisoformat(first["from"])) / timedelta(hours=1)
    assert 0 < l4_h <= 2
