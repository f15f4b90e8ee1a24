"""The wait-for-spot tables against an independent recursion, and the rule's choices in the core."""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from spotopt.mover import waiting
from spotopt.mover.capacity_rule import capacity_moves
from spotopt.mover.fleet import Availability, FleetState, Options
from spotopt.mover.guardrails import Guardrails
from spotopt.mover.waiting import IDLE, ON_DEMAND, SPOT, Chain, Job, chain_from_history

K = waiting.UNITS_PER_TICK


def reference(job: Job, chain: Chain, ticks: int, slack: int, state: tuple[int, int], up: int) -> float:
    """Least expected cost by plain recursion over the model of ``spotopt.mover.waiting``
    (``state``: (IDLE|SPOT|ON_DEMAND, restart units left))."""
    unit = job.tick_h / K
    r = math.ceil(job.restart_h / unit - 1e-9)
    late = waiting.LATE_FACTOR * job.od_usd_per_h * unit

    @cache
    def value(tau: int, s: int, kind: int, rho: int, u: int) -> float:
        work = tau * K - s
        if work <= 0:
            return 0.0
        if s < 0:
            return math.inf  # never reached: ``after`` prices a missed deadline
        best = math.inf
        choices = {IDLE: [IDLE, SPOT, ON_DEMAND], SPOT: [SPOT, ON_DEMAND], ON_DEMAND: [ON_DEMAND, SPOT]}[kind]
        for a in choices:
            if a == SPOT and not u:
                continue
            if a == IDLE:
                best = min(best, moved(tau, s - K, IDLE, 0, u, work))
                continue
            q = rho if a == kind else r
            price = (job.spot_usd_per_h if a == SPOT else job.od_usd_per_h) * unit
            if q + work <= K:
                best = min(best, price * (q + work))
                continue
            s2, q2 = s - min(q, K), max(q - K, 0)
            if a == SPOT:
                keep = 1 - chain.p_lose - chain.p_switch
                later = keep * after(tau, s2, SPOT, q2, 1, work)
                later += chain.p_lose * after(tau, s2, IDLE, 0, 0, work)
                later += chain.p_switch * after(tau, s2, IDLE, 0, 1, work)
            else:
                later = moved(tau, s2, ON_DEMAND, q2, u, work)
            best = min(best, price * K + later)
        return best

    def moved(tau: int, s: int, kind: int, rho: int, u: int, work: int) -> float:
        stay = 1 - chain.p_lose if u else chain.p_back
        return stay * after(tau, s, kind, rho, 1, work) + (1 - stay) * after(tau, s, kind, rho, 0, work)

    def after(tau: int, s: int, kind: int, rho: int, u: int, work: int) -> float:
        if s < 0:
            return -s * late + max(work - K, 0) * job.od_usd_per_h * unit
        return value(tau - 1, s, kind, rho, u)

    return value(ticks, slack, state[0], state[1], up)


@pytest.mark.parametrize("seed", range(4))
def test_the_tables_take_the_cheapest_action_of_an_independent_recursion(seed: int) -> None:
    rng = np.random.default_rng(seed)
    job = Job(1.0, float(rng.choice([0.0, 1 / 6, 0.5, 1.5])), float(rng.uniform(0.5, 1.5)), 3.06)
    chain = Chain(float(rng.uniform(0, 0.4)), float(rng.uniform(0.05, 1)), float(rng.uniform(0, 0.2)))
    r = round(job.restart_h / (job.tick_h / K))
    table = waiting._solve(job, chain, 8, 32)
    for tau in range(1, 7):
        for s in range(0, min(20, tau * K), 3):  # work left: tau·K − s > 0
            for kind, rho, up in [
                (IDLE, 0, 0),
                (IDLE, 0, 1),
                (SPOT, 0, 1),
                (ON_DEMAND, 0, 0),
                (ON_DEMAND, 0, 1),
            ]:
                state = 0 if kind == IDLE else (1 + rho if kind == SPOT else r + 2 + rho)
                act = int(table[tau - 1, s, state, up])
                # The chosen action's value is the least of the actions allowed there.
                values = {}
                for a in (IDLE, SPOT, ON_DEMAND):
                    if (a == SPOT and not up) or (a == IDLE and kind != IDLE):
                        continue
                    values[a] = _value_of(job, chain, tau, s, kind, rho, up, a)
                assert values[act] <= min(values.values()) + 1e-9 * max(1.0, min(values.values()))


