"""One decision path: ``spotopt plan``, the what-if engine and a daemon-style loop, handed the
same state and market, make the same choices through ``spotopt.decide.core.decide``."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest

from spotopt.db.queries import Quote
from spotopt.decide.core import Memory, decide, default_policy, solve_policy
from spotopt.decide.egress import transfer_matrix
from spotopt.decide.fleet import FleetState, Options
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.options import enumerate_options, initial_state
from spotopt.history.market import MarketState
from spotopt.jobspec import parse_jobs
from spotopt.plan import build_problem
from spotopt.whatif.engine import SimState
from spotopt.whatif.jobs import build_jobs
from spotopt.whatif.spotopt_decider import SpotoptDecider
from spotopt.whatif.timeline import build_timeline

AT = datetime(2020, 2, 1, tzinfo=UTC)
MARKETS = [
    # cloud, region, zone, type, market, gpu, count, $/h, preemptions/h
    ("aws", "us-east-1", "us-east-1a", "p3.2xlarge", "spot", "V100-16GB", 1, 0.95, 0.05),
    ("aws", "us-east-1", "us-east-1b", "p3.2xlarge", "spot", "V100-16GB", 1, 1.10, 0.02),
    ("aws", "us-east-1", None, "p3.2xlarge", "on-demand", "V100-16GB", 1, 3.06, 0.0),
    ("aws", "us-west-2", "us-west-2a", "p2.xlarge", "spot", "K80", 1, 0.27, 0.1),
    ("aws", "us-west-2", None, "p2.xlarge", "on-demand", "K80", 1, 0.90, 0.0),
    ("aws", "us-west-2", "us-west-2b", "p3.8xlarge", "spot", "V100-16GB", 4, 3.2, 0.05),
    ("gcp", "us-central1", None, "n1-standard-8+1xnvidia-tesla-v100", "spot", "V100-16GB", 1, 0.74, 0.2),
    ("gcp", "us-central1", None, "n1-standard-8+1xnvidia-tesla-v100", "on-demand", "V100-16GB", 1, 2.48, 0.0),
]
JOBS = {
    "jobs": [
        {
            "name": "resnet",
            "throughput": {"K80": 1.0, "V100": 9.6},
            "work": {"gpu_days": 1, "gpu": "V100"},
            "dataset": {"gb": 150, "cloud": "aws", "region": "us-east-1"},
            "checkpoint_gb": 0.1,
        },
        {"name": "a3c", "throughput": {"K80": 1.0, "V100": 2.2}, "work": {"gpu_days": 1, "gpu": "V100"}},
        {
            "name": "tight",
            "throughput": {"K80": 1.0, "V100": 3.3},
            "work": {"gpu_days": 1, "gpu": "V100"},
            "gpus": {"min": 1, "max": 4},
            "deadline": "30h",
        },
    ]
}


def snapshot() -> list[MarketState]:
    out = []
    for i, (cloud, region, zone, itype, kind, gpu, count, usd, rate) in enumerate(MARKETS):
        quote = Quote(i + 1, cloud, region, zone, itype, kind, gpu, count, usd, AT, "t")
        out.append(MarketState(quote, rate, "default" if rate else "on-demand", None))
    return out


def label(market: MarketState, gpus: int) -> tuple[Any, ...]:
    return (market.label, gpus)


def test_plan_whatif_and_a_daemon_loop_choose_the_same_options() -> None:
    spec = parse_jobs(JOBS)
    markets = snapshot()

    problem = build_problem(spec, markets, AT)
    name = default_policy(problem.input.deadline_hours)
    alloc = solve_policy(name, problem.input)
    planned = {}
    for j in range(len(spec.jobs)):
        mine = np.flatnonzero((problem.input.job == j) & (alloc.share > 1e-6))
        per_step = problem.input.usd_per_hour[mine] / problem.input.steps_per_hour[mine]
        e = int(mine[np.argmin(per_step)])  # the plan's first allocation row: what runs first
        planned[j] = label(problem.options[e].market, problem.options[e].gpus)

    table = enumerate_options(spec, markets, AT)
    state, opts = initial_state(spec, table, markets, AT)
    moves = decide(state, opts, Guardrails(), Memory())
    at = {m.job: int(opts.position(np.array([m.to]))[0]) for m in moves}
    core = {j: label(table.infos[e].market, table.infos[e].gpus) for j, e in at.items()}
    assert {m.reason for m in moves} == {"start"}

    quotes = [m.quote for m in markets]
    tl = build_timeline(quotes, AT, 48, 1.0, {m.quote.market_id: m for m in markets})
    sim = build_jobs(spec, tl)
    decider = SpotoptDecider(tl, sim, transfer_matrix(tl.locations, AT), Guardrails())
    chosen = decider(0, SimState.initial(sim.n_jobs, tl.n_markets))
    simulated = {j: label(tl.markets[int(sim.market[e])], int(sim.gpus[e])) for j, e in enumerate(chosen)}

    assert planned == core == simulated
    assert len(set(core.values())) > 1  # the jobs do not all pick the same thing


def run_loop(state: FleetState, opts: Options, memory: Memory, ticks: int) -> list[list[tuple[int, int]]]:
    """A daemon in a few lines: decide, apply the moves, let an hour of work pass, repeat."""
    seen = []
    for _ in range(ticks):
        moves = decide(state, opts, Guardrails(), memory)
        seen.append([(m.job, m.to) for m in moves])
        for m in moves:
            pos = int(opts.position(np.array([m.to]))[0])
            state.option[m.job] = m.to
            state.location[m.job] = opts.location[pos]
            state.dwell_h[m.job] = 0.0
        placed = opts.position(state.option)
        speed = np.where(placed >= 0, opts.steps_per_hour[np.maximum(placed, 0)], 0.0)
        state.remaining_steps = np.maximum(state.remaining_steps - speed, 0.0)
        state.deadline_h = state.deadline_h - 1.0
        state.dwell_h = state.dwell_h + 1.0
        state.clock_h += 1.0
    return seen


@pytest.mark.parametrize("restart_after", [1, 3])
def test_a_restarted_daemon_decides_exactly_as_before(restart_after: int) -> None:
    spec = parse_jobs(JOBS)
    markets = snapshot()
    state, opts = initial_state(spec, enumerate_options(spec, markets, AT), markets, AT)
    straight = run_loop(FleetState.from_dict(state.to_dict()), opts, Memory(), 8)
    assert straight[0] and not any(straight[1:])  # a frozen market: place once, then stay

    memory = Memory()
    first = run_loop(state, opts, memory, restart_after)
    saved = json.dumps({"state": state.to_dict(), "memory": memory.to_dict()}, default=float)
    loaded = json.loads(saved)
    again = run_loop(
        FleetState.from_dict(loaded["state"]), opts, Memory.from_dict(loaded["memory"]), 8 - restart_after
    )
    assert first + again == straight


def test_no_options_means_no_moves() -> None:
    """A fleet whose jobs have nothing priced (every market filtered out) gets no move, not a crash."""
    spec = parse_jobs(JOBS)
    markets = snapshot()
    table = enumerate_options(spec, markets, AT)
    state, opts = initial_state(spec, table, markets, AT)
    empty = Options(
        **{
            f: getattr(opts, f)[:0] if f not in ("transfer", "capacity", "availability") else getattr(opts, f)
            for f in opts.__dataclass_fields__
        }
    )
    assert decide(state, empty, Guardrails(), Memory()) == []


def test_a_job_no_policy_can_place_does_not_stop_the_others() -> None:
    """min-cost itself infeasible (one job needs more than the horizon): the others still start."""
    jobs = {
        "jobs": [*JOBS["jobs"][:2], {"name": "endless", "throughput": {"K80": 1.0}, "work": {"steps": 1e12}}]
    }
    spec = parse_jobs(jobs)
    markets = snapshot()
    table = enumerate_options(spec, markets, AT)
    state, opts = initial_state(spec, table, markets, AT)
    memory = Memory()
    moves = decide(state, opts, Guardrails(), memory)
    assert {state.names[m.job] for m in moves} >= {"resnet", "a3c"}
    assert any("job 'endless' set aside" in n for n in memory.notes)  # not the whole fleet's targets


def test_a_recovery_takes_the_market_that_became_cheaper_not_its_old_one() -> None:
    # Issue 20: a job whose instance died after a market 4x cheaper appeared was relaunched on
    # its old $0.80/h market. Its old market's expected speed is a little higher only because
    # the job's life there taught the rate estimate it preempts less (0.01/h against 0.05/h).
    at = AT
    rows = [
        ("us-east-1a", "spot", 0.80, 0.01),
        ("us-east-1b", "spot", 0.20, 0.05),
        (None, "on-demand", 3.06, 0.0),
    ]
    markets = [
        MarketState(
            Quote(i + 1, "aws", "us-east-1", zone, "p3.2xlarge", kind, "V100-16GB", 1, usd, at, "t"),
            rate,
            "default" if rate else "on-demand",
            None,
        )
        for i, (zone, kind, usd, rate) in enumerate(rows)
    ]
    spec = parse_jobs(
        {"jobs": [{"name": "mlp", "throughput": {"V100": 1.0}, "work": {"steps": 40000}, "deadline": "40h"}]}
    )
    table = enumerate_options(spec, markets, at)
    state, opts = initial_state(spec, table, markets, at)
    old, cheap = (int(opts.key[opts.market == m][0]) for m in (0, 1))
    assert opts.steps_per_hour[opts.market == 0][0] > opts.steps_per_hour[opts.market == 1][0]
    guard, memory = Guardrails(min_dwell_h=0.0), Memory()
    without_cheap = replace(opts, usd_per_hour=np.where(opts.market == 1, np.nan, opts.usd_per_hour))
    assert [m.to for m in decide(state, without_cheap, guard, memory)] == [old]
    state.option[0], state.location[0], state.dwell_h[0], state.clock_h = old, 0, 1.0, 1.0
    decide(state, opts, guard, memory)  # the cheaper market appears
    state.lost[0] = True  # the instance dies
    (recovery,) = decide(state, opts, guard, memory)
    assert (recovery.reason, recovery.to) == ("preempted", cheap)
