"""What every policy shares: the array input, the allocation it returns, the registry, the solver.

A policy is a registered pure function ``PolicyInput -> Allocation``: arrays in, arrays out, no
I/O, no clock, no prints. The what-if engine calls the same functions every simulated hour, so
everything here is vectorised and built with ``scipy.sparse``.

**Formulation (shared by the cost policies).** The decision variables are *job-hours*
``h[e] >= 0`` for every *option* ``e`` = (job, market, GPUs per job). An option has an effective
throughput ``steps_per_hour[e]`` (already discounted for preemption loss), a cost
``usd_per_hour[e]`` of one job-hour (a packed slot costs the instance price divided by the
slots per instance) and ``instances_per_hour[e]`` instance-hours consumed per job-hour. Then

- work:      ``sum_e T[e] h[e] >= W[j]``                   (every job finishes its steps)
- wall time: ``sum_e h[e] <= D[j]``                       (a job runs on one market at a time,
  so its hours add up to its wall-clock time; ``D`` is the deadline, capped by the horizon)
- capacity:  ``sum_e s[e] h[e] <= cap[m] * H``             (instance-hours a market can sell)
- cost:      ``sum_e c[e] h[e]``                          (exact and linear)

Minimising cost in these variables is the Charnes–Cooper transform of the per-job
linear-fractional program ``min (c·x)/(T·x)`` over time shares ``x``: with
``h = x * W / (T·x)`` the fraction becomes linear, so one LP is exact. Shares follow as
``h[e] / sum_e h[e]`` per job.

Where it is a relaxation: time-sharing between markets is free here (no restart or checkpoint
transfer on a move; the planner and what-if engine add those), a packed slot is priced as if
the instance's other slots are used, and capacity is aggregated over the horizon (by the
preemptive open-shop argument, job totals ``<= D`` and market totals ``<= cap * H`` can be
scheduled without overlap when moves cost nothing).

**Written in cvxpy, solved at scale.** Each policy module writes its LP in cvxpy, vectorised
over a given set of options (``policies.columns.Formulation``: ``h = cp.Variable(n,
nonneg=True)``, constraints ``A_work @ h >= 1``, ``A_wall @ h <= D``, ``A_cap @ h <= cap * H``
with ``scipy.sparse`` matrices built once per set), solved by HiGHS (pinned). Every policy's
LP has one column per option and the same column shape, so all of them are solved by exact
column generation (``policies.columns``): the policy's cvxpy problem over a small restricted
set of options, every option priced in numpy with its constraints' ``dual_value``, the ones
with negative reduced cost added, until none is left; the result is the optimum over *all*
options. Options are explicit arrays (``PolicyInput``'s) or generated block by block from
job × market matrices (``PolicyInput.from_generator``), so 10k jobs × 5k markets never exist
as one array.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from spotopt.errors import InfeasibleError, PolicyError
from spotopt.policies.options import (
    Array,
    ExplicitOptions,
    GeneratedOptions,
    OptionSource,
    job_best,
    seed_columns,
)
from spotopt.registry import Registry

if TYPE_CHECKING:
    from spotopt.policies.columns import Formulation, Result

SOLVER = "HIGHS"
"""Pinned LP solver, ``cvxpy.HIGHS``: results must not depend on what else is installed. (cvxpy itself
is imported only when a policy solves: ``spotopt`` commands that do not plan start without it.)"""


@dataclass(frozen=True)
class PolicyInput:
    """A planning problem as arrays. ``E`` options, ``J`` jobs, ``M`` markets.

    Options (length ``E``): ``job``, ``market`` (indices), ``steps_per_hour`` (> 0),
    ``usd_per_hour`` (>= 0, per job-hour), ``instances_per_hour`` (> 0).
    Jobs (length ``J``): ``work_steps`` (> 0), ``deadline_hours`` (``inf`` = none).
    Markets (length ``M``): ``capacity`` in instances at once (``inf`` = unlimited).
    ``horizon_hours`` bounds every job's wall time; ``budget_usd`` is used by budgeted policies.
    ``job_names`` and ``market_names`` only make error messages readable.

    ``generated`` (from ``from_generator``) replaces the option arrays, which are then empty:
    the options are every (job, market) pair it generates, and the policy's ``Allocation``
    carries in ``columns`` the explicit options its hours refer to.
    """

    job: Array
    market: Array
    steps_per_hour: Array
    usd_per_hour: Array
    instances_per_hour: Array
    work_steps: Array
    deadline_hours: Array
    capacity: Array
    horizon_hours: float = 720.0
    budget_usd: float | None = None
    job_names: tuple[str, ...] = ()
    market_names: tuple[str, ...] = ()
    generated: GeneratedOptions | None = None

    def __post_init__(self) -> None:
        n_opt = len(self.job)
        if self.generated is not None and (
            n_opt or (self.generated.n_jobs, self.generated.n_markets) != (self.n_jobs, self.n_markets)
        ):
            raise PolicyError("PolicyInput.generated needs empty option arrays and the same jobs and markets")
        for name in ("market", "steps_per_hour", "usd_per_hour", "instances_per_hour"):
            if len(getattr(self, name)) != n_opt:
                raise PolicyError(
                    f"PolicyInput.{name} has {len(getattr(self, name))} entries, job has {n_opt}"
                )
        if len(self.deadline_hours) != len(self.work_steps):
            raise PolicyError("PolicyInput.deadline_hours and work_steps differ in length")
        if n_opt and (self.job.max() >= self.n_jobs or self.market.max() >= self.n_markets):
            raise PolicyError("PolicyInput option refers to a job or market index out of range")
        if np.any(self.steps_per_hour <= 0) or np.any(self.usd_per_hour < 0):
            raise PolicyError("PolicyInput needs steps_per_hour > 0 and usd_per_hour >= 0 on every option")
        if np.any(self.work_steps <= 0):
            raise PolicyError("PolicyInput needs work_steps > 0 for every job")

    @property
    def n_jobs(self) -> int:
        return len(self.work_steps)

    @property
    def n_markets(self) -> int:
        return len(self.capacity)

    @property
    def n_options(self) -> int:
        return len(self.job)

    def options(self) -> OptionSource:
        """Every option, block by block (explicit arrays or the generator)."""
        if self.generated is not None:
            return self.generated
        return ExplicitOptions(
            self.job,
            self.market,
            self.steps_per_hour,
            self.usd_per_hour,
            self.instances_per_hour,
            self.n_markets,
        )

    def with_options(self, job: Array, market: Array, tput: Array, usd: Array, share: Array) -> PolicyInput:
        """The same jobs and markets with these explicit options."""
        return dataclasses.replace(
            self,
            job=job,
            market=market,
            steps_per_hour=tput,
            usd_per_hour=usd,
            instances_per_hour=share,
            generated=None,
        )

    def job_name(self, j: int) -> str:
        return self.job_names[j] if j < len(self.job_names) else f"job {j}"

    def market_name(self, m: int) -> str:
        return self.market_names[m] if m < len(self.market_names) else f"market {m}"

    def wall_limit(self) -> Array:
        """Per job: the deadline, capped by the planning horizon."""
        return np.minimum(self.deadline_hours, self.horizon_hours)

    @classmethod
    def from_dense(
        cls,
        steps_per_hour: Array,
        usd_per_hour: Array,
        work_steps: Array,
        capacity: Array | None = None,
        deadline_hours: Array | None = None,
        instances_per_hour: Array | None = None,
        **kwargs: Any,
    ) -> PolicyInput:
        """Build from J×M matrices (tests, small cases); a throughput <= 0 or NaN means "cannot run"."""
        tput = np.asarray(steps_per_hour, dtype=float)
        cost = np.broadcast_to(np.asarray(usd_per_hour, dtype=float), tput.shape)
        jobs, markets = np.nonzero(np.nan_to_num(tput, nan=0.0) > 0)
        share = (
            np.ones(len(jobs))
            if instances_per_hour is None
            else np.broadcast_to(np.asarray(instances_per_hour, dtype=float), tput.shape)[jobs, markets]
        )
        n_jobs, n_markets = tput.shape
        return cls(
            job=jobs,
            market=markets,
            steps_per_hour=tput[jobs, markets],
            usd_per_hour=cost[jobs, markets],
            instances_per_hour=share,
            work_steps=np.asarray(work_steps, dtype=float),
            deadline_hours=np.full(n_jobs, np.inf)
            if deadline_hours is None
            else np.asarray(deadline_hours, float),
            capacity=np.full(n_markets, np.inf) if capacity is None else np.asarray(capacity, dtype=float),
            **kwargs,
        )

    @classmethod
    def from_generator(
        cls,
        generated: GeneratedOptions,
        work_steps: Array,
        capacity: Array | None = None,
        deadline_hours: Array | None = None,
        **kwargs: Any,
    ) -> PolicyInput:
        """Options generated block by block (see ``GeneratedOptions``) instead of explicit arrays."""
        empty_i, empty_f = np.zeros(0, dtype=np.int64), np.zeros(0)
        return cls(
            job=empty_i,
            market=empty_i,
            steps_per_hour=empty_f,
            usd_per_hour=empty_f,
            instances_per_hour=empty_f,
            work_steps=np.asarray(work_steps, dtype=float),
            deadline_hours=np.full(generated.n_jobs, np.inf)
            if deadline_hours is None
            else np.asarray(deadline_hours, float),
            capacity=np.full(generated.n_markets, np.inf)
            if capacity is None
            else np.asarray(capacity, dtype=float),
            generated=generated,
            **kwargs,
        )


@dataclass(frozen=True)
class Allocation:
    """What a policy decided.

    ``hours[e]``: job-hours on option ``e``; ``share[e]``: fraction of its job's wall time on
    ``e`` (a job's shares sum to 1 if it runs, 0 if it gets nothing). Per job: ``wall_hours``
    (time to finish running continuously, ``inf`` if it never finishes) and ``cost_usd``.
    ``status`` is the solver's status (``optimal`` for every allocation returned).
    ``columns``: for a generated input, the explicit options ``hours`` and ``share`` index
    (for an explicit input they index its own options). ``bound``: a proven lower bound on
    the optimum over all options (cost policies), from the last pricing round; ``rounds``:
    how many master solves column generation needed.
    """

    policy: str
    status: str
    hours: Array
    share: Array
    wall_hours: Array
    cost_usd: Array
    objective: float
    solver: str = SOLVER
    notes: tuple[str, ...] = field(default=())
    columns: PolicyInput | None = None
    bound: float | None = None
    rounds: int = 0

    @property
    def total_cost_usd(self) -> float:
        return float(np.sum(self.cost_usd[np.isfinite(self.cost_usd)]))

    @property
    def makespan_hours(self) -> float:
        return float(np.max(self.wall_hours)) if len(self.wall_hours) else 0.0


PolicyFn = Callable[[PolicyInput], Allocation]


def _import_policies() -> None:
    from spotopt.policies import (  # noqa: F401  (imports register the policies)
        max_throughput,
        min_cost,
        min_cost_slo,
        min_makespan_budget,
    )


POLICIES: Registry[PolicyFn] = Registry("policy", "policies", load=_import_policies)
# The names callers use: ``--policy`` values are checked with ``get_policy`` before any work.
register = POLICIES.register
get_policy = POLICIES.lookup
policy_names = POLICIES.names


# --- building blocks ---------------------------------------------------------------------------


def per_job_sum(inp: PolicyInput, values: Array) -> Array:
    return np.bincount(inp.job, weights=values, minlength=inp.n_jobs)


SEED_CHEAPEST = 2
"""Options per job in the first master: this many cheapest per step, and the fastest."""


def solve_columns(inp: PolicyInput, form: Formulation, policy: str) -> Result | None:
    """``form`` over every option of ``inp`` by exact column generation; ``None`` if infeasible.

    Raises the "no market can run" error first if a job has no option at all.
    """
    from spotopt.policies.columns import solve_by_columns  # imports cvxpy: only when a policy solves

    source = inp.options()
    seed = seed_columns(source, SEED_CHEAPEST)
    has = np.zeros(inp.n_jobs, dtype=bool)
    has[seed.job] = True
    if not has.all():
        raise no_market_error(inp, policy, np.flatnonzero(~has))
    return solve_by_columns(form, source, seed, policy)


def explicit_hours(inp: PolicyInput, result: Result) -> tuple[PolicyInput, Array]:
    """The explicit input the result's hours index, and those hours.

    For explicit options: the input itself, hours 0 on every option the master never held.
    For generated ones: just the master's columns (all others have 0 hours).
    """
    cols = result.columns
    if inp.generated is None:
        hours = np.zeros(inp.n_options)
        hours[cols.key] = result.hours
        return inp, hours
    sub = inp.with_options(
        cols.job, cols.market, cols.steps_per_hour, cols.usd_per_hour, cols.instances_per_hour
    )
    return sub, result.hours


def allocation_from_result(inp: PolicyInput, policy: str, result: Result, objective: float) -> Allocation:
    sub, hours = explicit_hours(inp, result)
    alloc = allocation_from_hours(sub, policy, hours, objective)
    return dataclasses.replace(
        alloc, columns=None if sub is inp else sub, bound=result.bound, rounds=result.rounds
    )


def allocation_from_hours(inp: PolicyInput, policy: str, hours: Array, objective: float) -> Allocation:
    """Shares, wall time and cost per job from job-hours (tiny negatives from the solver clipped)."""
    hours = np.clip(np.asarray(hours, dtype=float), 0.0, None)
    hours[hours < 1e-9] = 0.0
    wall = per_job_sum(inp, hours)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(wall[inp.job] > 0, hours / wall[inp.job], 0.0)
    cost = per_job_sum(inp, hours * inp.usd_per_hour)
    return Allocation(policy, "optimal", hours, share, wall, cost, float(objective))


def capacity_over(inp: PolicyInput, hours: float) -> Array:
    """Instance-hours each market can sell in ``hours`` (``inf``: unlimited, no capacity row)."""
    return np.where(np.isfinite(inp.capacity), inp.capacity * hours, np.inf)


def fastest_hours(inp: PolicyInput) -> Array:
    """Per job: wall hours on its fastest option alone (``inf`` if it has no option)."""
    best, _ = job_best(inp.options(), inp.n_jobs)
    with np.errstate(divide="ignore"):
        return np.where(best > 0, inp.work_steps / best, np.inf)


def no_market_error(inp: PolicyInput, policy: str, jobs: Array) -> InfeasibleError:
    """Jobs without any option: name them (usually the spec's filters)."""
    names = ", ".join(inp.job_name(int(j)) for j in jobs)
    return InfeasibleError(
        f"{policy}: no market can run {names}",
        hint="hint: widen the job's allow filters, add throughputs for more GPU models, "
        "or check prices at --at",
    )
