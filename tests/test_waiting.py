"""The wait-for-spot tables against an independent recursion, and the rule's choices in the core."""

from __future__ import annotations

import math
from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from spotopt.decide import waiting
from spotopt.decide.capacity_rule import CAPACITY
from spotopt.decide.core import Memory, decide
from spotopt.decide.fleet import Availability, FleetState, Options
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.rules import Round
from spotopt.decide.waiting import IDLE, ON_DEMAND, SPOT, Chain, Job, chain_from_history

K = waiting.UNITS_PER_TICK


def _turns(chain: Chain, u: int, a: int) -> list[tuple[float, int, int]]:
    """(chance, up, age) a tick on from (up, age), by the chain's hazards and age buckets."""
    width = (waiting.AGE_EDGES[a + 1] - waiting.AGE_EDGES[a]) if a + 1 < waiting.N_AGES else math.inf
    adv = 1 / width
    flip = chain.lose[a] if u else chain.back[a]
    return [
        (flip, 1 - u, 0),
        ((1 - flip) * (1 - adv), u, a),
        ((1 - flip) * adv, u, min(a + 1, waiting.N_AGES - 1)),
    ]


def reference(
    job: Job, chain: Chain, tau: int, s: int, kind: int, rho: int, u: int, a: int, first: int | None = None
) -> float:
    """Least expected cost by plain recursion over the model of ``spotopt.decide.waiting``
    (``first``: the action forced now; ``None``: the best)."""
    unit = job.tick_h / K
    r = math.ceil(job.restart_h / unit - 1e-9)
    late = waiting.LATE_FACTOR * job.od_usd_per_h * unit

    @cache
    def value(tau: int, s: int, kind: int, rho: int, u: int, a: int, first: int | None) -> float:
        work = tau * K - s
        if work <= 0:
            return 0.0
        choices = {IDLE: [IDLE, SPOT, ON_DEMAND], SPOT: [SPOT, ON_DEMAND], ON_DEMAND: [ON_DEMAND, SPOT]}[kind]
        best = math.inf
        for act in choices if first is None else [first]:
            if act == SPOT and not u:
                continue
            if act == IDLE:
                best = min(
                    best,
                    sum(p * after(tau, s - K, IDLE, 0, u2, a2, work) for p, u2, a2 in _turns(chain, u, a)),
                )
                continue
            q = rho if act == kind else r
            price = (job.spot_usd_per_h if act == SPOT else job.od_usd_per_h) * unit
            if q + work <= K:
                best = min(best, price * (q + work))
                continue
            s2, q2 = s - min(q, K), max(q - K, 0)
            if act == SPOT:
                sw = min(chain.p_switch, 1 - chain.lose[a])
                later = chain.lose[a] * after(tau, s2, IDLE, 0, 0, 0, work)
                for p, _, a2 in _turns(chain, 1, a)[1:]:  # the pool stays up and ages
                    share = p / (1 - chain.lose[a]) if chain.lose[a] < 1 else 0.0
                    later += share * (1 - chain.lose[a] - sw) * after(tau, s2, SPOT, q2, 1, a2, work)
                    later += share * sw * after(tau, s2, IDLE, 0, 1, a2, work)
            else:
                later = sum(
                    p * after(tau, s2, ON_DEMAND, q2, u2, a2, work) for p, u2, a2 in _turns(chain, u, a)
                )
            best = min(best, price * K + later)
        return best

    def after(tau: int, s: int, kind: int, rho: int, u: int, a: int, work: int) -> float:
        if s < 0:
            return -s * late + max(work - K, 0) * job.od_usd_per_h * unit
        return value(tau - 1, s, kind, rho, u, a, None)

    return value(tau, s, kind, rho, u, a, first)


