"""A stale price never wins over a fresh one (issue 36 item 6): ``plan`` through the installed
console script, the decision core, and the what-if engine at its simulated clock. A market whose
newest price is older than the setting ``price_max_age_days`` is used only by a job with no
fresh price, and the plan says so per job and allocation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from spotopt.db.queries import Quote
from spotopt.decide.core import Memory, decide
from spotopt.decide.egress import transfer_matrix
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.options import enumerate_options, initial_state
from spotopt.history.ingest import run_ingest
from spotopt.history.market import MarketState
from spotopt.history.setup import open_history
from spotopt.jobspec import parse_jobs
from spotopt.types import InstanceTypeSpec, MarketKey, MarketKind, PriceObservation
from spotopt.whatif.engine import SimState, simulate
from spotopt.whatif.jobs import build_jobs
from spotopt.whatif.spotopt_decider import SpotoptDecider
from spotopt.whatif.timeline import build_timeline

SPOTOPT = Path(sys.executable).parent / "spotopt"
AT = datetime(2026, 1, 10, tzinfo=UTC)
OLD = AT - timedelta(days=941)
JOBS = """
jobs:
  - name: both
    throughput: {V100: 2.4}
    work: {steps: 86400}
    allow: {instance_types: [test.v100x1]}
  - name: only-stale
    throughput: {V100: 2.4}
    work: {steps: 86400}
    allow: {instance_types: [test.v100x1], markets: [spot]}