def _value_of(job: Job, chain: Chain, tau: int, s: int, kind: int, rho: int, up: int, action: int) -> float:
    """The reference value of taking ``action`` first, then acting optimally."""
    if action == IDLE:
        stay = 1 - chain.p_lose if up else chain.p_back
        if s - K < 0:
            unit = job.tick_h / K
            return (K - s) * waiting.LATE_FACTOR * job.od_usd_per_h * unit + max(tau * K - s - K, 0) * (
                job.od_usd_per_h * unit
            )
        return stay * reference(job, chain, tau - 1, s - K, (IDLE, 0), 1) + (1 - stay) * reference(
            job, chain, tau - 1, s - K, (IDLE, 0), 0
        )
    # Forcing the first action: the recursion from a state where it is the only choice that
    # differs is the same as entering (or staying on) that kind.
    restricted = {
        SPOT: (SPOT, rho if kind == SPOT else None),
        ON_DEMAND: (ON_DEMAND, rho if kind == ON_DEMAND else None),
    }
    target, q = restricted[action]
    unit = job.tick_h / K
    r = math.ceil(job.restart_h / unit - 1e-9)
    q = r if q is None else q
    work = tau * K - s
    price = (job.spot_usd_per_h if target == SPOT else job.od_usd_per_h) * unit
    if q + work <= K:
        return price * (q + work)
    s2, q2 = s - min(q, K), max(q - K, 0)

    def after(kind2: int, rho2: int, u: int) -> float:
        if s2 < 0:
            return (
                -s2 * waiting.LATE_FACTOR * job.od_usd_per_h * unit
                + max(work - K, 0) * job.od_usd_per_h * unit
            )
        return reference(job, chain, tau - 1, s2, (kind2, rho2), u)

    if target == SPOT:
        keep = 1 - chain.p_lose - chain.p_switch
        later = (
            keep * after(SPOT, q2, 1) + chain.p_lose * after(IDLE, 0, 0) + chain.p_switch * after(IDLE, 0, 1)
        )
    else:
        stay = 1 - chain.p_lose if up else chain.p_back
        later = stay * after(ON_DEMAND, q2, 1) + (1 - stay) * after(ON_DEMAND, q2, 0)
    return price * K + later


def test_a_job_waits_when_its_slack_covers_the_outages_ahead_and_pays_when_it_does_not() -> None:
    job = Job(1 / 6, 0.2, 0.9731, 3.06)
    rare = Chain(0.01, 0.5, 0.0)  # up 17 h at a time, out 20 minutes
    often = Chain(0.07, 0.16, 0.0)  # up 2.3 h at a time, out an hour: 30 % of the time
    # 50 h left with 6 h of slack: rare outages are waited out, frequent ones need on-demand.
    assert waiting.decide(job, rare, 300, 6.0, IDLE, 0.0, False) == IDLE
    assert waiting.decide(job, often, 300, 6.0, IDLE, 0.0, False) == ON_DEMAND
    # Near the end the same slack covers what is left: wait.
    assert waiting.decide(job, often, 30, 3.0, IDLE, 0.0, False) == IDLE
    # Spot there: take it; on on-demand with slack to spare, go back to spot.
    assert waiting.decide(job, rare, 300, 6.0, IDLE, 0.0, True) == SPOT
    assert waiting.decide(job, rare, 300, 6.0, ON_DEMAND, 0.0, True) == SPOT
    # No slack for a restart: stay on on-demand, and a job without instance takes it.
    assert waiting.decide(job, rare, 300, 0.1, ON_DEMAND, 0.0, True) == ON_DEMAND
    assert waiting.decide(job, rare, 300, 0.1, IDLE, 0.0, True) == ON_DEMAND


def test_the_chain_is_learnt_from_the_runs_seen() -> None:
    series = np.array([1.0] * 10 + [0.0] * 2 + [1.0] * 10 + [0.0] * 2 + [np.nan] * 3)
    chain = chain_from_history(series, series, 1.0, 1.0)
    # 20 h up over 2 losses (+ the prior's 24 h over 1), 4 h down over 1 return (+ 1 h over 1).
    assert chain.p_lose == pytest.approx(1 - math.exp(-1 / ((20 + 24) / 3)))
    assert chain.p_back == pytest.approx(1 - math.exp(-1 / ((4 + 1) / 2)))
    assert chain.p_switch == 0.0
    assert chain.rounded() == Chain(
        *(10 ** (round(math.log10(p) * 10) / 10) for p in (chain.p_lose, chain.p_back)), 0.0
    )