@pytest.mark.parametrize("seed", range(4))
def test_the_tables_take_the_cheapest_action_of_an_independent_recursion(seed: int) -> None:
    rng = np.random.default_rng(seed)
    job = Job(1.0, float(rng.choice([0.0, 1 / 4, 0.5, 1.5])), float(rng.uniform(0.5, 1.5)), 3.06)
    lose = tuple(float(x) for x in rng.uniform(0, 0.4, waiting.N_AGES))
    back = tuple(float(x) for x in rng.uniform(0.05, 1, waiting.N_AGES))
    chain = Chain(lose, back, float(rng.uniform(0, 0.2)))
    left = waiting.restart_units(round(job.restart_h / (job.tick_h / K)))
    table = waiting._solve(job, chain, 8, 32)
    kinds = [(IDLE, 0, 0), (IDLE, 1, 0)] + [
        (kind, up, i) for i in range(len(left)) for kind, up in [(SPOT, 1), (ON_DEMAND, 0), (ON_DEMAND, 1)]
    ]
    for tau in range(1, 7):
        for s in range(0, min(20, tau * K), 3):  # work left: tau·K − s > 0
            for a in (0, 1, 3, waiting.N_AGES - 1):
                for kind, up, i in kinds:  # i: which restart left (every one a tick reaches)
                    state = 0 if kind == IDLE else (1 + i if kind == SPOT else len(left) + 1 + i)
                    act = int(table[tau - 1, s, state, up, a])
                    # The chosen action's value is the least of the actions allowed there.
                    values = {
                        first: reference(job, chain, tau, s, kind, int(left[i]), up, a, first)
                        for first in (IDLE, SPOT, ON_DEMAND)
                        if not ((first == SPOT and not up) or (first == IDLE and kind != IDLE))
                    }
                    assert values[act] <= min(values.values()) + 1e-9 * max(1.0, min(values.values()))


def flat(lose: float, back: float, switch: float = 0.0) -> Chain:
    """A memoryless chain: the same hazards at every age."""
    return Chain((lose,) * waiting.N_AGES, (back,) * waiting.N_AGES, switch)


def test_a_job_waits_when_its_slack_covers_the_outages_ahead_and_pays_when_it_does_not() -> None:
    job = Job(1 / 6, 0.2, 0.9731, 3.06)
    rare = flat(0.01, 0.5)  # up 17 h at a time, out 20 minutes
    often = flat(0.07, 0.16)  # up 2.3 h at a time, out an hour: 30 % of the time
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


def test_heavy_tails_wait_out_a_fresh_outage_pay_in_an_old_one_and_skip_blips() -> None:
    job = Job(1 / 6, 0.2, 0.9731, 3.06)
    old = waiting.N_AGES - 1
    # Most outages end within 20 minutes; one that has lasted hours goes on for hours more.
    outages = Chain((0.03,) * waiting.N_AGES, (0.6, 0.5, 0.3, 0.1, 0.02, 0.01, 0.01, 0.01), 0.0)
    assert waiting.decide(job, outages, 300, 4.0, IDLE, 0.0, False, age=0) == IDLE
    assert waiting.decide(job, outages, 300, 4.0, IDLE, 0.0, False, age=old) == ON_DEMAND
    # Capacity that has just come back mostly goes again within minutes; capacity that has
    # held for hours holds. From on-demand, a restart onto a blip does not pay.
    blips = Chain((0.7, 0.5, 0.3, 0.05, 0.01, 0.005, 0.005, 0.005), (0.3,) * waiting.N_AGES, 0.0)
    assert waiting.decide(job, blips, 300, 3.0, ON_DEMAND, 0.0, True, age=0) == ON_DEMAND
    assert waiting.decide(job, blips, 300, 3.0, ON_DEMAND, 0.0, True, age=5) == SPOT
    # A memoryless chain with the same mean outage decides the same at every age.
    same = flat(0.01, 0.2)
    assert waiting.decide(job, same, 300, 4.0, IDLE, 0.0, False, age=0) == waiting.decide(
        job, same, 300, 4.0, IDLE, 0.0, False, age=old
    )


