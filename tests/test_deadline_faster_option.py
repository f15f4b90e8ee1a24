"""A job whose option cannot finish by its deadline moves to one that can, whatever the kind of
either: a slow on-demand instance is no safety net (the decision core, ``spotopt.decide``).

The job of the report: 100k steps known on an L4 (1.5 steps/s), an H100 estimated (8.6 steps/s,
5 at the low end of its interval), due in 8 h; the L4 alone needs 18.5 h. It sat on a working
L4 on-demand instance for 19 h: deadline safety skipped any job on a working on-demand instance
and catch-up looked at spot options only. Each test here fails on that code.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from spotopt.decide.core import RULES, Memory, decide
from spotopt.decide.fleet import Availability, FleetState, Move, Options
from spotopt.decide.guardrails import Guardrails
from spotopt.decide.rules import Round, apply_rules, plan_moves

L4_H = 5400.0
"""The L4's steps per hour (1.5 steps/s, the job's own figure: exact)."""
LEFT = 100_000 - L4_H
"""Steps left after the first hour on the L4."""
RESTART_H = 5 / 60


def options(
    steps: list[float],
    low: list[float],
    usd: list[float],
    on_demand: list[bool],
    location: list[int] | None = None,
) -> Options:
    """One job's options, priced flat (no forecast excursion), never preempted."""
    n = len(steps)
    price = np.array(usd, dtype=float)
    return Options(
        key=np.arange(n),
        job=np.zeros(n, dtype=np.int64),
        market=np.arange(n),
        location=np.zeros(n, dtype=np.int64) if location is None else np.array(location),
        steps_per_hour=np.array(steps, dtype=float),
        usd_per_hour=price,
        instances_per_hour=np.ones(n),
        on_demand=np.array(on_demand),
        baseline_usd_per_hour=price,
        revert_h=np.full(n, np.inf),
        preemptions_per_hour=np.zeros(n),
        transfer=np.array([[0.0, 0.02], [0.02, 0.0], [0.0, 0.0]]),
        capacity=np.full(n, np.inf),
        steps_per_hour_low=np.array(low, dtype=float),
    )


def job(option: int, deadline_h: float, remaining: float = LEFT, **kw: Any) -> FleetState:
    """The job on ``option`` (working), ``deadline_h`` left, checkpointed just now."""
    base: dict[str, Any] = {
        "option": np.array([option]),
        "location": np.array([0]),
        "remaining_steps": np.array([remaining]),
        "dwell_h": np.array([1.0]),
        "since_checkpoint_h": np.array([0.0]),
        "deadline_h": np.array([deadline_h]),
        "notice": np.array([False]),
        "lost": np.array([False]),
        "spent_usd": np.array([0.8]),
        "restart_h": np.array([RESTART_H]),
        "save_h": np.array([0.0]),
        "checkpoint_gb": np.array([10.0]),
        "dataset_gb": np.array([100.0]),
        "dataset_location": np.array([0]),
    }
    base.update({k: np.atleast_1d(np.asarray(v)) for k, v in kw.items()})
    return FleetState(names=("train",), locations=(("aws", "a"), ("aws", "b")), **base)


def on_demand_only() -> Options:
    """0: the L4 on demand ($0.8/h); 1: the H100 on demand ($12/h, 8.6 steps/s, 5 at its low end)."""
    return options([L4_H, 31_000.0], [L4_H, 18_000.0], [0.8, 12.0], [True, True])


def moves(state: FleetState, opts: Options, target: int = -1) -> list[tuple[int, str]]:
    """The price and deadline rules' moves, as (to, reason)."""
    made = plan_moves(state, opts, opts.position(state.option), np.array([target]), Guardrails())
    return [(m.to, m.reason) for m in made]


def test_the_decision_core_moves_the_job_off_the_slow_on_demand_l4_in_time() -> None:
    # One hour in, 94,600 steps left and 7 h to go: one more hour on the L4 and the H100 (at its
    # low end, with a restart) needs 5.04 h of the 4.92 h the plan leaves after its reserve of a
    # period and a restart; the H100 still fits (4.34 h). The job is behind: it moves now.
    made = decide(job(0, 7.0), on_demand_only(), Guardrails(), Memory())
    assert [(m.to, m.reason) for m in made] == [(1, "deadline")]
    assert isinstance(made[0], Move) and made[0].cost_usd == RESTART_H * 12.0


