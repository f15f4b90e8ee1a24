"""Policies: hand-computed optima, an independent scipy formulation, invariants, pruning exactness."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.optimize import linprog

from spotopt.errors import InfeasibleError, InputError
from spotopt.policies.base import PolicyInput, get_policy, policy_names
from spotopt.policies.prune import prune_dominated, select_options

POLICIES = ["min-cost", "min-cost-slo", "min-makespan-budget", "max-throughput"]


def tiny() -> PolicyInput:
    # two jobs, a slow cheap market and a fast dear one (steps/hour, $/hour)
    return PolicyInput.from_dense(
        [[10.0, 40.0], [5.0, 30.0]], [1.0, 8.0], work_steps=[100, 60], deadline_hours=[5, 100]
    )


def test_registry_names_and_did_you_mean() -> None:
    assert policy_names() == sorted(POLICIES)
    with pytest.raises(InputError, match="did you mean 'min-cost'"):
        get_policy("min-cots")


def test_min_cost_hand_optimum() -> None:
    alloc = get_policy("min-cost")(tiny())
    # $/step: job0 0.1 vs 0.2, job1 0.2 vs 0.267: both on market 0
    assert alloc.total_cost_usd == pytest.approx(10 + 12)
    assert alloc.wall_hours == pytest.approx([10, 12])


def test_min_cost_slo_hand_optimum() -> None:
    alloc = get_policy("min-cost-slo")(tiny())
    # job0 must finish 100 steps in 5 h: h0 + h1 = 5, 10 h0 + 40 h1 = 100 -> h1 = 5/3, h0 = 10/3
    assert alloc.hours[:2] == pytest.approx([10 / 3, 5 / 3], rel=1e-6)
    assert alloc.share[:2] == pytest.approx([2 / 3, 1 / 3], rel=1e-6)
    assert alloc.cost_usd[0] == pytest.approx(10 / 3 + 8 * 5 / 3, rel=1e-6)
    assert alloc.wall_hours[0] == pytest.approx(5)


def test_min_makespan_budget_hand_optimum() -> None:
    inp = dataclasses.replace(tiny(), budget_usd=30.0, deadline_hours=np.array([np.inf, np.inf]))
    alloc = get_policy("min-makespan-budget")(inp)
    # Both jobs at makespan M: job0 costs (at wall M) 10/3*(40M... solved by hand:
    # job0: h0+h1=M, 10h0+40h1=100 -> h1=(100-10M)/30, cost0 = M + 7h1
    # job1: g0+g1=M, 5g0+30g1=60  -> g1=(60-5M)/25,  cost1 = M + 7g1
    # cost0 + cost1 = 30 -> 2M + 7(100-10M)/30 + 7(60-5M)/25 = 30
    m = (30 - 700 / 30 - 420 / 25) / (2 - 70 / 30 - 35 / 25)
    assert alloc.makespan_hours == pytest.approx(m, rel=1e-6)
    assert alloc.total_cost_usd == pytest.approx(30, rel=1e-6)


def test_max_throughput_hand_optimum() -> None:
    alloc = get_policy("max-throughput")(tiny())
    assert alloc.share[[1, 3]] == pytest.approx([1, 1])
    assert alloc.wall_hours == pytest.approx([2.5, 2.0])


def test_budget_required_and_too_small() -> None:
    with pytest.raises(InputError, match="--budget"):
        get_policy("min-makespan-budget")(tiny())
    with pytest.raises(InfeasibleError, match=r"short by \$"):
        get_policy("min-makespan-budget")(dataclasses.replace(tiny(), budget_usd=5.0))


def test_infeasible_deadline_names_each_job_and_by_how_much() -> None:
    inp = dataclasses.replace(tiny(), deadline_hours=np.array([2.0, 1.0]))
    with pytest.raises(InfeasibleError) as err:
        get_policy("min-cost-slo")(inp)
    text = str(err.value)
    assert "job 0: needs 2.5 h" in text and "misses by 0.5 h" in text
    assert "job 1: needs 2.0 h" in text and "misses by 1.0 h" in text


def test_infeasible_capacity_names_jobs_and_shortfall() -> None:
    inp = PolicyInput.from_dense(
        [[10.0, 40.0], [5.0, 30.0]],
        [1.0, 8.0],
        work_steps=[100, 60],
        deadline_hours=[4, 4],
        capacity=[0, 1.0],
        horizon_hours=4,
        job_names=("a", "b"),
    )
    with pytest.raises(InfeasibleError, match=r"need 0\.5 h more") as err:
        get_policy("min-cost-slo")(inp)
    assert "a: up to 0.5 h" in str(err.value) and "b: up to 0.5 h" in str(err.value)


def test_no_market_for_a_job_is_named() -> None:
    inp = PolicyInput.from_dense(
        [[10.0, 0.0], [0.0, 0.0]], [1.0, 1.0], work_steps=[1, 1], job_names=("x", "y")
    )
    with pytest.raises(InfeasibleError, match="no market can run y"):
        get_policy("min-cost")(inp)


def gavel_proxy_cost(inp: PolicyInput) -> float:
    """Gavel's cost proxy: maximise sum T/c·X (X = time shares), then price what it picked."""
    ratio = inp.steps_per_hour / inp.usd_per_hour
    a_job = np.zeros((inp.n_jobs, inp.n_options))
    a_job[inp.job, np.arange(inp.n_options)] = 1
    a_cap = np.zeros((inp.n_markets, inp.n_options))
    a_cap[inp.market, np.arange(inp.n_options)] = inp.instances_per_hour
    res = linprog(-ratio, A_ub=np.vstack([a_job, a_cap]), b_ub=np.r_[np.ones(inp.n_jobs), inp.capacity])
    x = res.x
    rate = np.bincount(inp.job, weights=x * inp.steps_per_hour, minlength=inp.n_jobs)
    wall = inp.work_steps / rate
    return float(np.sum(x * inp.usd_per_hour * wall[inp.job]))