def test_the_hazards_are_learnt_from_the_runs_seen() -> None:
    series = np.array([1.0] * 10 + [0.0] * 2 + [1.0] * 10 + [0.0] * 2 + [np.nan] * 3)
    chain = chain_from_history(series, series, 1.0, 1.0)
    # Up: two runs of 10 h, both ended (at ages in [8, 16)); the memoryless mean is 20 h
    # over 2 losses with the prior's 24 h over 1. Each bucket: its ends over its hours lived,
    # with one pseudo-end at the memoryless rate.
    q_up = 1 - math.exp(-1 / ((20 + 24) / 3))
    lived = [2, 2, 4, 8, 4, 0, 0, 0]
    ends = [0, 0, 0, 0, 2, 0, 0, 0]
    assert chain.lose == pytest.approx([(e + 1) / (x + 1 / q_up) for e, x in zip(ends, lived, strict=True)])
    # Down: two runs of 2 h, one ended (at an age in [1, 2)), the other cut by unknown steps.
    q_down = 1 - math.exp(-1 / ((4 + 1) / 2))
    lived = [2, 2, 0, 0, 0, 0, 0, 0]
    ends = [0, 1, 0, 0, 0, 0, 0, 0]
    assert chain.back == pytest.approx([(e + 1) / (x + 1 / q_down) for e, x in zip(ends, lived, strict=True)])
    assert chain.p_switch == 0.0
    snapped = chain.rounded()
    assert snapped.lose[4] == pytest.approx(10 ** (round(math.log10(chain.lose[4]) * 10) / 10))
    # The age now: the last known state and how long it has held.
    assert waiting.age_bucket(series, False, 1.0, 1.0) == 1  # seen out twice: one tick old
    assert waiting.age_bucket(series, True, 1.0, 1.0) == 0  # up now, as far as it knows: new
    assert waiting.age_bucket(series[:22], True, 1.0, 1.0) == 4  # up 10 h: 9 ticks old, [8, 16)


def test_a_pool_just_back_takes_the_hazard_of_a_runs_first_tick() -> None:
    # Up-runs are blips of one step or spells of 40: half the runs end after their first
    # tick, and one that survived it holds on. A pool seen up at one step only is as likely
    # to go as a blip; at two steps it has survived its first tick.
    runs = [1.0] + [0.0] * 3 + [1.0] * 40 + [0.0] * 3
    series = np.array(runs * 30)
    chain = chain_from_history(series, series, 1.0, 1.0)
    just_back = np.r_[series, 1.0]
    assert chain.lose[waiting.age_bucket(just_back, True, 1.0, 1.0)] > 0.3
    held = np.r_[series, 1.0, 1.0]
    assert chain.lose[waiting.age_bucket(held, True, 1.0, 1.0)] < 0.05


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


def _capacity_round(state: FleetState, opts: Options, guard: Guardrails) -> Round:
    """A round after the capacity rule alone (no policy targets)."""
    rnd = Round.build(state, opts, opts.position(state.option), np.full(state.n_jobs, -1), guard)
    CAPACITY.apply(rnd)
    return rnd


def test_the_rule_fails_over_waits_or_pays_as_the_tables_say() -> None:
    guard = Guardrails(period_h=1 / 6)
    flaky = np.tile(np.array([1.0] * 12 + [0.0] * 2), (3, 20))  # outages of 20 minutes
    flaky[2] = np.nan
    often = np.tile(np.array([1.0] * 14 + [0.0] * 6), (3, 20))  # out an hour in every 3.3
    often[2] = np.nan
    # Idle, both zones open: the cheaper one per step (key 1).
    rnd = _capacity_round(_fleet(-1, 60.0), _options(flaky, np.zeros(3, dtype=bool)), guard)
    assert rnd.decided.tolist() == [True] and [(m.to, m.reason) for m in rnd.moves] == [(1, "start")]
    # Zone b refused just now: zone a.
    rnd = _capacity_round(_fleet(-1, 60.0), _options(flaky, np.array([False, True, False])), guard)
    assert [m.to for m in rnd.moves] == [0]
    # Both refused, 20 h of slack and short outages: wait (no move).
    rnd = _capacity_round(_fleet(-1, 60.0), _options(flaky, np.array([True, True, False])), guard)
    assert rnd.decided.tolist() == [True] and rnd.moves == []
    # Both refused, outages of an hour in every 3.3 and 6 h of slack in 46: on-demand now.
    rnd = _capacity_round(_fleet(-1, 46.0), _options(often, np.array([True, True, False])), guard)
    assert [(m.to, m.reason) for m in rnd.moves] == [(2, "start")]
    # A job on spot stays on spot: it is left to the price rules with its options narrowed to
    # its pool's zones seen available and cheaper (and its own).
    up_now = np.roll(flaky, 2, axis=1)  # the same runs, the last one of capacity
    rnd = _capacity_round(_fleet(0, 60.0), _options(up_now, np.zeros(3, dtype=bool)), guard)
    assert rnd.moves == [] and rnd.decided.tolist() == [False]
    assert rnd.usable.tolist() == [True, True, False]
    rnd = _capacity_round(_fleet(0, 60.0), _options(flaky, np.zeros(3, dtype=bool)), guard)
    assert rnd.usable.tolist() == [True, False, False]  # zone b was seen out last: no move there
    rnd = _capacity_round(_fleet(1, 60.0), _options(up_now, np.zeros(3, dtype=bool)), guard)
    assert rnd.usable.tolist() == [False, True, False]  # zone a is dearer: no move there
    # One without a deadline is left to the price rules with all its options.
    rnd = _capacity_round(_fleet(-1, math.inf), _options(flaky, np.zeros(3, dtype=bool)), guard)
    assert rnd.moves == [] and rnd.decided.tolist() == [False] and rnd.usable.all()


