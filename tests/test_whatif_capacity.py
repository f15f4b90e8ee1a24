"""The what-if with capacity replayed: imported availability through ``spotopt whatif --preemptions
replay``, the engine's refusals and reclaims, and Can't Be Late's rules as written."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from spotopt.cli.app import app
from spotopt.decide.egress import transfer_matrix
from spotopt.decide.guardrails import Guardrails
from spotopt.history.capacity import Capacity
from spotopt.jobspec import parse_jobs
from spotopt.whatif.engine import LAUNCH_ATTEMPT_H, SimState, simulate
from spotopt.whatif.jobs import build_jobs
from spotopt.whatif.preemptions import NOTICE_S, no_preemptions, with_capacity
from spotopt.whatif.run import run_strategy
from spotopt.whatif.timeline import build_timeline
from tests.test_whatif_engine import T0, job, quotes
from tests.traces import TRACE_MARKET, spot_trace

Array = np.ndarray[Any, Any]
GAP_S = 600
TICK_H = GAP_S / 3600


def trace_world(up: list[int], deadline: str | None = "6h", work_h: float = 4.0, restart_s: int = 720) -> Any:
    """One spot zone (market 1: p3.2xlarge us-east-1a, $1) whose capacity follows ``up`` per
    10-minute tick, and on-demand (market 2, $3.06); one job of ``work_h`` hours on a V100."""
    tl = build_timeline(quotes({1: [(0, 1.0)], 2: [(0, 3.06)]}), T0, len(up) * TICK_H, TICK_H)
    spot = next(k for k, m in enumerate(tl.markets) if m.quote.market == "spot")
    at = np.arange(len(up)) * TICK_H
    tl.capacity = Capacity.from_observations(
        tl.n_markets, tl.n_ticks, TICK_H, np.full(len(up), spot), at, np.array(up) > 0
    )
    spec = job(
        "j",
        throughput={"V100": 1.0},
        work={"steps": int(work_h * 3600)},
        restart_s=restart_s,
        checkpoint_s=1,
        **({"deadline": deadline} if deadline else {}),
    )
    sim = build_jobs(parse_jobs({"jobs": [spec]}), tl)
    return tl, sim, with_capacity(tl, no_preemptions(tl)), transfer_matrix(tl.locations, T0)


def work_hours(sim: Any) -> float:
    """Hours of training the job needs on its spot option (checkpoint writes included)."""
    e = int(np.flatnonzero(~sim.on_demand)[0])
    return float(sim.work[0] / (sim.steps_per_hour[e] * sim.checkpoint_eff[e]))


def test_capacity_tables_follow_the_observations() -> None:
    tl, _, events, _ = trace_world([1, 1, 0, 0, 1, 1])
    cap = tl.capacity
    assert cap is not None
    spot = int(np.flatnonzero(cap.observed)[0])
    assert cap.up[spot].tolist() == [True, True, False, False, True, True]
    # Seen before each tick's start: nothing, then the probe of the tick before.
    assert np.isnan(cap.seen[spot, 0]) and cap.seen[spot, 1:].tolist() == [1, 1, 0, 0, 1]
    # Reclaimed at the end of tick 1: the AWS notice two minutes before, in tick 1.
    assert cap.down_at[spot].tolist()[1] == pytest.approx(1.0)
    assert events[spot, 1] == pytest.approx(1.0 - NOTICE_S["aws"] / GAP_S)
    assert np.isnan(np.delete(events[spot], 1)).all()


def test_a_refused_launch_costs_a_minute_and_no_money() -> None:
    # Spot out for the first two ticks: greedy tries it, is refused, and waits.
    tl, sim, events, transfer = trace_world([0, 0] + [1] * 40)
    run = run_strategy("greedy", tl, sim, events, transfer, 0, Guardrails(period_h=TICK_H)).result
    assert run.refusals[0] == 2
    assert run.trace[0, :2].tolist() == [-1, -1]
    # The work after a 0.2 h restart from 20 minutes on, all on spot at $1.
    assert run.on_demand_h[0] == 0.0
    hours = 0.2 + work_hours(sim)
    assert run.spot_h[0] == pytest.approx(hours)
    assert run.cost_usd[0] == pytest.approx(hours)
    assert run.finish_h[0] == pytest.approx(2 * TICK_H + hours)


def test_a_restart_longer_than_a_tick_carries_over() -> None:
    tl, sim, events, transfer = trace_world([1] * 60, restart_s=1500)  # 25 minutes
    run = run_strategy("greedy", tl, sim, events, transfer, 0, Guardrails(period_h=TICK_H)).result
    assert run.finish_h[0] == pytest.approx(work_hours(sim) + 1500 / 3600)
    assert run.cost_usd[0] == pytest.approx(work_hours(sim) + 1500 / 3600)


def test_a_reclaim_at_an_outage_and_the_attempt_time_of_the_next_launch() -> None:
    # Up for an hour, out for an hour, up again: greedy keeps all its work (the emergency
    # checkpoint fits in the notice), waits, and restarts when capacity is back.
    up = [1] * 6 + [0] * 6 + [1] * 60
    tl, sim, events, transfer = trace_world(up, deadline="12h")
    run = run_strategy("greedy", tl, sim, events, transfer, 0, Guardrails(period_h=TICK_H)).result
    assert run.preemptions[0] == 1
    assert run.refusals[0] == 6
    first = 1.0 - NOTICE_S["aws"] / 3600 - 0.2  # productive until the notice
    again = 2.0 + 0.2 + (work_hours(sim) - first)
    assert run.finish_h[0] == pytest.approx(again)
    billed = (1.0 - NOTICE_S["aws"] / 3600 + 1 / 3600) + 0.2 + (work_hours(sim) - first)
    assert run.cost_usd[0] == pytest.approx(billed)
    assert pytest.approx(1 / 60) == LAUNCH_ATTEMPT_H


def test_uniform_progress_waits_when_ahead_and_greedy_never_goes_on_demand_early() -> None:
    # Two hours on spot (ahead of the line: 1.6 h done, the line at 1 h), then out for 40
    # minutes: every rule waits (the old UP went on-demand whenever no spot was there).
    tl, sim, events, transfer = trace_world([1] * 12 + [0] * 4 + [1] * 60, deadline="8h")
    guard = Guardrails(period_h=TICK_H)
    for name in ("uniform-progress", "greedy", "up-failover"):
        run = run_strategy(name, tl, sim, events, transfer, 0, guard).result
        assert run.trace[0, 12:16].tolist() == [-1] * 4, name
        assert run.on_demand_h[0] == 0.0, name


def test_uniform_progress_catches_up_on_demand_when_behind_its_line() -> None:
    # 4 h of work in 5 h, spot out for 2 h: behind the line, UP pays on-demand; greedy waits
    # until its safety net and then must stay on on-demand.
    tl, sim, events, transfer = trace_world([0] * 12 + [1] * 60, deadline="5h")
    guard = Guardrails(period_h=TICK_H)
    up = run_strategy("uniform-progress", tl, sim, events, transfer, 0, guard).result
    greedy = run_strategy("greedy", tl, sim, events, transfer, 0, guard).result
    oracle = run_strategy("oracle", tl, sim, events, transfer, 0, guard)
    for run in (up, greedy, oracle.result):
        assert run.finish_h[0] <= 5.0 + 1e-9
    assert up.on_demand_h[0] > 0
    assert oracle.lower_bound_usd is not None
    assert oracle.lower_bound_usd[0] <= min(up.cost_usd[0], greedy.cost_usd[0]) + 1e-9


def test_up_failover_takes_the_other_zone_when_one_is_out() -> None:
    tl = build_timeline(quotes({1: [(0, 1.0)], 2: [(0, 3.06)], 4: [(0, 4.0)]}), T0, 12.0, TICK_H)
    spot = [k for k, m in enumerate(tl.markets) if m.quote.market == "spot"]
    n = tl.n_ticks
    at = np.arange(n) * TICK_H
    out_a = np.arange(n) < 6  # the cheaper zone is out for the first hour
    tl.capacity = Capacity.from_observations(
        tl.n_markets,
        n,
        TICK_H,
        np.concatenate([np.full(n, spot[0]), np.full(n, spot[1])]),
        np.concatenate([at, at]),
        np.concatenate([~out_a, np.ones(n, dtype=bool)]),
    )
    spec = job(
        "j", throughput={"V100": {1: 1.0, 4: 1.0}}, work={"steps": 4 * 3600}, gpus={"min": 1, "max": 4}
    )
    spec.update(restart_s=720, checkpoint_s=1, deadline="8h")
    sim = build_jobs(parse_jobs({"jobs": [spec]}), tl)
    events = with_capacity(tl, no_preemptions(tl))
    transfer = transfer_matrix(tl.locations, T0)
    guard = Guardrails(period_h=TICK_H)
    single = run_strategy("uniform-progress", tl, sim, events, transfer, 0, guard).result
    failover = run_strategy("up-failover", tl, sim, events, transfer, 0, guard).result
    assert single.trace[0, 0] == -1  # its one market is out: it waits
    assert failover.trace[0, 0] >= 0  # the other zone launches at once
    assert failover.finish_h[0] < single.finish_h[0]


def test_whatif_replays_imported_availability(tmp_path: Path) -> None:
    """The CLI path: prices and a probe trace imported, then every deadline rule and the oracle."""
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    start = datetime(2022, 10, 27, tzinfo=UTC)
    prices = tmp_path / "prices.csv"
    prices.write_text(
        "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n"
        f"{(start - timedelta(days=1)).isoformat()},aws,us-west-2,us-west-2a,p3.2xlarge,spot,0.9731\n"
        f"{(start - timedelta(days=1)).isoformat()},aws,us-west-2,,p3.2xlarge,on-demand,3.06\n"
    )
    rng = np.random.default_rng(3)
    up, state = [], 1
    for _ in range(400):  # runs of a few hours up, under an hour out
        state = int(rng.random() < (0.95 if state else 0.3))
        up.append(state)
    trace = spot_trace(tmp_path / "us-west-2a_v100_1.json", GAP_S, up)
    runner = CliRunner()
    for args in (
        ["import", "csv", str(prices)],
        ["import", "availability", str(trace), "--start", start.isoformat(), *TRACE_MARKET],
    ):
        result = runner.invoke(app, ["--db", url, *args])
        assert result.exit_code == 0, result.output
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(
        "jobs:\n  - name: cbl\n    throughput: {V100: 1.0}\n    work: {steps: 43200}\n"
        "    deadline: 16h\n    restart_s: 720\n    checkpoint_s: 1\n"
        "    allow: {instance_types: [p3.2xlarge]}\n"
    )
    args = ["--start", (start + timedelta(hours=2)).isoformat(), "--starts", "3", "--every", "13h"]
    args += ["--tick", "10m", "--preemptions", "replay", "--format", "json"]
    args += ["--strategies", "on-demand,spot,greedy,uniform-progress,up-failover,spotopt,oracle"]
    result = runner.invoke(app, ["--db", url, "whatif", str(jobs), *args])
    assert result.exit_code == 0, result.output
    rows = {r["strategy"]: r for r in json.loads(result.stdout)["results"]}
    for name in ("on-demand", "greedy", "uniform-progress", "up-failover", "spotopt", "oracle"):
        assert rows[name]["deadline_met"] == 1.0, name
    assert rows["oracle"]["bound_usd"] <= min(r["cost_usd"] for r in rows.values() if r["cost_usd"]) + 1e-6
    assert rows["greedy"]["cost_usd"] < rows["on-demand"]["cost_usd"]
    assert rows["spot"]["preemptions"] > 0  # the outages reclaim spot instances


def two_markets(out_b_from: int = 0, a_out: tuple[int, ...] = (), work_h: int = 4) -> Any:
    """Spot markets a and b ($1 each; a out only in the ticks ``a_out``, b out from tick
    ``out_b_from`` on), on-demand $3.06; one V100 job of ``work_h`` hours, deadline twice that."""
    tl = build_timeline(quotes({1: [(0, 1.0)], 4: [(0, 1.0)], 2: [(0, 3.06)]}), T0, 3.0 * work_h, TICK_H)
    spot = [k for k, m in enumerate(tl.markets) if m.quote.market == "spot"]
    n = tl.n_ticks
    at = np.arange(n) * TICK_H
    tl.capacity = Capacity.from_observations(
        tl.n_markets,
        n,
        TICK_H,
        np.concatenate([np.full(n, spot[0]), np.full(n, spot[1])]),
        np.concatenate([at, at]),
        np.concatenate([~np.isin(np.arange(n), a_out), np.arange(n) < out_b_from]),
    )
    spec = job("j", throughput={"V100": 1.0}, work={"steps": work_h * 3600}, restart_s=720, checkpoint_s=1)
    spec.update(deadline=f"{2 * work_h}h")
    sim = build_jobs(parse_jobs({"jobs": [spec]}), tl)
    return tl, sim, with_capacity(tl, no_preemptions(tl)), transfer_matrix(tl.locations, T0), spot


def test_a_running_job_whose_move_is_refused_stays_where_it_runs() -> None:
    # A decider that starts the job in zone a and from tick 3 on asks every time to move it to
    # zone b, which has no capacity: make-before-break, the job keeps running in a and loses
    # nothing (it once lost its instance and paid a restart when the attempts ran out).
    tl, sim, events, transfer, spot = two_markets()
    in_a, in_b = (int(np.flatnonzero(sim.market == m)[0]) for m in spot)

    def decide(t: int, st: SimState) -> Array:
        return np.array([in_a if t < 3 else in_b])

    res = simulate(tl, sim, events, transfer, decide)
    assert np.isfinite(res.finish_h[0])  # it had lost its instance and never run again
    assert (res.trace[0, : int(res.finish_h[0] / TICK_H)] == in_a).all()
    assert res.refusals[0] > 0 and res.moves[0] == 0
    stays = simulate(tl, sim, events, transfer, lambda t, st: np.array([in_a]))
    assert res.finish_h[0] == pytest.approx(stays.finish_h[0])
    assert res.cost_usd[0] == pytest.approx(stays.cost_usd[0])


def test_spotopt_moves_on_price_only_to_a_market_with_capacity() -> None:
    # Markets a and b at one price; b out after the first hour, a with a one-tick blip every two
    # hours that preempts the job. Its preemptions in a, and none in b where it never ran, made b
    # look cheaper per step: the price rules moved the job to b, seen out, again and again. Now
    # the only launches refused are the preempted job's tries (a, then b) in a's blips.
    tl, sim, events, transfer, _ = two_markets(out_b_from=6, a_out=tuple(range(12, 108, 12)), work_h=12)
    res = run_strategy("spotopt", tl, sim, events, transfer, 0, Guardrails(period_h=TICK_H)).result
    assert np.isfinite(res.finish_h[0]) and res.preemptions[0] > 0
    assert res.refusals[0] <= 2 * res.preemptions[0]
