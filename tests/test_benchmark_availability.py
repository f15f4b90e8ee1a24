"""``benchmarks/availability.py`` as a user runs it, on small traces generated here (the real
ones have no license and are never copied): every strategy on each zone and on the pair, the
oracle a floor under every strategy that met its deadlines, and the setting's options."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.traces import spot_trace

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = ("on-demand", "spot", "greedy", "uniform-progress", "up-failover", "spotopt", "oracle")


def _traces(root: Path) -> Path:
    """Two V100 zones probed every 10 minutes for 30 hours: one up 2 h then out 1 h, the other
    out 40 minutes every 100 minutes, so each outage of one zone overlaps the other's capacity
    only in part."""
    folder = root / "availability" / "1-node" / "us-west-2-probes"
    folder.mkdir(parents=True)
    spot_trace(folder / "us-west-2a_v100_1.json", 600, [int(k % 18 < 12) for k in range(180)])
    spot_trace(folder / "us-west-2b_v100_1.json", 600, [int(k % 10 >= 4) for k in range(180)])
    return root


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    script = str(ROOT / "benchmarks" / "availability.py")
    return subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=600)


def test_every_strategy_runs_on_each_zone_and_the_pair_and_the_oracle_is_a_floor(tmp_path: Path) -> None:
    starts = ("--starts", "2", "--every", "7", "--offset", "1")
    setting = ("--work", "6", "--deadline", "9", "--restart", "0.2", "--spot-price", "0.9")
    done = _run("--traces", str(_traces(tmp_path)), *starts, *setting, "--format", "json")
    assert done.returncode == 0, done.stderr
    cases = {case["trace"]: case for case in json.loads(done.stdout)}
    pair = "us-west-2a V100×1 + us-west-2b V100×1"
    assert sorted(cases) == ["us-west-2a V100×1", pair, "us-west-2b V100×1"]
    for name, case in cases.items():
        rows = case["strategies"]
        assert set(rows) == set(STRATEGIES), name
        assert all(row["starts"] == 2 for row in rows.values()), name
        # On-demand pays the work and one start (its changeover): 6.2 h, and a second's checkpoint.
        assert rows["on-demand"]["ratio"] == 1.0 and abs(rows["on-demand"]["od_h"] - 6.2) < 0.02, name
        for strategy in ("on-demand", "uniform-progress", "up-failover", "spotopt", "oracle"):
            assert rows[strategy]["met"] == 1.0, (name, strategy)
        for strategy, row in rows.items():
            if row["met"] == 1.0:
                assert rows["oracle"]["ratio"] <= row["ratio"] + 1e-9, (name, strategy)
        # Spot is there most of the time: the rules that use it pay less than on-demand.
        assert rows["spotopt"]["ratio"] < 1.0 and rows["spotopt"]["spot_h"] > 0, name
    # Both zones at once: never out together for long, so failing over beats waiting in one.
    both, one = cases[pair]["strategies"], cases["us-west-2a V100×1"]["strategies"]
    assert both["oracle"]["ratio"] <= one["oracle"]["ratio"] + 1e-9


def test_a_setting_that_cannot_be_met_is_named_with_its_fix(tmp_path: Path) -> None:
    done = _run("--traces", str(_traces(tmp_path)), "--work", "10", "--deadline", "9")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "error: --work 10 must be in (0, --deadline 9]"
