"""A job that loses its instance is recovered onto the market ``spotopt plan`` picks, not back
onto its old one (issue 36, item 2).

Two spot zones of one instance type price the same GPU: the job's options there are one leg,
the zone it ran on a hair faster in expectation (its life there taught the rate estimate a
slightly lower rate, as a real daemon's does). The job starts on the $0.80/h zone, the
other drops to $0.20/h while the job's dwell keeps it in place, then the instance dies. The
policy gives the job to the $0.20/h zone; the targets took the dead instance's option for "the
leg the job is on" and every recovery went back to $0.80/h. Here at the decision core, in one
process and through a restarted daemon's memory; ``tests/test_recovery_daemon.py`` through the
installed console script.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import pytest

from spotopt.db.queries import Quote
from spotopt.decide.core import Memory, decide
from spotopt.decide.fleet import FleetState, Options
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.options import enumerate_options, initial_state
from spotopt.history.market import MarketState
from spotopt.jobspec import parse_jobs
from spotopt.plan import build_problem, plan_report, solve

AT = datetime(2026, 1, 5, tzinfo=UTC)
SPEC = parse_jobs({"jobs": [{"name": "mlp", "throughput": {"V100": 40}, "work": {"steps": 400000}}]})
RATES = (0.02, 0.019999)
"""Preemptions per hour of the zones: the $0.80/h one, where the job ran, learnt a lower rate."""


def markets(usd_a: float, usd_b: float) -> list[MarketState]:
    rows = [("us-east-1a", usd_a), ("us-east-1b", usd_b)]
    return [
        MarketState(
            Quote(i + 1, "aws", "us-east-1", zone, "p3.2xlarge", "spot", "V100-16GB", 1, usd, AT, "t"),
            RATES[i],
            "default",
            None,
        )
        for i, (zone, usd) in enumerate(rows)
    ]


def priced(usd_a: float, usd_b: float) -> tuple[FleetState, Options]:
    snap = markets(usd_a, usd_b)
    return initial_state(SPEC, enumerate_options(SPEC, snap, AT), snap, AT)


def key_of(opts: Options, zone: int) -> int:
    return int(opts.key[opts.market == zone][0])


def on_dearer_zone_after_the_drop(memory: Memory) -> tuple[FleetState, Options]:
    """The job started on the $0.80/h zone; the other now costs $0.20/h; the job's dwell (0.5 h
    of the default 2 h) kept it in place through a decision at the new prices."""
    state, before = priced(0.90, 0.80)
    (start,) = decide(state, before, Guardrails(), memory)
    assert (start.reason, start.to) == ("start", key_of(before, 1))
    state.option[0], state.location[0], state.dwell_h[0], state.clock_h = start.to, 0, 0.5, 0.5
    _, after = priced(0.20, 0.80)
    speed = after.steps_per_hour
    assert speed[after.market == 1][0] > speed[after.market == 0][0]
    assert np.isclose(speed[after.market == 1][0], speed[after.market == 0][0])  # one leg
    assert decide(state, after, Guardrails(), memory) == []  # dwell: no voluntary move yet
    return state, after


@pytest.mark.parametrize("event", ["lost", "notice"])
@pytest.mark.parametrize("restarted", [False, True], ids=["same-daemon", "restarted-daemon"])
def test_a_lost_or_warned_job_goes_where_the_policy_puts_it(event: str, restarted: bool) -> None:
    memory = Memory()
    state, opts = on_dearer_zone_after_the_drop(memory)
    if restarted:  # the daemon's memory and state, as its journal and meta row hand them back
        memory = Memory.from_dict(json.loads(json.dumps(memory.to_dict())))
        state = FleetState.from_dict(json.loads(json.dumps(state.to_dict(), default=float)))
    getattr(state, event)[0] = True
    (recovery,) = decide(state, opts, Guardrails(), memory)
    assert (recovery.reason, recovery.to) == ("preempted", key_of(opts, 0))


def test_the_recovery_is_the_market_plan_picks() -> None:
    """``spotopt plan`` on the same prices puts the whole job on the $0.20/h zone."""
    problem = build_problem(SPEC, markets(0.20, 0.80), AT)
    report = plan_report(problem, solve("min-cost", problem.input))
    assert [(a["zone"], a["share"]) for a in report["jobs"][0]["allocation"]] == [("us-east-1a", 1.0)]


def test_a_working_job_on_a_twin_zone_still_stays_for_the_move_test() -> None:
    """The twin rule itself holds for a job whose instance works: the policy's pick of a twin
    zone does not make it the target; the price rule weighs the move once dwell allows."""
    memory = Memory()
    state, opts = on_dearer_zone_after_the_drop(memory)
    assert memory.target == {"mlp": key_of(opts, 1)}
    state.dwell_h[0] = 3.0
    (move,) = decide(state, opts, Guardrails(), memory)
    assert (move.reason, move.to) == ("price", key_of(opts, 0))
