"""The planner: moves only when they pay, guardrails, preemption notices, deadline safety; and
``spotopt plan`` prices egress from the same table."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

from spotopt.db.queries import Quote
from spotopt.errors import InputError
from spotopt.jobspec import parse_jobs
from spotopt.market import MarketState
from spotopt.mover.egress import transfer_matrix
from spotopt.mover.guardrails import Guardrails
from spotopt.mover.planner import PlannerJobs, PlannerOptions, plan_moves
from spotopt.plan import egress_usd

# One job, two regions of one cloud; options: 0 spot here, 1 spot there, 2 on-demand here.
TRANSFER = np.array([[0.0, 0.02], [0.02, 0.0], [0.0, 0.0]])


def options(prices: list[float], steps: float = 100.0) -> PlannerOptions:
    return PlannerOptions(
        job=np.zeros(3, dtype=np.int64),
        location=np.array([0, 1, 0]),
        steps_per_hour=np.full(3, steps),
        usd_per_hour=np.array(prices, dtype=float),
        on_demand=np.array([False, False, True]),
    )


def jobs(option: int = 0, remaining: float = 1000.0, **kw: object) -> PlannerJobs:
    base: dict[str, object] = {
        "option": np.array([option]),
        "location": np.array([0 if option >= 0 else -1]),
        "remaining_steps": np.array([remaining]),
        "dwell_h": np.array([10.0]),
        "since_checkpoint_h": np.array([0.0]),
        "deadline_h": np.array([np.inf]),
        "notice": np.array([False]),
        "spent_usd": np.array([0.0]),
        "restart_h": np.array([0.5]),
        "save_h": np.array([0.01]),
        "checkpoint_gb": np.array([10.0]),
        "dataset_gb": np.array([100.0]),
        "dataset_location": np.array([0]),
    }
    base.update({k: np.atleast_1d(np.asarray(v)) for k, v in kw.items()})
    return PlannerJobs(**base)  # type: ignore[arg-type]


def test_a_move_that_does_not_pay_for_itself_is_not_made() -> None:
    # 10 h left at $1/h here vs $0.8/h there: saves $2, but the move costs 0.5 h × $0.8 plus
    # 10 GB checkpoint and 100 GB dataset at $0.02/GB = $2.60.
    assert plan_moves(jobs(), options([1.0, 0.8, 3.0]), np.array([1]), TRANSFER, Guardrails()) == []


def test_a_move_that_pays_is_made_with_its_saving_and_cost() -> None:
    (move,) = plan_moves(
        jobs(remaining=10_000), options([1.0, 0.8, 3.0]), np.array([1]), TRANSFER, Guardrails()
    )
    assert (move.to, move.reason) == (1, "price")
    assert move.saving_usd == pytest.approx(100 * 1.0 - 100 * 0.8)
    assert move.cost_usd == pytest.approx(0.5 * 0.8 + 10 * 0.02 + 100 * 0.02)


def test_hysteresis_and_dwell_block_voluntary_moves() -> None:
    opts = options([1.0, 0.95, 3.0])
    assert (
        plan_moves(jobs(remaining=1e6), opts, np.array([1]), TRANSFER, Guardrails(price_improvement=1.1))
        == []
    )
    cheap = options([1.0, 0.5, 3.0])
    assert (
        plan_moves(
            jobs(remaining=1e6, dwell_h=1.0), cheap, np.array([1]), TRANSFER, Guardrails(min_dwell_h=2)
        )
        == []
    )


def test_preemption_notice_bypasses_dwell_and_price_but_not_the_budget() -> None:
    opts = options([1.0, 0.99, 3.0])
    notice = jobs(dwell_h=0.0, notice=True)
    (move,) = plan_moves(
        notice, opts, np.array([1]), TRANSFER, Guardrails(min_dwell_h=5, price_improvement=2)
    )
    assert (move.to, move.reason) == (1, "preempted")
    capped = Guardrails(budget_usd=1.0)  # finishing anywhere costs >= $9.90
    assert plan_moves(notice, opts, np.array([1]), TRANSFER, capped) == []


def test_spend_rate_cap_excludes_dear_markets_at_start() -> None:
    (move,) = plan_moves(
        jobs(option=-1), options([2.0, 1.5, 3.0]), np.array([0]), TRANSFER, Guardrails(max_usd_per_hour=1.8)
    )
    assert (move.to, move.reason) == (1, "start")


def test_deadline_safety_moves_to_on_demand_when_slack_runs_out() -> None:
    # 1000 steps at 100/h = 10 h on demand + 0.5 h restart; with 11 h left and a 1 h period it must go now.
    opts = options([0.1, 0.1, 3.0])
    (move,) = plan_moves(jobs(deadline_h=11.0), opts, np.array([0]), TRANSFER, Guardrails(period_h=1.0))
    assert (move.to, move.reason) == (2, "deadline")
    assert plan_moves(jobs(deadline_h=12.0), opts, np.array([0]), TRANSFER, Guardrails(period_h=1.0)) == []


def test_moves_per_tick_keeps_the_largest_net_saving() -> None:
    two = PlannerOptions(
        job=np.array([0, 0, 1, 1]),
        location=np.zeros(4, dtype=np.int64),
        steps_per_hour=np.full(4, 100.0),
        usd_per_hour=np.array([1.0, 0.5, 1.0, 0.2]),
        on_demand=np.zeros(4, dtype=bool),
    )
    state = PlannerJobs(
        option=np.array([0, 2]),
        location=np.zeros(2, dtype=np.int64),
        remaining_steps=np.full(2, 1e5),
        dwell_h=np.full(2, 10.0),
        since_checkpoint_h=np.zeros(2),
        deadline_h=np.full(2, np.inf),
        notice=np.zeros(2, dtype=bool),
        spent_usd=np.zeros(2),
        restart_h=np.full(2, 0.1),
        save_h=np.zeros(2),
        checkpoint_gb=np.zeros(2),
        dataset_gb=np.zeros(2),
        dataset_location=np.full(2, -1),
    )
    moves = plan_moves(state, two, np.array([1, 3]), np.zeros((2, 1)), Guardrails(max_moves_per_tick=1))
    assert [(m.job, m.to) for m in moves] == [(1, 3)]


def test_guardrails_are_validated() -> None:
    with pytest.raises(InputError, match="price_improvement"):
        Guardrails(price_improvement=0.5)


@pytest.mark.parametrize("at", [datetime(2021, 1, 1, tzinfo=UTC), datetime(2024, 6, 1, tzinfo=UTC)])
def test_plan_prices_dataset_egress_like_the_whatif_engine(at: datetime) -> None:
    job = parse_jobs(
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
    ).jobs[0]
    places = [("gcp", "us-central1"), ("gcp", "us-east1"), ("aws", "us-east-1")]
    per_gb = transfer_matrix(places, at)[0]
    for (cloud, region), usd in zip(places, per_gb, strict=True):
        quote = Quote(1, cloud, region, None, "x", "spot", "V100-16GB", 1, 1.0, at, "t")
        assert egress_usd(job, MarketState(quote, 0.0, "default", None), at) == pytest.approx(100 * usd)
    assert per_gb[1] != per_gb[2]  # inter-region and internet differ, and 2024's inter-region is dearer
