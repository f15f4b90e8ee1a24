"""Through the console script, on SQLite and PostgreSQL: a job on a slow on-demand GPU that
cannot make its deadline there moves to a faster one in time (``spotopt whatif``, which decides
through the one decision core, as ``plan`` and the daemon do).

The world of the report: an L4 and an H100, on demand only ($0.8/h, $12/h); references that
estimate the job's H100 speed (8.6 steps/s, 5 at the low end) from its L4 figure (1.5 steps/s);
100k steps due in 8 h. The L4 alone needs 18.5 h: the job used to stay on it for 19 h.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

from tests.helpers import console
from tests.l4_h100 import seed


def test_the_whatif_moves_the_job_off_the_slow_on_demand_gpu_and_meets_the_deadline(
    db_url: str, tmp_path: Path
) -> None:
    seed(db_url, tmp_path)
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