"""


def seed(url: str) -> None:
    """A spot market priced last 941 days ago at $0.30/h, an on-demand one priced yesterday at $3/h."""
    spot = MarketKey("aws", "us-east-1", "us-east-1a", "test.v100x1", MarketKind.SPOT)
    od = MarketKey("aws", "us-east-1", None, "test.v100x1", MarketKind.ON_DEMAND)
    records = [
        InstanceTypeSpec("aws", "test.v100x1", "V100-16GB", 1),
        PriceObservation(spot, OLD, 0.3),
        PriceObservation(od, AT - timedelta(days=1), 3.0),
    ]
    db = open_history(url)
    try:
        run_ingest(db, "test", "seed", records)
    finally:
        db.dispose()


def plan(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    if not (tmp_path / "h.sqlite").exists():
        seed(url)
    (tmp_path / "jobs.yaml").write_text(JOBS)
    argv = [str(SPOTOPT), "--db", url, "plan", "jobs.yaml", "--policy", "min-cost", "--at", AT.isoformat()]
    return subprocess.run(
        [*argv, *args],
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )


def test_plan_gives_a_job_its_fresh_price_and_marks_a_job_with_only_stale_ones(tmp_path: Path) -> None:
    done = plan(tmp_path, "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    jobs = {job["name"]: job for job in report["jobs"]}
    # The job with a fresh price runs on it, all of it, though the stale one is ten times cheaper.
    (fresh,) = jobs["both"]["allocation"]
    assert fresh["market"] == "on-demand" and fresh["share"] > 0.999
    assert fresh["stale"] is False and abs(fresh["price_age_days"] - 1.0) < 1e-9
    assert jobs["both"]["stale"] is False
    # The job allowed only on the stale market is still planned there, and marked.
    (old,) = jobs["only-stale"]["allocation"]
    assert old["market"] == "spot" and old["stale"] is True and abs(old["price_age_days"] - 941) < 1e-9
    assert jobs["only-stale"]["stale"] is True and report["price_max_age_days"] == 7
    (warning,) = report["warnings"]
    assert warning.startswith("1 of the 2 planned jobs ('only-stale')") and "941 days old" in warning
    assert "warning: 1 of the 2 planned jobs" in done.stderr

    table = plan(tmp_path)
    assert table.returncode == 0, table.stderr
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in table.stdout.splitlines()]
    rows = {row[0]: row for row in cells if row and row[0] in ("both", "only-stale")}
    assert rows["both"][-2:] == ["1", "False"] and rows["only-stale"][-2:] == ["941", "True"]
    assert "setting price_max_age_days" in table.stdout


def test_the_setting_sets_the_limit(tmp_path: Path) -> None:
    """At a limit of 1,000 days the 941-day-old price is fresh, and the cheaper one wins again."""
    done = plan(tmp_path, "--format", "json", env={"SPOTOPT_PRICE_MAX_AGE_DAYS": "1000"})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (item,) = report["jobs"][0]["allocation"]
    assert item["market"] == "spot" and item["stale"] is False and report["warnings"] == []


def markets(observed: list[datetime]) -> list[MarketState]:
    """Two spot zones of one V100 type at the same preemption rate: a at $0.30/h, b at $0.90/h."""
    out = []
    for i, (zone, usd) in enumerate((("us-east-1a", 0.3), ("us-east-1b", 0.9))):
        q = Quote(
            i + 1, "aws", "us-east-1", zone, "p3.2xlarge", "spot", "V100-16GB", 1, usd, observed[i], "t"
        )
        out.append(MarketState(q, 0.05, "default", None))
    return out


SPEC = {"jobs": [{"name": "j", "throughput": {"V100": 2.4}, "work": {"steps": 864000}}]}


def test_the_core_prefers_a_fresh_price_keeps_a_running_job_and_uses_stale_ones_when_alone() -> None:
    spec = parse_jobs(SPEC)
    snap = markets([AT - timedelta(days=8), AT - timedelta(hours=1)])
    zone = {m.quote.market_id: m.quote.zone for m in snap}

    def start(guard: Guardrails, snap: list[MarketState] = snap) -> str | None:
        table = enumerate_options(spec, snap, AT)
        state, opts = initial_state(spec, table, snap, AT)
        (move,) = decide(state, opts, guard, Memory())
        return zone[snap[int(table.market[np.searchsorted(table.key, move.to)])].quote.market_id]

    assert start(Guardrails(max_price_age_h=7 * 24)) == "us-east-1b"  # a: 8 days old
    assert start(Guardrails(max_price_age_h=9 * 24)) == "us-east-1a"  # within 9 days: cheaper wins
    both_old = markets([AT - timedelta(days=8), AT - timedelta(days=8)])
    assert start(Guardrails(max_price_age_h=7 * 24), both_old) == "us-east-1a"  # only stale: used

    # A job running on the stale market is not moved off it for its price's age alone.
    table = enumerate_options(spec, snap, AT)
    state, opts = initial_state(spec, table, snap, AT)
    on_a = int(table.key[np.flatnonzero(table.market == 0)[0]])
    state.option[:] = on_a
    state.dwell_h[:] = 100.0
    assert decide(state, opts, Guardrails(max_price_age_h=7 * 24), Memory()) == []


def test_the_whatif_engine_judges_age_at_its_simulated_clock() -> None:
    """Zone a's one point is at the replay's start: fresh for its first 7 days, stale after,
    while zone b is priced every day. A job starting on day 1 takes a, one starting on day 9
    takes b, the same whatever the wall clock says (these prices are from 2026). The frontier
    drops b (dominated by a: same speed, dearer), so it must hand b back where a is stale."""
    start = AT
    quotes = [
        Quote(1, "aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot", "V100-16GB", 1, 0.3, start, "t")
    ]
    quotes += [
        Quote(
            2,
            "aws",
            "us-east-1",
            "us-east-1b",
            "p3.2xlarge",
            "spot",
            "V100-16GB",
            1,
            0.9,
            start + timedelta(days=d),
            "t",
        )
        for d in range(12)
    ]
    tl = build_timeline(quotes, start, 12 * 24, 1.0)
    tl.rate[:] = 0.05
    sim = build_jobs(parse_jobs(SPEC), tl)
    transfer = transfer_matrix(tl.locations, start)
    events = np.full((tl.n_markets, tl.n_ticks), np.inf)  # no preemptions
    zone_of = [m.quote.zone for m in tl.markets]

    def first_zone(tick: int) -> str | None:
        decider = SpotoptDecider(tl, sim, transfer, Guardrails(max_price_age_h=7 * 24))
        run = simulate(tl, sim, events, transfer, decider, start_tick=tick)
        return zone_of[int(sim.market[int(run.trace[0, 0])])]

    assert first_zone(24) == "us-east-1a"
    assert first_zone(9 * 24) == "us-east-1b"
    # Without the guardrail's limit in reach (a limit of a year) a stays the cheaper choice.
    decider = SpotoptDecider(tl, sim, transfer, Guardrails(max_price_age_h=365 * 24))
    assert (
        zone_of[int(sim.market[int(decider(9 * 24, SimState.initial(1, tl.n_markets))[0])])] == "us-east-1a"
    )
