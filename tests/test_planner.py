"""The move test: moves only when their forecast saving beats their cost, riding out spikes,
guardrails, preemption notices, deadline safety; and the one egress rule ``spotopt plan`` uses."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from spotopt.db.queries import Quote
from spotopt.decide.egress import transfer_matrix
from spotopt.decide.fleet import FleetState, Options
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.rules import plan_moves
from spotopt.errors import InputError
from spotopt.history.market import MarketState
from spotopt.jobspec import parse_jobs
from spotopt.plan import build_problem

# One job, two regions of one cloud; options: 0 spot here, 1 spot there, 2 on-demand here.
TRANSFER = np.array([[0.0, 0.02], [0.02, 0.0], [0.0, 0.0]])


def options(
    prices: list[float],
    steps: float | list[float] = 100.0,
    baseline: list[float] | None = None,
    revert_h: list[float] | None = None,
) -> Options:
    usd = np.array(prices, dtype=float)
    return Options(
        key=np.arange(3),
        job=np.zeros(3, dtype=np.int64),
        market=np.arange(3),
        location=np.array([0, 1, 0]),
        steps_per_hour=np.broadcast_to(np.asarray(steps, dtype=float), (3,)).copy(),
        usd_per_hour=usd,
        instances_per_hour=np.ones(3),
        on_demand=np.array([False, False, True]),
        baseline_usd_per_hour=usd if baseline is None else np.array(baseline, dtype=float),
        revert_h=np.full(3, np.inf) if revert_h is None else np.array(revert_h, dtype=float),
        preemptions_per_hour=np.array([0.05, 0.05, 0.0]),
        transfer=TRANSFER,
        capacity=np.full(3, np.inf),
    )


def jobs(option: int = 0, remaining: float = 1000.0, **kw: Any) -> FleetState:
    base: dict[str, Any] = {
        "option": np.array([option]),
        "location": np.array([0 if option >= 0 else -1]),
        "remaining_steps": np.array([remaining]),
        "dwell_h": np.array([10.0]),
        "since_checkpoint_h": np.array([0.0]),
        "deadline_h": np.array([np.inf]),
        "notice": np.array([False]),
        "lost": np.array([False]),
        "spent_usd": np.array([0.0]),
        "restart_h": np.array([0.5]),
        "save_h": np.array([0.01]),
        "checkpoint_gb": np.array([10.0]),
        "dataset_gb": np.array([100.0]),
        "dataset_location": np.array([0]),
    }
    base.update({k: np.atleast_1d(np.asarray(v)) for k, v in kw.items()})
    return FleetState(names=("j",), locations=(("aws", "a"), ("aws", "b")), **base)


def moves(state: FleetState, opts: Options, target: int, guard: Guardrails | None = None) -> list[Any]:
    cur = opts.position(state.option)
    return plan_moves(state, opts, cur, np.array([target]), guard or Guardrails())


def test_a_move_that_does_not_pay_for_itself_is_not_made() -> None:
    # 10 h left at $1/h here vs $0.8/h there: saves $2, but the move costs 0.5 h × $0.8 plus
    # 10 GB checkpoint and 100 GB dataset at $0.02/GB = $2.60.
    assert moves(jobs(), options([1.0, 0.8, 3.0]), 1) == []


def test_a_move_that_pays_is_made_with_its_net_saving_and_cost() -> None:
    (move,) = moves(jobs(remaining=10_000), options([1.0, 0.8, 3.0]), 1)
    assert (move.to, move.reason) == (1, "price")
    cost = 0.5 * 0.8 + 10 * 0.02 + 100 * 0.02
    assert move.cost_usd == pytest.approx(cost)
    assert move.saving_usd == pytest.approx(100 * 1.0 - 100 * 0.8 - cost)


def test_a_small_price_gap_over_much_work_moves_where_a_ratio_test_would_not() -> None:
    # 5 % cheaper per step (a 1.1 ratio test refuses it), but 10,000 h of work left: $500 saved
    # against a $2.65 move.
    (move,) = moves(jobs(remaining=1e6), options([1.0, 0.95, 3.0]), 1)
    assert move.saving_usd == pytest.approx(10_000 * 0.05 - (0.5 * 0.95 + 2.2))


def test_the_margin_and_dwell_block_voluntary_moves() -> None:
    opts = options([1.0, 0.8, 3.0])
    # net saving $20 - $2.60 = $17.40: below a margin of 10 × $2.60
    assert moves(jobs(remaining=10_000), opts, 1, Guardrails(move_margin=10)) == []
    assert moves(jobs(remaining=1e6, dwell_h=1.0), opts, 1, Guardrails(min_dwell_h=2)) == []
    with pytest.raises(InputError, match="move_margin"):
        Guardrails(move_margin=-1)


def test_a_jobs_own_guardrails_override_the_fleets() -> None:
    opts = options([1.0, 0.8, 3.0])

    def own(**seconds: float | None) -> Guardrails:
        values = {"min_dwell_s": None, "move_margin": None, "deadline_margin_s": None, **seconds}
        spec = SimpleNamespace(name="j", guardrails=SimpleNamespace(**values))
        other = SimpleNamespace(name="k", guardrails=None)
        return Guardrails(min_dwell_h=2, move_margin=10).with_jobs([spec, other])

    # The fleet's dwell of 2 h holds a job that arrived an hour ago, its own dwell of 0 frees it;
    # the fleet's margin of 10 holds a small saving, its own margin of 0.5 lets it move.
    assert moves(jobs(remaining=1e6, dwell_h=1.0), opts, 1, own(min_dwell_s=0.0)) != []
    assert moves(jobs(remaining=10_000, dwell_h=5.0), opts, 1, own()) == []
    (move,) = moves(jobs(remaining=10_000, dwell_h=5.0), opts, 1, own(move_margin=0.5))
    assert move.reason == "price"
    # Its own deadline margin is deadline safety's (12 h left, on-demand needs 10.5 h and the
    # period 1 h: safe without a margin, not with 1 h of it); the other job keeps the fleet's.
    safety = options([0.1, 0.1, 3.0])
    assert moves(jobs(deadline_h=12.0), safety, 0, own()) == []
    (move,) = moves(jobs(deadline_h=12.0), safety, 0, own(deadline_margin_s=3600.0))
    assert (move.to, move.reason) == (2, "deadline")
    assert own(deadline_margin_s=3600.0).per_job("deadline_margin_h", ("j", "k")).tolist() == [1.0, 0.0]
    with pytest.raises(InputError, match="guardrails of job 'j'"):
        Guardrails(jobs={"j": {"min_dwell_h": -1.0}})


def test_a_short_spike_is_ridden_out_in_place_a_long_one_on_cheaper_capacity() -> None:
    # Here spikes to $3/h (baseline $1/h); there costs $1.2/h. Leaving for good loses $0.2/h over
    # 1000 h. Escaping for the spike saves $1.8/h but pays two moves of 2 h restart plus a 100 GB
    # checkpoint ($2) each way, about $8.41: not worth it for 4 h, worth it for 40 h.
    state = jobs(remaining=100_000, checkpoint_gb=100.0, dataset_gb=0.0, restart_h=2.0)
    short = options([3.0, 1.2, 5.0], baseline=[1.0, 1.2, 5.0], revert_h=[4.0, np.inf, np.inf])
    assert moves(state, short, 1) == []
    long = options([3.0, 1.2, 5.0], baseline=[1.0, 1.2, 5.0], revert_h=[40.0, np.inf, np.inf])
    (move,) = moves(state, long, 1)
    assert move.saving_usd == pytest.approx(40 * 1.8 - (2.0 * 1.2 + 2.0) - (2.01 * 1.0 + 2.0))


def test_a_long_job_escapes_a_spike_on_slower_cheap_capacity_and_the_plan_is_to_return() -> None:
    # Here (fast) spikes to $10/h for an expected 20 h; there is half as fast at $0.8/h: per step
    # twice as dear as here's baseline, so nobody moves there for good, but riding out the spike
    # there saves 20 h × ($10 - $0.8) minus the progress lost (half of 20 h at $1/h) and two moves.
    opts = options(
        [10.0, 0.8, 20.0],
        steps=[100.0, 50.0, 100.0],
        baseline=[1.0, 0.8, 20.0],
        revert_h=[20, np.inf, np.inf],
    )
    state = jobs(remaining=100_000, checkpoint_gb=0.0, dataset_gb=0.0, restart_h=0.1, save_h=0.0)
    (move,) = moves(state, opts, 0)  # the escape is found even though the policy's target is "stay"
    assert move.to == 1
    expected = 20 * (10.0 - 0.8) - 1.0 * 20 * (1 - 50 / 100) - 0.1 * 0.8 - 0.1 * 1.0
    assert move.saving_usd == pytest.approx(expected)


def test_a_job_that_would_finish_inside_the_spike_compares_finishing_costs() -> None:
    # 10 h of work left at the slow option, the spike lasts 20 h: no return; finishing there
    # costs 1000/50 h × $0.8 = $16 against 10 h × $10 here.
    opts = options(
        [10.0, 0.8, 20.0],
        steps=[100.0, 50.0, 100.0],
        baseline=[1.0, 0.8, 20.0],
        revert_h=[20, np.inf, np.inf],
    )
    state = jobs(remaining=1000, checkpoint_gb=0.0, dataset_gb=0.0, restart_h=0.1, save_h=0.0)
    (move,) = moves(state, opts, 1)
    assert move.saving_usd == pytest.approx(10 * 10.0 - (0.1 * 0.8 + 20 * 0.8))


def test_preemption_notice_and_lost_instances_bypass_dwell_and_saving_but_not_the_budget() -> None:
    opts = options([1.0, 0.99, 3.0])
    for flag in ("notice", "lost"):
        forced = jobs(dwell_h=0.0, **{flag: True})
        (move,) = moves(forced, opts, 1, Guardrails(min_dwell_h=5, move_margin=100))
        assert (move.to, move.reason) == (1, "preempted")
        capped = Guardrails(budget_usd=1.0)  # finishing anywhere costs >= $9.90
        assert moves(forced, opts, 1, capped) == []


def test_a_lost_instance_redoes_its_work_a_notice_only_writes_a_checkpoint() -> None:
    opts = options([1.0, 1.0, 3.0])
    (lost,) = moves(jobs(lost=True, since_checkpoint_h=2.0, dataset_gb=0.0, checkpoint_gb=0.0), opts, 0)
    (notice,) = moves(jobs(notice=True, since_checkpoint_h=2.0, dataset_gb=0.0, checkpoint_gb=0.0), opts, 0)
    assert lost.cost_usd == pytest.approx((0.5 + 2.0) * 1.0)
    assert notice.cost_usd == pytest.approx((0.5 + 0.01) * 1.0)


def test_spend_rate_cap_excludes_dear_markets_at_start() -> None:
    (move,) = moves(jobs(option=-1), options([2.0, 1.5, 3.0]), 0, Guardrails(max_usd_per_hour=1.8))
    assert (move.to, move.reason) == (1, "start")


def test_deadline_safety_moves_to_on_demand_when_slack_runs_out() -> None:
    # 1000 steps at 100/h = 10 h on demand + 0.5 h restart; with 11 h left and a 1 h period it must go now.
    opts = options([0.1, 0.1, 3.0])
    (move,) = moves(jobs(deadline_h=11.0), opts, 0, Guardrails(period_h=1.0))
    assert (move.to, move.reason) == (2, "deadline")
    assert moves(jobs(deadline_h=12.0), opts, 0, Guardrails(period_h=1.0)) == []


def test_moves_per_tick_keeps_the_largest_net_saving() -> None:
    usd = np.array([1.0, 0.5, 1.0, 0.2])
    two = Options(
        key=np.arange(4),
        job=np.array([0, 0, 1, 1]),
        market=np.arange(4),
        location=np.zeros(4, dtype=np.int64),
        steps_per_hour=np.full(4, 100.0),
        usd_per_hour=usd,
        instances_per_hour=np.ones(4),
        on_demand=np.zeros(4, dtype=bool),
        baseline_usd_per_hour=usd,
        revert_h=np.full(4, np.inf),
        preemptions_per_hour=np.zeros(4),
        transfer=np.zeros((2, 1)),
        capacity=np.full(4, np.inf),
    )
    state = FleetState(
        names=("a", "b"),
        locations=(("aws", "a"),),
        option=np.array([0, 2]),
        location=np.zeros(2, dtype=np.int64),
        remaining_steps=np.full(2, 1e5),
        dwell_h=np.full(2, 10.0),
        since_checkpoint_h=np.zeros(2),
        deadline_h=np.full(2, np.inf),
        notice=np.zeros(2, dtype=bool),
        lost=np.zeros(2, dtype=bool),
        spent_usd=np.zeros(2),
        restart_h=np.full(2, 0.1),
        save_h=np.zeros(2),
        checkpoint_gb=np.zeros(2),
        dataset_gb=np.zeros(2),
        dataset_location=np.full(2, -1),
    )
    found = plan_moves(
        state, two, two.position(state.option), np.array([1, 3]), Guardrails(max_moves_per_tick=1)
    )
    assert [(m.job, m.to) for m in found] == [(1, 3)]


def test_fleet_state_round_trips_through_json() -> None:
    import json

    state = jobs(remaining=123.0, lost=True)
    again = FleetState.from_dict(json.loads(json.dumps(state.to_dict())))
    for name, value in state.to_dict().items():
        assert again.to_dict()[name] == value


@pytest.mark.parametrize("at", [datetime(2021, 1, 1, tzinfo=UTC), datetime(2024, 6, 1, tzinfo=UTC)])
def test_plan_prices_dataset_egress_like_the_whatif_engine(at: datetime) -> None:
    spec = parse_jobs(
        {
            "jobs": [
                {
                    "name": "j",
                    "throughput": {"V100": 1.0},
                    "work": {"steps": 1000},
                    "dataset": {"gb": 100, "cloud": "gcp", "region": "us-central1"},
                }
            ]
        }
    )
    places = [("gcp", "us-central1"), ("gcp", "us-east1"), ("aws", "us-east-1")]
    per_gb = transfer_matrix(places, at)[0]
    markets = [
        MarketState(
            Quote(i, cloud, region, None, "x", "spot", "V100-16GB", 1, 1.0, at, "t"), 0.0, "default", None
        )
        for i, (cloud, region) in enumerate(places)
    ]
    problem = build_problem(spec, markets, at, prune=False)
    by_region = {(o.market.quote.cloud, o.market.quote.region): o.egress_usd for o in problem.options}
    for place, usd in zip(places, per_gb, strict=True):
        assert by_region[place] == pytest.approx(100 * usd)
    assert per_gb[1] != per_gb[2]  # inter-region and internet differ, and 2024's inter-region is dearer


def mix_options(revert: float = np.inf) -> Options:
    """A slow spot option (0), a fast spot option (1: 4x the speed, 5x the price, so dearer per
    step) and a fast on-demand option (2)."""
    usd = np.array([1.0, 5.0, 9.0])
    return Options(
        key=np.arange(3),
        job=np.zeros(3, dtype=np.int64),
        market=np.arange(3),
        location=np.zeros(3, dtype=np.int64),
        steps_per_hour=np.array([100.0, 400.0, 400.0]),
        usd_per_hour=usd,
        instances_per_hour=np.ones(3),
        on_demand=np.array([False, False, True]),
        baseline_usd_per_hour=usd,
        revert_h=np.full(3, revert),
        preemptions_per_hour=np.array([0.0, 0.0, 0.0]),
        transfer=np.zeros((2, 1)),
        capacity=np.full(3, np.inf),
    )


def deadline_job(option: int, remaining: float, deadline_h: float) -> FleetState:
    return jobs(
        option=option,
        remaining=remaining,
        deadline_h=deadline_h,
        restart_h=0.1,
        save_h=0.0,
        checkpoint_gb=0.0,
        dataset_gb=0.0,
        dataset_location=-1,
    )


def test_a_slow_leg_is_left_for_the_fast_one_while_the_fast_one_still_makes_it() -> None:
    # 4000 steps: 10 h on the fast option. Reserve = 1 h period + 0.1 h restart. After one more
    # hour on the slow option (3900 left: 9.75 h fast + 0.1 h restart) the job needs 9.85 h of the
    # deadline - 1.1 h - 1 h: affordable with a 21 h deadline, not with 11.5 h (9.4 h), which
    # is still safe (on-demand needs 10.1 h of the 10.5 h deadline safety looks at).
    opts = mix_options()
    assert moves(deadline_job(0, 4000, 21.0), opts, 0) == []
    (move,) = moves(deadline_job(0, 4000, 11.5), opts, 0)
    assert (move.to, move.reason) == (1, "deadline")


def test_a_deadline_job_never_goes_back_to_a_slower_leg() -> None:
    # On the fast leg with plenty of time: the slow option is cheaper per step (1/100 vs 5/400)
    # and could even finish in time, but the job stays; without a deadline it would move.
    opts = mix_options()
    assert moves(deadline_job(1, 4000, 100.0), opts, 0) == []
    (free,) = moves(deadline_job(1, 4000, np.inf), opts, 0)
    assert free.to == 0
    # and a preempted fast-leg job is placed on a fast option again, not on the cheap slow one
    lost = jobs(option=1, remaining=4000, deadline_h=100.0, lost=True, restart_h=0.1, dataset_location=-1)
    (again,) = moves(lost, opts, 0)
    assert (again.to, again.reason) == (1, "preempted")


def test_a_deadline_job_with_nothing_affordable_goes_to_its_fast_leg() -> None:
    # 10 h left on the fast leg and 11.15 h to the deadline: safe (on-demand needs 10.1 h of the
    # 10.15 h deadline safety looks at) but no option is affordable (a period on the fast leg
    # then 9.1 h, against 11.15 h less a reserve of 1.1 h and a period). The policy's target is
    # the slow leg; on it the job would fall further behind, into deadline safety's on-demand.
    opts = mix_options()
    lost = jobs(option=0, remaining=4000, deadline_h=11.15, lost=True, restart_h=0.1, dataset_location=-1)
    (again,) = moves(lost, opts, 0)
    assert (again.to, again.reason) == (1, "preempted")
    (caught_up,) = moves(deadline_job(0, 4000, 11.15), opts, 0)
    assert (caught_up.to, caught_up.reason) == (1, "deadline")


def test_a_job_behind_its_plan_does_not_hop_to_a_twin_that_reads_faster() -> None:
    # Option 1 is option 0's twin (its expected speed 2 % higher: another market's preemption
    # discount); the job is behind its plan on 0 but safe. A hop to the twin pays a restart for
    # nothing: no catch-up move (the price rule finds no saving either).
    opts = options([1.0, 1.01, 3.0], steps=[100.0, 102.0, 110.0])
    assert moves(deadline_job(0, 1000, 11.0), opts, 0) == []
    faster = options([1.0, 1.01, 3.0], steps=[100.0, 120.0, 110.0])
    (move,) = moves(deadline_job(0, 1000, 11.0), faster, 0)
    assert (move.to, move.reason) == (1, "deadline")


def test_the_deadline_reserve_grows_with_the_preemption_risk_ahead() -> None:
    from spotopt.decide.costs import deadline_reserve_h

    state = deadline_job(0, 4000, 25.0)
    calm = mix_options()
    risky = dataclasses.replace(calm, preemptions_per_hour=np.array([0.5, 0.04, 0.0]))
    guard = Guardrails()
    base = guard.period_h + 0.1
    assert deadline_reserve_h(state, calm, guard)[0] == pytest.approx(base)
    # 25 h left on the fast leg's market at 0.04/h: 3 standard deviations of sqrt(1) preemptions
    # of 1.1 h each (the slow option's rate does not count: the plan ends on the fast leg)
    waits = 0.04 * 25 * guard.period_h / 2  # one expected preemption, half a period to the next decision
    assert deadline_reserve_h(state, risky, guard)[0] == pytest.approx(base + waits + 3 * 1.0 * 1.1)
    assert deadline_reserve_h(deadline_job(0, 4000, np.inf), risky, guard)[0] == 0.0