def test_of_zones_equal_on_price_the_one_whose_capacity_has_held_longer_is_taken() -> None:
    # Runs of capacity of 1, 1 and 60 steps: one just back is likely to go again at once, one
    # that has held 40 steps is not. Both zones cost the same; the older run wins, whichever zone.
    seg = [1.0] + [0.0] + [1.0] + [0.0] + [1.0] * 60 + [0.0]
    young = seg * 8 + [0.0] * 39 + [1.0]
    old = seg * 8 + [1.0] * 40
    guard = Guardrails(period_h=1 / 6)
    for history, pick in (([young, old], 1), ([old, young], 0)):
        rows = np.array([*history, [np.nan] * len(young)])
        opts = replace(_options(rows, np.zeros(3, dtype=bool)), usd_per_hour=np.array([0.95, 0.95, 3.06]))
        rnd = _capacity_round(_fleet(-1, 48.0), opts, guard)
        assert [(m.to, m.reason) for m in rnd.moves] == [(pick, "start")]


def test_a_job_the_tables_keep_on_spot_still_moves_to_a_cheaper_zone_of_its_pool() -> None:
    flaky = np.tile(np.array([1.0] * 12 + [0.0] * 2), (3, 20))
    flaky[2] = np.nan
    up_now = np.roll(flaky, 2, axis=1)
    # On zone a ($0.97/h); zone b now costs $0.40/h: the price rules move it, within the pool.
    opts = replace(_options(up_now, np.zeros(3, dtype=bool)), usd_per_hour=np.array([0.97, 0.40, 3.06]))
    moves = decide(_fleet(0, 60.0), opts, Guardrails(period_h=1 / 6), Memory())
    assert [(m.to, m.reason) for m in moves] == [(1, "price")]
    # Zone b seen out last: a move there would most likely be refused; the job stays.
    seen_out = up_now.copy()
    seen_out[1, -1] = 0.0
    moves = decide(
        _fleet(0, 60.0),
        replace(opts, availability=replace(opts.availability, history=seen_out)),
        Guardrails(period_h=1 / 6),
        Memory(),
    )
    assert moves == []
    # Zone b dearer: it stays where it is.
    opts = replace(opts, usd_per_hour=np.array([0.97, 1.20, 3.06]))
    moves = decide(_fleet(0, 60.0), opts, Guardrails(period_h=1 / 6), Memory())
    assert moves == []


def test_a_job_the_tables_keep_on_spot_does_not_hop_to_a_twin_zone_that_reads_faster() -> None:
    # Zones a and b at one price, both up. The job runs in a, where it was preempted a few
    # times, so a's learnt rate reads it 3 % slower per expected step than b, where it never
    # ran. The price rules saw a saving of $1 over 40 h and paid a restart to hop; which of two
    # zones equal on price holds its capacity is the tables' question (at a launch), not price.
    flaky = np.tile(np.array([1.0] * 12 + [0.0] * 2), (3, 20))
    flaky[2] = np.nan
    up_now = np.roll(flaky, 2, axis=1)
    opts = replace(
        _options(up_now, np.zeros(3, dtype=bool)),
        usd_per_hour=np.array([0.95, 0.95, 3.06]),
        steps_per_hour=np.array([3500.0, 3600.0, 3600.0]),
    )
    assert decide(_fleet(0, 60.0), opts, Guardrails(period_h=1 / 6), Memory()) == []