def test_gavel_proxy_differs_from_true_min_cost() -> None:
    # market A ($1/h) has one instance for 12 h, market B ($2/h) is unlimited.
    inp = PolicyInput.from_dense(
        [[10.0, 10.0], [12.0, 12.0]], [1.0, 2.0], work_steps=[120, 120], capacity=[1, 100], horizon_hours=12
    )
    exact = get_policy("min-cost")(inp)
    assert exact.total_cost_usd == pytest.approx(32.0)  # job 0 on A (12 h), job 1 on B (10 h)
    assert gavel_proxy_cost(inp) == pytest.approx(34.0)  # the proxy gives A to the job with higher T/c


def random_input(rng: np.random.Generator, n_jobs: int, n_markets: int, slack: float = 3.0) -> PolicyInput:
    tput = rng.uniform(5, 50, (n_jobs, n_markets)) * (rng.random((n_jobs, n_markets)) < 0.7)
    tput[np.arange(n_jobs), rng.integers(0, n_markets, n_jobs)] = rng.uniform(5, 50, n_jobs)
    price = rng.uniform(0.5, 10, n_markets)
    share = rng.choice([1.0, 0.5, 0.25], n_markets)
    work = rng.uniform(100, 1000, n_jobs)
    fastest = work / tput.max(axis=1)
    capacity = np.where(rng.random(n_markets) < 0.5, np.inf, rng.integers(1, 4, n_markets).astype(float))
    return PolicyInput.from_dense(
        tput,
        price[None, :] * share[None, :],
        work_steps=work,
        deadline_hours=fastest * rng.uniform(1.2, slack, n_jobs),
        capacity=capacity,
        instances_per_hour=share[None, :],
        horizon_hours=float(fastest.max() * 4 * n_jobs),
    )


def scipy_hours_lp(inp: PolicyInput, wall: np.ndarray) -> float | None:
    """Independent dense formulation of min-cost with wall limits, solved by scipy's linprog."""
    n = inp.n_options
    a_work = np.zeros((inp.n_jobs, n))
    a_work[inp.job, np.arange(n)] = -inp.steps_per_hour
    a_wall = np.zeros((inp.n_jobs, n))
    a_wall[inp.job, np.arange(n)] = 1
    a_cap = np.zeros((inp.n_markets, n))
    a_cap[inp.market, np.arange(n)] = inp.instances_per_hour
    finite = np.isfinite(inp.capacity)
    res = linprog(
        inp.usd_per_hour,
        A_ub=np.vstack([a_work, a_wall, a_cap[finite]]),
        b_ub=np.r_[-inp.work_steps, wall, inp.capacity[finite] * inp.horizon_hours],
    )
    return float(res.fun) if res.status == 0 else None


