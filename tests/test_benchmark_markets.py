"""``benchmarks/availability.py --markets`` (issue 38, regime 1) as a user runs it, on traces
generated here: all zones of a kind at once, each with its own spot price, and those prices are
what the strategies pay and weigh."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.traces import spot_trace

ROOT = Path(__file__).resolve().parent.parent
ON_DEMAND_USD = 3.06


def _traces(root: Path) -> Path:
    """Two V100×8 zones probed every 10 minutes for 60 hours: us-west-2a always available,
    us-west-2b only from hour 10 on."""
    folder = root / "availability" / "1-node" / "us-west-2-probes"
    folder.mkdir(parents=True)
    spot_trace(folder / "us-west-2a_v100_8.json", 600, [1] * 360)
    spot_trace(folder / "us-west-2b_v100_8.json", 600, [int(k >= 60) for k in range(360)])
    return root


def _run(root: Path, *args: str) -> dict[str, dict]:
    script = str(ROOT / "benchmarks" / "availability.py")
    argv = [
        sys.executable,
        script,
        "--traces",
        str(root),
        "--markets",
        "--starts",
        "1",
        "--offset",
        "0",
        *args,
    ]
    done = subprocess.run([*argv, "--format", "json"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return {case["prices"]: case for case in json.loads(done.stdout)}


def test_the_oracle_waits_for_the_cheap_zone_where_the_slack_allows(tmp_path: Path) -> None:
    cases = _run(_traces(tmp_path), "--prices", "4x,step")
    assert sorted(cases) == ["spot 1x/4x", "spot 4x/1x", "spot step 1x-4x"]
    for name, case in cases.items():
        assert case["trace"] == "us-west-2a V100×8 + us-west-2b V100×8", name
        assert case["set"] == "report", name  # V100: judged on, not tuned on
        rows = case["strategies"]
        assert set(rows) == {"on-demand", "uniform-progress", "up-failover", "spotopt", "oracle"}, name
        # Regime 1's terms by default: 35 h of work, one changeover (0.2 h) and checkpoints.
        assert 35.2 <= rows["on-demand"]["od_h"] < 35.3, name
        for strategy, row in rows.items():
            assert row["met"] == 1.0, (name, strategy)
            assert rows["oracle"]["ratio"] <= row["ratio"] + 1e-9, (name, strategy)
    # Base spot is 0.2x on-demand: the whole job on spot at 1x costs about 0.2 of on-demand's.
    cheap = cases["spot 1x/4x"]["strategies"]
    assert abs(cheap["oracle"]["ratio"] - 0.2) < 0.01 and cheap["oracle"]["od_h"] == 0
    # us-west-2a at 4x (0.8x on-demand), us-west-2b at 1x from hour 10: with 17 h of slack the
    # oracle waits for the cheap zone, where failing over to the one zone up pays 4x.
    dear = cases["spot 4x/1x"]["strategies"]
    assert abs(dear["oracle"]["ratio"] - 0.2) < 0.01 and dear["oracle"]["od_h"] == 0
    assert dear["up-failover"]["ratio"] > 0.7
    # Moving prices reach them too: the zones swap 1x and 4x daily, and the oracle follows the
    # cheap one where it is up, where staying in the zone it started in pays 4x on day two.
    step = cases["spot step 1x-4x"]["strategies"]
    assert step["oracle"]["ratio"] < 0.21 and step["up-failover"]["ratio"] > 0.3


def test_an_unknown_price_path_is_named(tmp_path: Path) -> None:
    script = str(ROOT / "benchmarks" / "availability.py")
    argv = [sys.executable, script, "--traces", str(_traces(tmp_path)), "--markets", "--prices", "4x,cosine"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "error: --prices cosine: not one of 1.5x,2.5x,4x,sine,step"