@pytest.mark.parametrize("period_h", [5 / 3600, 30 / 3600, 5 / 60, 1 / 6, 1.0])
def test_a_job_s_table_tick_changes_a_few_times_in_its_life_not_at_every_decision(period_h: float) -> None:
    """The tick is part of the tables' cache key: one that followed the time left solved a new
    table at every decision (5-minute probes, a 60 h job: 340 distinct ticks, ~1.6 s each)."""
    deadline_h, restart_h = 60.0, 0.2
    lefts = np.arange(deadline_h, 0.0, -period_h)
    ticks = [waiting.table_tick_h(period_h, float(left), restart_h) for left in lefts]
    restart_need = restart_h / waiting.MAX_RESTART_TICKS
    need = np.maximum(lefts / waiting.MAX_TICKS, restart_need)
    assert np.all(np.array(ticks) >= np.maximum(need, period_h) - 1e-12)  # a table still covers the job
    assert len(set(ticks)) <= 1 + math.ceil(math.log2(max(deadline_h / waiting.MAX_TICKS / period_h, 1.0)))
    multiples = np.log2(np.array(ticks) / period_h)
    assert np.allclose(multiples, np.round(multiples))  # whole octaves of the planning period


def test_a_month_long_job_on_a_daemon_polling_every_few_seconds_gets_a_small_table() -> None:
    tick = waiting.table_tick_h(5 / 3600, 30 * 24.0, 0.2)
    assert 30 * 24.0 / waiting.MAX_TICKS <= tick < 2 * 30 * 24.0 / waiting.MAX_TICKS
    job = Job(tick, 0.2, 0.97, 3.06)
    chain = chain_from_history(np.array([1.0, 1.0, 0.0, 1.0]), np.zeros(0), 5 / 3600, tick)
    ticks = int(30 * 24.0 / tick)
    assert waiting.decide(job, chain, ticks, 100.0, IDLE, 0.0, True) == SPOT
    table = waiting._tables(job, chain.rounded(), ticks, waiting.MAX_SLACK_UNITS - 1)
    assert table.nbytes <= 48e6


def test_the_tables_keep_one_state_per_tick_of_restart_not_per_unit() -> None:
    """Only the restarts a tick boundary reaches are states (the exhaustive test above checks
    the actions in each), and the size bound holds for the longest restart a tick takes."""
    assert waiting.restart_units(0).tolist() == [0]
    assert waiting.restart_units(5).tolist() == [0, 1, 5]
    assert waiting.restart_units(24).tolist() == [0, 4, 8, 12, 16, 20, 24]
    assert waiting.table_tick_h(5 / 60, 20.0, 10 / 60) == 5 / 60  # 2 ticks of restart
    assert waiting.table_tick_h(5 / 60, 20.0, 0.5) == 20 / 60  # 6 ticks: two octaves up
    longest = Job(1.0, float(waiting.MAX_RESTART_TICKS), 0.97, 3.06)
    states = waiting._solve(longest, flat(0.1, 0.3), 2, 8).shape[2]
    assert states == 2 * (waiting.MAX_RESTART_TICKS + 1) + 1  # the tables' size bound holds
    assert waiting.MAX_TICKS * waiting.MAX_SLACK_UNITS * states * 2 * waiting.N_AGES <= 17e6


def test_a_restart_left_mid_tick_decides_as_the_longer_reachable_one() -> None:
    job = Job(1.0, 5 / K, 0.97, 3.06)  # 5 units: a tick boundary leaves 5, 1 or 0
    chain = flat(0.2, 0.3)
    table = waiting._tables(job, chain.rounded(), 6, 12)
    for units, state in [(5, 3), (4, 3), (2, 3), (1, 2), (0, 1)]:
        for s in range(6, 12):
            want = int(table[5, s, state, 1, 0])
            assert waiting.decide(job, chain, 6, s / K, SPOT, units / K, True) == want