def test_an_unsafe_job_on_a_slow_working_on_demand_instance_moves_to_one_in_time() -> None:
    # 5.5 h left: past the plan (5.34 h on the H100 leaves less than a period to spare), and the
    # L4 needs 17.5 h. Deadline safety moves it, though it runs on a working on-demand instance.
    assert moves(job(0, 5.5), on_demand_only()) == [(1, "deadline")]


def test_with_no_option_in_time_the_job_takes_the_fastest_and_stays_there() -> None:
    # 5 h left: even the H100 needs 5.34 h at its low end; it is the quickest, so the job goes
    # there (a "deadline" move: the deadline at risk), and a job already on it stays.
    assert moves(job(0, 5.0), on_demand_only()) == [(1, "deadline")]
    assert moves(job(1, 5.0), on_demand_only()) == []


def test_a_slow_on_demand_job_that_still_finishes_in_time_is_left_alone() -> None:
    assert moves(job(0, 30.0), on_demand_only()) == []


def test_the_faster_option_may_be_spot() -> None:
    # Only the L4 is on demand; the H100 is spot (30k steps/h, 17k at its low end). No on-demand
    # option can finish, the spot H100 can (5.65 h of 7): the job moves there.
    spot_h100 = options([L4_H, 30_000.0], [L4_H, 17_000.0], [0.8, 4.0], [True, False])
    assert moves(job(0, 7.0), spot_h100) == [(1, "deadline")]


def test_a_job_on_slow_spot_is_not_sent_to_a_slow_on_demand_that_misses_too() -> None:
    # 0: the L4 spot it runs on; 1: the L4 on demand; 2: the H100 spot. The old safety net put
    # it on the L4 on demand (the quickest on-demand option, 17.5 h for 7 h); the H100 makes it.
    opts = options([L4_H, L4_H, 30_000.0], [L4_H, L4_H, 17_000.0], [0.3, 0.8, 4.0], [False, True, False])
    assert moves(job(0, 7.0), opts) == [(2, "deadline")]


def test_in_time_counts_the_moves_own_hours() -> None:
    # From a slow spot L4, 2 h after its checkpoint (the H100s would redo more than the 0.2 h a
    # checkpoint write takes: they write one). 1: an H100 on demand at 17.5k steps/h, $10/h;
    # 2: one at 18k, $12/h. With the restart alone both finish within the 5.6 h left (5.49 h,
    # 5.34 h) and 1 is cheaper; with the checkpoint write too only 2 does (5.69 h, 5.54 h).
    opts = options(
        [L4_H, 17_500.0, 18_000.0], [L4_H, 17_500.0, 18_000.0], [0.3, 10.0, 12.0], [False, True, True]
    )
    state = job(0, 5.6, since_checkpoint_h=2.0, save_h=0.2)
    assert moves(state, opts) == [(2, "deadline")]


def test_of_the_options_in_time_the_cheapest_counting_the_move_is_taken() -> None:
    # Two on-demand H100s in time: 1 in the job's region, 2 in another, $0.1/h cheaper (0.3 $
    # over the 3 h left) but its checkpoint and dataset (110 GB at $0.02/GB, 2.2 $) must move.
    opts = options(
        [L4_H, 31_000.0, 31_000.0],
        [L4_H, 18_000.0, 18_000.0],
        [0.8, 12.0, 11.9],
        [True, True, True],
        [0, 0, 1],
    )
    assert moves(job(0, 5.5), opts) == [(1, "deadline")]


def test_the_capacity_rule_moves_a_job_off_a_slower_on_demand_than_its_tables_own() -> None:
    # 0: the L4 on demand the job runs on; 1: the H100 on demand; 2: an H100 spot market whose
    # capacity is learnt (on and off every hour for a day, out since) and refused just now. With
    # 5.5 h left the tables pay for on-demand: theirs is the fastest, the H100, not the L4 (on
    # which the capacity rule used to leave the job, as "on demand" already).
    opts = options(
        [L4_H, 31_000.0, 30_000.0], [L4_H, 18_000.0, 17_000.0], [0.8, 12.0, 4.0], [True, True, False]
    )
    seen = np.ones((3, 48))
    seen[2] = np.r_[np.tile([1.0, 0.0], 12), np.zeros(24)]
    learnt = Availability(np.array([False, False, True]), seen, 1.0, np.array([False, False, True]))
    opts = dataclasses.replace(opts, availability=learnt)
    state = job(0, 5.5)
    rnd = Round.build(state, opts, opts.position(state.option), np.array([-1]), Guardrails())
    assert [(m.to, m.reason) for m in apply_rules(rnd, RULES)] == [(1, "deadline")]
