"""Column generation is exact: on contended random instances it equals the full LP (scipy's
linprog, an independent dense formulation), for explicit and generated options alike; its
restricted masters (the policies' cvxpy problems, run warm on cvxpy's data) equal cvxpy's own
``Problem.solve(solver=cp.HIGHS)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import cvxpy as cp
import numpy as np
import pytest
from scipy.optimize import linprog

from spotopt.errors import InfeasibleError
from spotopt.policies import columns, max_throughput, min_makespan_budget
from spotopt.policies.base import SEED_CHEAPEST, Allocation, PolicyInput, get_policy
from spotopt.policies.infeasible import elastic_formulation
from spotopt.policies.min_cost import cost_formulation
from spotopt.policies.options import GeneratedOptions, price, seed_columns

Array = np.ndarray[Any, Any]


def contended(seed: int, n_jobs: int = 40, n_markets: int = 90) -> dict[str, Any]:
    """Jobs × markets where the cheap markets are small and wanted by everyone.

    Throughput per (job, GPU model) with per-market losses, so each job ranks markets its own
    way; cheap spot markets hold a few instances, dear ones are unlimited; deadlines 1.3-3x the
    fastest time. The seed (a few cheap options per job) cannot be the optimum here.
    """
    rng = np.random.default_rng(seed)
    gpu = rng.integers(0, 6, n_markets)
    speed = rng.uniform(0.5, 1.5, (n_jobs, 1)) * (1 + 0.5 * np.arange(6)) ** rng.uniform(
        0.5, 1.5, (n_jobs, 1)
    )
    tput = speed[:, gpu] * rng.uniform(0.7, 1.0, (n_jobs, n_markets)) * 100
    tput[rng.random((n_jobs, n_markets)) < 0.1] = 0.0  # filtered out
    tput[:, 0] = speed[:, 5] * 100  # one unlimited fast market: every job can run
    gpu[0] = 5
    spot = rng.random(n_markets) < 0.7
    spot[0] = False
    share = rng.choice([1.0, 0.5, 0.25], n_markets)
    usd = (0.4 + 0.4 * gpu) * np.where(spot, rng.uniform(0.2, 0.6, n_markets), 1.0) * share
    capacity = np.where(spot, rng.integers(1, 3, n_markets).astype(float), np.inf)
    work = rng.uniform(500, 5000, n_jobs)
    fastest = work / tput.max(axis=1)
    horizon = float(fastest.max() * 3)
    return {
        "tput": tput,
        "usd": usd[None, :],
        "share": share[None, :],
        "work": work,
        "deadline": fastest * rng.uniform(1.3, 3.0, n_jobs),
        "capacity": capacity * horizon / (n_jobs * 4),
        "horizon": horizon,
    }


def explicit(d: dict[str, Any], **kw: Any) -> PolicyInput:
    return PolicyInput.from_dense(
        d["tput"],
        np.broadcast_to(d["usd"], d["tput"].shape),
        work_steps=d["work"],
        deadline_hours=d["deadline"],
        capacity=d["capacity"],
        instances_per_hour=np.broadcast_to(d["share"], d["tput"].shape),
        horizon_hours=d["horizon"],
        **kw,
    )


def generated(d: dict[str, Any], **kw: Any) -> PolicyInput:
    def block(lo: int, hi: int) -> tuple[Array, Array, Array]:
        return d["tput"][lo:hi], d["usd"], d["share"]

    gen = GeneratedOptions(len(d["work"]), d["tput"].shape[1], block)
    return PolicyInput.from_generator(
        gen, d["work"], capacity=d["capacity"], deadline_hours=d["deadline"], horizon_hours=d["horizon"], **kw
    )


def dense_rows(inp: PolicyInput) -> tuple[Array, Array, Array, Array]:
    """Work (as fractions), wall and capacity rows of an explicit input, dense."""
    n, e = inp.n_options, np.arange(inp.n_options)
    a_work = np.zeros((inp.n_jobs, n))
    a_work[inp.job, e] = inp.steps_per_hour / inp.work_steps[inp.job]
    a_wall = np.zeros((inp.n_jobs, n))
    a_wall[inp.job, e] = 1.0
    finite = np.isfinite(inp.capacity)
    a_cap = np.zeros((inp.n_markets, n))
    a_cap[inp.market, e] = inp.instances_per_hour
    return a_work, a_wall, a_cap[finite], inp.capacity[finite]


def scipy_min_cost(inp: PolicyInput, wall: Array) -> float | None:
    a_work, a_wall, a_cap, cap = dense_rows(inp)
    res = linprog(
        inp.usd_per_hour,
        A_ub=np.vstack([-a_work, a_wall, a_cap]),
        b_ub=np.r_[-np.ones(inp.n_jobs), wall, cap * inp.horizon_hours],
        method="highs",
    )
    return float(res.fun) if res.status == 0 else None


def scipy_max_throughput(inp: PolicyInput) -> float:
    a_work, a_wall, a_cap, cap = dense_rows(inp)
    res = linprog(-a_work.sum(axis=0), A_ub=np.vstack([a_wall, a_cap]), b_ub=np.r_[np.ones(inp.n_jobs), cap])
    return float(-res.fun)


def scipy_makespan(inp: PolicyInput) -> float:
    """min M: work, wall <= min(M, limit), capacity <= cap * M, cost <= budget; variables (h, M)."""
    a_work, a_wall, a_cap, cap = dense_rows(inp)
    n = inp.n_options
    zero = np.zeros((inp.n_jobs, 1))
    a = np.vstack(
        [
            np.hstack([-a_work, zero]),
            np.hstack([a_wall, -np.ones((inp.n_jobs, 1))]),
            np.hstack([a_wall, zero]),
            np.hstack([a_cap, -cap[:, None]]),
            np.r_[inp.usd_per_hour, 0.0][None, :],
        ]
    )
    b = np.r_[
        -np.ones(inp.n_jobs), np.zeros(inp.n_jobs), inp.wall_limit(), np.zeros(len(cap)), inp.budget_usd
    ]
    res = linprog(np.r_[np.zeros(n), 1.0], A_ub=a, b_ub=b)
    assert res.status == 0
    return float(res.fun)


def check_allocation(inp: PolicyInput, alloc: Allocation, wall: Array) -> None:
    """Work done, wall limits and capacity, on the options the hours refer to."""
    opts = alloc.columns if alloc.columns is not None else inp
    assert len(alloc.hours) == opts.n_options
    done = np.bincount(opts.job, weights=alloc.hours * opts.steps_per_hour, minlength=inp.n_jobs)
    assert np.all(done >= inp.work_steps * (1 - 1e-6))
    assert np.all(alloc.wall_hours <= wall * (1 + 1e-6) + 1e-6)
    load = np.bincount(opts.market, weights=alloc.hours * opts.instances_per_hour, minlength=inp.n_markets)
    finite = np.isfinite(inp.capacity)
    assert np.all(load[finite] <= inp.capacity[finite] * inp.horizon_hours * (1 + 1e-6) + 1e-6)


@pytest.mark.parametrize("seed", range(6))
def test_column_generation_equals_full_lp(seed: int) -> None:
    d = contended(seed)
    inp = explicit(d)
    for name, wall in (
        ("min-cost", np.full(inp.n_jobs, inp.horizon_hours)),
        ("min-cost-slo", inp.wall_limit()),
    ):
        expected = scipy_min_cost(inp, wall)
        if expected is None:
            with pytest.raises(InfeasibleError):
                get_policy(name)(generated(d))
            continue
        for source in (inp, generated(d)):
            alloc = get_policy(name)(source)
            assert alloc.total_cost_usd == pytest.approx(expected, rel=1e-7)
            assert alloc.bound is not None and expected * (1 + 1e-9) >= alloc.bound >= expected * (1 - 1e-6)
            check_allocation(source, alloc, wall)


def test_instances_need_pricing_rounds() -> None:
    """The contended instances are not solved by the seed alone: pricing adds columns."""
    inp = explicit(contended(0))
    alloc = get_policy("min-cost-slo")(inp)
    used = np.count_nonzero(alloc.hours)
    assert alloc.rounds >= 2 and used < inp.n_options


def test_generated_equals_explicit_option_for_option() -> None:
    """Same options, two representations: same hours per (job, market), up to LP ties' cost."""
    d = contended(3)
    a = get_policy("min-cost-slo")(explicit(d))
    g = get_policy("min-cost-slo")(generated(d))
    assert g.columns is not None and a.columns is None
    assert g.total_cost_usd == pytest.approx(a.total_cost_usd, rel=1e-9)
    assert g.cost_usd == pytest.approx(a.cost_usd, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("seed", range(3))
def test_max_throughput_and_makespan_equal_full_lp(seed: int) -> None:
    d = contended(10 + seed, n_jobs=25, n_markets=50)
    inp = explicit(d)
    for source in (inp, generated(d)):
        alloc = get_policy("max-throughput")(source)
        assert alloc.objective == pytest.approx(scipy_max_throughput(inp), rel=1e-7)
    cheapest = scipy_min_cost(inp, inp.wall_limit())
    assert cheapest is not None
    budgeted = dataclasses.replace(inp, budget_usd=cheapest * 1.2)
    expected = scipy_makespan(budgeted)
    for source in (budgeted, dataclasses.replace(generated(d), budget_usd=cheapest * 1.2)):
        alloc = get_policy("min-makespan-budget")(source)
        assert alloc.makespan_hours == pytest.approx(expected, rel=1e-6)
        assert alloc.total_cost_usd <= cheapest * 1.2 * (1 + 1e-7)


def test_a_too_small_penalty_only_costs_rounds(monkeypatch: pytest.MonkeyPatch) -> None:
    """Big M far too small: the artificials get used, the feasibility master says the LP is
    feasible, M grows, and the answer is still the full LP's."""
    monkeypatch.setattr(columns, "PENALTY_FACTOR", 1e-9)
    inp = explicit(contended(1))
    expected = scipy_min_cost(inp, inp.wall_limit())
    assert expected is not None
    alloc = get_policy("min-cost-slo")(inp)
    assert alloc.total_cost_usd == pytest.approx(expected, rel=1e-7)


def test_capacity_infeasibility_is_proven_and_explained() -> None:
    d = contended(2, n_jobs=12, n_markets=20)
    d["tput"][:, 0] = 0.0  # no unlimited market left ...
    d["capacity"] = np.where(np.isfinite(d["capacity"]), d["capacity"], 1.0) * 0.05  # ... and little room
    inp = explicit(d, job_names=tuple(f"j{i}" for i in range(12)))
    assert scipy_min_cost(inp, inp.wall_limit()) is None
    for source in (inp, generated(d, job_names=inp.job_names)):
        with pytest.raises(InfeasibleError, match="capacity is too small") as err:
            get_policy("min-cost-slo")(source)
        assert "j0" in str(err.value) or "j1" in str(err.value)


def test_generated_deadline_error_names_the_job_and_market() -> None:
    d = contended(4, n_jobs=5, n_markets=8)
    d["deadline"][2] = d["work"][2] / d["tput"][2].max() / 2  # half its fastest time
    inp = generated(d, job_names=tuple("abcde"), market_names=tuple(f"m{i}" for i in range(8)))
    with pytest.raises(InfeasibleError, match=r"c: needs .* h even on its fastest allowed market \(m\d\)"):
        get_policy("min-cost-slo")(inp)


def test_generated_blocks_span_several_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Blocks of a few jobs (or options) each, as at 10k × 5k: same optimum as one block."""
    d = contended(5)
    whole = get_policy("min-cost-slo")(generated(d)).total_cost_usd
    monkeypatch.setattr("spotopt.policies.options.BLOCK_CELLS", d["tput"].shape[1] * 3)
    for source in (generated(d), explicit(d)):
        assert get_policy("min-cost-slo")(source).total_cost_usd == pytest.approx(whole, rel=1e-9)


def formulations(inp: PolicyInput) -> dict[str, columns.Formulation]:
    """Every LP column generation solves, as its cvxpy formulation."""
    cheapest = scipy_min_cost(inp, inp.wall_limit())
    assert cheapest is not None
    return {
        "min-cost-slo": cost_formulation(inp, inp.wall_limit()),
        "max-throughput": max_throughput.formulation(inp),
        "min-makespan-budget": min_makespan_budget.formulation(inp, cheapest * 1.2),
        "elastic": elastic_formulation(inp, inp.wall_limit() * 0.5),
    }


def restricted_masters(inp: PolicyInput, form: columns.Formulation) -> Iterator[columns.Master]:
    """A master on each job's slowest seed option, solved; then after one round's new options."""
    master = columns.Master(form, "test", penalty=1e4)
    seed = seed_columns(inp.options(), SEED_CHEAPEST)
    slow_first = np.lexsort((seed.steps_per_hour, seed.job))
    master.add(seed.take(slow_first[np.unique(seed.job[slow_first], return_index=True)[1]]))
    yield master
    new, _ = price(inp.options(), master.prices(), columns.ADD_PER_JOB, 1e-9)
    assert master.add(new) > 0
    yield master


@pytest.mark.parametrize("name", ["min-cost-slo", "max-throughput", "min-makespan-budget", "elastic"])
def test_warm_restarts_give_cvxpy_solve_optimum(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The master's own HiGHS run on cvxpy's data (cold, then from the previous basis) has the
    optimum of ``Problem.solve(solver=cp.HIGHS)`` on the same restricted problem."""
    monkeypatch.setattr(columns, "WARM_FRACTION", 1.0)  # every re-solve starts from the basis
    bases = []
    run_highs = columns.run_highs

    def spy(data: dict[str, Any], options: dict[str, Any], basis: Any = None) -> dict[str, Any]:
        bases.append(basis)
        return run_highs(data, options, basis)

    monkeypatch.setattr(columns, "run_highs", spy)
    inp = explicit(contended(6, n_jobs=30, n_markets=60))
    for master in restricted_masters(inp, formulations(inp)[name]):
        objective = master.run()
        reference = master.problem().problem
        reference.solve(solver=cp.HIGHS)
        assert reference.status == cp.OPTIMAL
        assert objective == pytest.approx(reference.value, rel=1e-9, abs=1e-9)
    assert bases[0] is None and bases[1] is not None


@pytest.mark.parametrize("name", ["min-cost-slo", "max-throughput", "min-makespan-budget", "elastic"])
def test_formulation_and_pricing_agree_on_the_column_shape(name: str) -> None:
    """Pricing reads the cvxpy constraints' duals with the column shape the formulation declares:
    at a restricted optimum every master option prices >= 0 and every used one prices 0
    (a wrong dual sign or objective weight breaks this)."""
    inp = explicit(contended(7, n_jobs=30, n_markets=60))
    for master in restricted_masters(inp, formulations(inp)[name]):
        master.run()
        p = master.prices()
        cols, hours, _ = master.solution()
        terms = np.array(
            [
                p.cost_weight * cols.usd_per_hour,
                p.rate_weight[cols.job] / p.work_steps[cols.job] * cols.steps_per_hour,
                -p.wall[cols.job],
                -p.cap[cols.market] * cols.instances_per_hour,
            ]
        )
        rc, scale = terms.sum(axis=0), float(np.abs(terms).sum(axis=0).max())
        assert scale > 0 and rc.min() >= -1e-6 * scale
        assert np.abs(rc[hours > 1e-6]).max() <= 1e-6 * scale