@pytest.mark.parametrize("seed", range(8))
def test_random_instances_match_scipy_and_keep_invariants(seed: int) -> None:
    rng = np.random.default_rng(seed)
    inp = random_input(rng, int(rng.integers(2, 7)), int(rng.integers(2, 6)))
    limits = (("min-cost", np.full(inp.n_jobs, inp.horizon_hours)), ("min-cost-slo", inp.wall_limit()))
    for name, wall in limits:
        expected = scipy_hours_lp(inp, wall)
        if expected is None:
            with pytest.raises(InfeasibleError):
                get_policy(name)(inp)
            continue
        alloc = get_policy(name)(inp)
        assert alloc.total_cost_usd == pytest.approx(expected, rel=1e-6, abs=1e-6)
        check_invariants(inp, alloc, wall)
        # never dearer than a feasible alternative: every job alone on its cheapest-per-step option
        if name == "min-cost" and np.all(np.isinf(inp.capacity)):
            per_step = inp.usd_per_hour / inp.steps_per_hour
            best = np.full(inp.n_jobs, np.inf)
            np.minimum.at(best, inp.job, per_step)
            assert alloc.total_cost_usd <= float(np.sum(best * inp.work_steps)) + 1e-6


def check_invariants(inp: PolicyInput, alloc, wall: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    assert np.all((alloc.share >= 0) & (alloc.share <= 1 + 1e-9))
    per_job = np.bincount(inp.job, weights=alloc.share, minlength=inp.n_jobs)
    assert np.all(per_job <= 1 + 1e-6)
    done = np.bincount(inp.job, weights=alloc.hours * inp.steps_per_hour, minlength=inp.n_jobs)
    assert np.all(done >= inp.work_steps * (1 - 1e-6))
    assert np.all(alloc.wall_hours <= wall * (1 + 1e-6) + 1e-6)
    load = np.bincount(inp.market, weights=alloc.hours * inp.instances_per_hour, minlength=inp.n_markets)
    finite = np.isfinite(inp.capacity)
    assert np.all(load[finite] <= inp.capacity[finite] * inp.horizon_hours * (1 + 1e-6) + 1e-6)


@pytest.mark.parametrize("seed", range(5))
def test_makespan_budget_is_monotone_and_within_budget(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    inp = dataclasses.replace(random_input(rng, 4, 4), deadline_hours=np.full(4, np.inf))
    cheapest = get_policy("min-cost")(inp).total_cost_usd
    spans = []
    for factor in (1.05, 1.5, 3.0):
        alloc = get_policy("min-makespan-budget")(dataclasses.replace(inp, budget_usd=cheapest * factor))
        assert alloc.total_cost_usd <= cheapest * factor * (1 + 1e-6)
        spans.append(alloc.makespan_hours)
    assert spans[0] >= spans[1] - 1e-6 >= spans[2] - 2e-6


@pytest.mark.parametrize("seed", range(6))
def test_pruning_is_exact(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    inp = random_input(rng, 6, 12)
    keep = prune_dominated(inp)
    pruned = select_options(inp, keep)
    for name in ("min-cost", "min-cost-slo"):
        try:
            full = get_policy(name)(inp).total_cost_usd
        except InfeasibleError:
            with pytest.raises(InfeasibleError):
                get_policy(name)(pruned)
            continue
        assert get_policy(name)(pruned).total_cost_usd == pytest.approx(full, rel=1e-6, abs=1e-6)


def test_pruning_drops_dominated_options_with_unlimited_capacity() -> None:
    # option 1 is dearer per step and slower than option 0 -> pruned; option 2 is faster (and dearer) -> kept
    inp = PolicyInput.from_dense([[10.0, 8.0, 20.0]], [1.0, 2.0, 6.0], work_steps=[10])
    assert prune_dominated(inp).tolist() == [True, False, True]
    capped = dataclasses.replace(inp, capacity=np.array([0.5, np.inf, np.inf]))
    assert prune_dominated(capped).tolist() == [True, True, True]  # a small dominator cannot prune