def _fleet(option: int, deadline_h: float, restart_h: float = 0.2) -> FleetState:
    one = np.ones(1)
    return FleetState(
        names=("j",),
        locations=(("aws", "us-west-2"),),
        option=np.array([option]),
        location=np.array([0 if option >= 0 else -1]),
        remaining_steps=np.array([40.0 * 3600]),
        dwell_h=one * 5,
        since_checkpoint_h=one * 0,
        deadline_h=np.array([deadline_h]),
        notice=np.zeros(1, dtype=bool),
        lost=np.zeros(1, dtype=bool),
        spent_usd=one * 0,
        restart_h=one * restart_h,
        save_h=one * 0,
        checkpoint_gb=one * 0,
        dataset_gb=one * 0,
        dataset_location=np.array([-1]),
    )


def _options(history: np.ndarray, refused: np.ndarray) -> Options:
    """Keys 0, 1: spot in two zones; key 2: on-demand; 3600 steps/h everywhere."""
    n = 3
    return Options(
        key=np.arange(n),
        job=np.zeros(n, dtype=np.int64),
        market=np.arange(n),
        location=np.zeros(n, dtype=np.int64),
        steps_per_hour=np.full(n, 3600.0),
        usd_per_hour=np.array([0.97, 0.95, 3.06]),
        instances_per_hour=np.ones(n),
        on_demand=np.array([False, False, True]),
        baseline_usd_per_hour=np.array([0.97, 0.95, 3.06]),
        revert_h=np.full(n, np.inf),
        preemptions_per_hour=np.zeros(n),
        transfer=np.zeros((2, 1)),
        capacity=np.full(n, np.inf),
        availability=Availability(np.array([True, True, False]), history, 1 / 6, refused),
    )


def test_the_rule_fails_over_waits_or_pays_as_the_tables_say() -> None:
    guard = Guardrails(period_h=1 / 6)
    flaky = np.tile(np.array([1.0] * 12 + [0.0] * 2), (3, 20))  # outages of 20 minutes
    flaky[2] = np.nan
    often = np.tile(np.array([1.0] * 14 + [0.0] * 6), (3, 20))  # out an hour in every 3.3
    often[2] = np.nan
    # Idle, both zones open: the cheaper one per step (key 1).
    moves, decided = capacity_moves(_fleet(-1, 60.0), _options(flaky, np.zeros(3, dtype=bool)), guard)
    assert decided.tolist() == [True] and [(m.to, m.reason) for m in moves] == [(1, "start")]
    # Zone b refused just now: zone a.
    moves, _ = capacity_moves(_fleet(-1, 60.0), _options(flaky, np.array([False, True, False])), guard)
    assert [m.to for m in moves] == [0]
    # Both refused, 20 h of slack and short outages: wait (no move).
    moves, decided = capacity_moves(_fleet(-1, 60.0), _options(flaky, np.array([True, True, False])), guard)
    assert decided.tolist() == [True] and moves == []
    # Both refused, outages of an hour in every 3.3 and 6 h of slack in 46: on-demand now.
    moves, _ = capacity_moves(_fleet(-1, 46.0), _options(often, np.array([True, True, False])), guard)
    assert [(m.to, m.reason) for m in moves] == [(2, "start")]
    # A job on spot stays; one without a deadline is left to the price rules.
    moves, decided = capacity_moves(_fleet(1, 60.0), _options(flaky, np.zeros(3, dtype=bool)), guard)
    assert moves == [] and decided.tolist() == [True]
    moves, decided = capacity_moves(_fleet(-1, math.inf), _options(flaky, np.zeros(3, dtype=bool)), guard)
    assert moves == [] and decided.tolist() == [False]


def test_a_month_long_job_on_a_daemon_polling_every_few_seconds_gets_a_small_table() -> None:
    tick = waiting.table_tick_h(5 / 3600, 30 * 24.0, 0.2)
    assert tick == pytest.approx(30 * 24.0 / waiting.MAX_TICKS)
    job = Job(tick, 0.2, 0.97, 3.06)
    chain = chain_from_history(np.array([1.0, 1.0, 0.0, 1.0]), np.zeros(0), 5 / 3600, tick)
    ticks = int(30 * 24.0 / tick)
    assert waiting.decide(job, chain, ticks, 100.0, IDLE, 0.0, True) == SPOT
    table = waiting._tables(job, chain.rounded(), ticks, waiting.MAX_SLACK_UNITS - 1)
    assert table.nbytes <= 40e6
