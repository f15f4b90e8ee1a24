"""The ``spotopt`` decider's option frontier: it drops only dominated options and changes nothing.

Random histories over two clouds and three regions with many look-alike markets (so that most
options are dominated), jobs with and without deadlines, datasets and preemptions: the decider
run on the frontier and on every option must make the very same decisions.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest

from spotopt.db.queries import Quote
from spotopt.decide.egress import transfer_matrix
from spotopt.decide.forecast import forecast
from spotopt.decide.guardrails import Guardrails
from spotopt.jobspec import parse_jobs
from spotopt.whatif.engine import RunResult, simulate
from spotopt.whatif.frontier import OptionFrontier
from spotopt.whatif.jobs import SimJobs, build_jobs
from spotopt.whatif.preemptions import model_preemptions
from spotopt.whatif.spotopt_decider import SpotoptDecider
from spotopt.whatif.timeline import Timeline, build_timeline

T0 = datetime(2021, 3, 1, tzinfo=UTC)
TYPES = [
    ("aws", "p3.2xlarge", "V100-16GB", 1),
    ("aws", "p2.xlarge", "K80", 1),
    ("aws", "p3.8xlarge", "V100-16GB", 4),
    ("gcp", "n1-v100-1", "V100-16GB", 1),
    ("gcp", "n1-t4-1", "T4", 1),
]
REGIONS = {"aws": ("us-east-1", "us-west-2"), "gcp": ("us-central1",)}


def history(rng: np.random.Generator, hours: int) -> list[Quote]:
    """Per type and region: an on-demand market and three spot zones with changing prices; a
    third of the spot zones opens only later (no price before its first point)."""
    quotes = []
    mid = 0
    for cloud, itype, gpu, count in TYPES:
        for region in REGIONS[cloud]:
            base = count * rng.uniform(0.8, 3.0)
            mid += 1
            quotes.append(Quote(mid, cloud, region, None, itype, "on-demand", gpu, count, base, T0, "t"))
            for zone in "abc":
                mid += 1
                opens = 0 if rng.random() < 0.67 else int(rng.integers(1, hours // 2))
                changes = sorted({opens, *rng.integers(opens, hours, int(rng.integers(1, 12))).tolist()})
                for h in changes:
                    price = float(base * rng.uniform(0.2, 0.9))
                    when = T0 + timedelta(hours=h)
                    quotes.append(
                        Quote(
                            mid, cloud, region, f"{region}{zone}", itype, "spot", gpu, count, price, when, "t"
                        )
                    )
    return quotes


def scenario(seed: int) -> tuple[Timeline, SimJobs, Any, Any]:
    rng = np.random.default_rng(seed)
    hours = 96
    tl = build_timeline(history(rng, hours), T0, hours, 1.0)
    tl.rate[~tl.on_demand] = rng.uniform(0.01, 0.5, int((~tl.on_demand).sum()))
    jobs = [
        {
            "name": f"j{k}",
            "throughput": {
                "K80": 1.0,
                "V100": float(rng.uniform(2.0, 9.0)),
                "T4": float(rng.uniform(1.0, 4.0)),
            },
            "work": {"gpu_days": float(rng.choice([0.25, 0.5, 1.0])), "gpu": "V100"},
            "restart_s": int(rng.integers(0, 900)),
            "checkpoint_s": int(rng.integers(0, 120)),
            "checkpoint_gb": float(rng.uniform(0, 5)),
            **({"deadline": f"{int(rng.integers(14, 40))}h"} if k % 2 else {}),
            **({"dataset": {"gb": 100, "cloud": "aws", "region": "us-west-2"}} if k == 2 else {}),
        }
        for k in range(4)
    ]
    sim = build_jobs(parse_jobs({"jobs": jobs}), tl)
    return tl, sim, model_preemptions(tl, seed), transfer_matrix(tl.locations, T0)


def run(tl: Timeline, sim: SimJobs, events: Any, transfer: Any, narrow: bool, guard: Guardrails) -> RunResult:
    return simulate(tl, sim, events, transfer, SpotoptDecider(tl, sim, transfer, guard, narrow=narrow), 0)


GUARDS = [
    Guardrails(),
    Guardrails(move_margin=0.0, min_dwell_h=0.0, max_moves_per_tick=1),
    Guardrails(max_usd_per_hour=1.5, budget_usd=400.0),
]


@pytest.mark.parametrize("seed", range(8))
def test_narrowed_and_full_runs_decide_identically(seed: int) -> None:
    tl, sim, events, transfer = scenario(seed)
    guard = GUARDS[seed % len(GUARDS)]
    narrowed = run(tl, sim, events, transfer, True, guard)
    full = run(tl, sim, events, transfer, False, guard)
    assert np.array_equal(narrowed.trace, full.trace)
    assert np.array_equal(narrowed.cost_usd, full.cost_usd)
    assert np.array_equal(narrowed.finish_h, full.finish_h, equal_nan=True)
    assert np.array_equal(narrowed.moves, full.moves)
    assert (narrowed.trace >= 0).any()
    floor = forecast(tl.price, tl.tick_h)[0]
    assert len(OptionFrontier(tl, sim, sim.expected_steps_per_hour, floor).candidates(0)) < sim.n_options


@pytest.mark.parametrize("window", [1, 5, 24])
def test_every_dropped_option_has_a_strictly_better_one_in_its_region(window: int) -> None:
    tl, sim, _, _ = scenario(11)
    speed = sim.expected_steps_per_hour
    floor = forecast(tl.price, tl.tick_h)[0]
    frontier = OptionFrontier(tl, sim, speed, floor, window=window)
    dropped_any = False
    for t in range(tl.n_ticks):
        kept = frontier.candidates(t)
        dropped = np.setdiff1d(np.arange(sim.n_options), kept)
        usd = tl.price[sim.market, t] / sim.slots
        base = floor[sim.market, t] / sim.slots
        first = t - t % window
        prices = tl.price[sim.market, first : first + window] / sim.slots[:, None]
        for e in dropped.tolist():
            if not np.isfinite(prices[e]).any():
                continue  # no price in the whole window: never a choice
            dropped_any = True
            rivals = (
                (sim.job == sim.job[e])
                & (sim.location == sim.location[e])
                & (speed >= speed[e])
                & np.isin(np.arange(sim.n_options), kept)
                & (sim.on_demand | ~sim.on_demand[e])
            )
            assert (rivals & (usd < base[e])).any() or not np.isfinite(usd[e]), (t, e)
        # The dominator named for each option dropped for another is kept and dominates it.
        lost, by = frontier.dominators(t)
        assert np.isin(lost, dropped).all() and np.isin(by, kept).all()
        assert (sim.job[by] == sim.job[lost]).all() and (sim.location[by] == sim.location[lost]).all()
        assert (speed[by] >= speed[lost]).all() and (sim.on_demand[by] | ~sim.on_demand[lost]).all()
        now = np.isfinite(usd[lost])
        assert (usd[by][now] < base[lost][now]).all()
    assert dropped_any


class HiddenFuture:
    """The decider seeing, at tick ``t``, a timeline whose prices after ``t`` are unknown (NaN)."""

    def __init__(self, tl: Timeline, sim: SimJobs, transfer: Any, guard: Guardrails) -> None:
        self.full = tl.price
        self.masked = Timeline(**{**tl.__dict__, "price": np.full_like(tl.price, np.nan)})
        self.decider = SpotoptDecider(self.masked, sim, transfer, guard, narrow=False)

    def __call__(self, t: int, st: Any) -> Any:
        self.masked.price[:, t] = self.full[:, t]
        self.decider.baseline, self.decider.revert_h = forecast(self.masked.price, self.masked.tick_h)
        return self.decider(t, st)


@pytest.mark.parametrize("seed", range(3))
def test_decisions_are_the_same_with_the_future_hidden(seed: int) -> None:
    """The frontier reads its window's future prices; the decisions must not depend on them."""
    tl, sim, events, transfer = scenario(seed)
    guard = GUARDS[seed % len(GUARDS)]
    seeing = run(tl, sim, events, transfer, True, guard)
    hidden = simulate(tl, sim, events, transfer, HiddenFuture(tl, sim, transfer, guard), 0)
    assert np.array_equal(seeing.trace, hidden.trace)
    assert np.array_equal(seeing.cost_usd, hidden.cost_usd)
    assert (seeing.moves > 0).any() or (seeing.trace >= 0).any()


class Recording(SpotoptDecider):
    """The decider, recording per tick the options it hands to the core and the rates then."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.handed: list[tuple[int, Any, Any]] = []

    def options(self, t: int, sub: Any, rates: Any = None) -> Any:
        self.handed.append((t, sub, rates))
        return super().options(t, sub, rates)


def test_every_option_left_out_is_dominated_at_the_learnt_rates() -> None:
    """The decider learns preemption rates as it goes (the scenarios' preemptions move them):
    every option it leaves out has one it hands over in the same job and region that is at least
    as fast at the rates of that tick and cheaper now than the left-out option's baseline. In
    this seed a dropped option becomes faster than the option the frontier dropped it for, and
    no other kept option dominates it: the decider must hand it back."""
    tl, sim, events, transfer = scenario(7)
    decider = Recording(tl, sim, transfer, GUARDS[7 % len(GUARDS)])
    simulate(tl, sim, events, transfer, decider, 0)
    floor = forecast(tl.price, tl.tick_h)[0]
    every = np.arange(sim.n_options)
    learnt = False
    for t, handed, rates in decider.handed:
        speed = decider.speeds(every, rates)
        learnt |= bool((speed != sim.expected_steps_per_hour).any())
        usd = tl.price[sim.market, t] / sim.slots
        base = floor[sim.market, t] / sim.slots
        given = np.isin(every, handed)
        for e in np.flatnonzero(~given & np.isfinite(usd)).tolist():
            rivals = (
                given
                & (sim.job == sim.job[e])
                & (sim.location == sim.location[e])
                & (speed >= speed[e])
                & (sim.on_demand | ~sim.on_demand[e])
            )
            assert (rivals & (usd < base[e])).any(), (t, e)
    assert learnt
