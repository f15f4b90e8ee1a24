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
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

from spotopt.errors import InfeasibleError, InputError, PolicyError

SOLVER = "HIGHS"
"""Pinned LP solver (ships with cvxpy via highspy): results must not depend on what else is installed."""

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class PolicyInput:
    """A planning problem as arrays. ``E`` options, ``J`` jobs, ``M`` markets.

    Options (length ``E``): ``job``, ``market`` (indices), ``steps_per_hour`` (> 0),
    ``usd_per_hour`` (>= 0, per job-hour), ``instances_per_hour`` (> 0).
    Jobs (length ``J``): ``work_steps`` (> 0), ``deadline_hours`` (``inf`` = none).
    Markets (length ``M``): ``capacity`` in instances at once (``inf`` = unlimited).
    ``horizon_hours`` bounds every job's wall time; ``budget_usd`` is used by budgeted policies.
    ``job_names`` and ``market_names`` only make error messages readable.
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

    def __post_init__(self) -> None:
        n_opt = len(self.job)
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


@dataclass(frozen=True)
class Allocation:
    """What a policy decided.

    ``hours[e]``: job-hours on option ``e``; ``share[e]``: fraction of its job's wall time on
    ``e`` (a job's shares sum to 1 if it runs, 0 if it gets nothing). Per job: ``wall_hours``
    (time to finish running continuously, ``inf`` if it never finishes) and ``cost_usd``.
    ``status`` is the solver's status (``optimal`` for every allocation returned).
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

    @property
    def total_cost_usd(self) -> float:
        return float(np.sum(self.cost_usd[np.isfinite(self.cost_usd)]))

    @property
    def makespan_hours(self) -> float:
        return float(np.max(self.wall_hours)) if len(self.wall_hours) else 0.0


PolicyFn = Callable[[PolicyInput], Allocation]
_REGISTRY: dict[str, PolicyFn] = {}


def register(name: str) -> Callable[[PolicyFn], PolicyFn]:
    """Register ``fn`` under a kebab-case ``name`` (also its CLI name)."""

    def deco(fn: PolicyFn) -> PolicyFn:
        if name in _REGISTRY:
            raise RuntimeError(f"policy {name!r} registered twice")
        _REGISTRY[name] = fn
        return fn

    return deco


def policy_names() -> list[str]:
    _load_all()
    return sorted(_REGISTRY)


def get_policy(name: str) -> PolicyFn:
    """The policy called ``name``; an unknown name gets a did-you-mean and the valid names."""
    _load_all()
    if name in _REGISTRY:
        return _REGISTRY[name]
    close = difflib.get_close_matches(name, list(_REGISTRY), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise InputError(f"--policy {name!r} is not a policy; {hint}valid: {', '.join(sorted(_REGISTRY))}")


def _load_all() -> None:
    from spotopt.policies import (  # noqa: F401  (imports register the policies)
        max_throughput,
        min_cost,
        min_cost_slo,
        min_makespan_budget,
    )


# --- building blocks ---------------------------------------------------------------------------


def incidence(index: Array, n_rows: int, values: Array) -> sp.csr_matrix:
    """Sparse ``n_rows × E`` matrix with ``values[e]`` at ``(index[e], e)``."""
    n_opt = len(index)
    return sp.csr_matrix((values, (index, np.arange(n_opt))), shape=(n_rows, n_opt))


def per_job_sum(inp: PolicyInput, values: Array) -> Array:
    return np.bincount(inp.job, weights=values, minlength=inp.n_jobs)


def solve_lp(problem: Any, policy: str) -> str:
    """Solve a cvxpy problem with the pinned solver; return its status or raise on failure.

    Infeasibility is returned (as ``"infeasible"``) so the policy can explain which job or
    constraint causes it; any other non-optimal outcome is a ``PolicyError``.
    """
    import cvxpy as cp

    try:
        problem.solve(solver=getattr(cp, SOLVER))
    except cp.error.SolverError as exc:
        raise PolicyError(f"{policy}: solver {SOLVER} failed: {exc}") from exc
    status = str(problem.status)
    if status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE):
        return "infeasible"
    if status == cp.UNBOUNDED:
        raise PolicyError(f"{policy}: the problem is unbounded (a bug in the inputs: negative costs?)")
    if status not in (cp.OPTIMAL, cp.OPTIMAL_INACCURATE):
        raise PolicyError(f"{policy}: solver {SOLVER} ended with status {status!r}")
    return "optimal"


def allocation_from_hours(inp: PolicyInput, policy: str, hours: Array, objective: float) -> Allocation:
    """Shares, wall time and cost per job from job-hours (tiny negatives from the solver clipped)."""
    hours = np.clip(np.asarray(hours, dtype=float), 0.0, None)
    hours[hours < 1e-9] = 0.0
    wall = per_job_sum(inp, hours)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(wall[inp.job] > 0, hours / wall[inp.job], 0.0)
    cost = per_job_sum(inp, hours * inp.usd_per_hour)
    return Allocation(policy, "optimal", hours, share, wall, cost, float(objective))


def fastest_hours(inp: PolicyInput) -> Array:
    """Per job: wall hours on its fastest option alone (``inf`` if it has no option)."""
    best = np.zeros(inp.n_jobs)
    np.maximum.at(best, inp.job, inp.steps_per_hour)
    with np.errstate(divide="ignore"):
        return np.where(best > 0, inp.work_steps / best, np.inf)


def check_runnable(inp: PolicyInput, policy: str) -> None:
    """Every job needs at least one option; otherwise name the jobs (usually the spec's filters)."""
    has = np.zeros(inp.n_jobs, dtype=bool)
    has[inp.job] = True
    if not has.all():
        names = ", ".join(inp.job_name(int(j)) for j in np.flatnonzero(~has))
        raise InfeasibleError(
            f"{policy}: no market can run {names}",
            hint="hint: widen the job's allow filters, add throughputs for more GPU models, "
            "or check prices at --at",
        )


def work_hours_constraints(inp: PolicyInput, h: Any, wall_limit: Any, span: Any) -> list[Any]:
    """Work, wall-time and capacity constraints on job-hours ``h`` (rows scaled to O(1)).

    ``wall_limit`` bounds each job's hours; ``span`` is the time over which markets sell their
    capacity (the horizon, or the makespan variable).
    """
    finite = np.isfinite(inp.capacity)
    a_work = incidence(inp.job, inp.n_jobs, inp.steps_per_hour / inp.work_steps[inp.job])
    a_wall = incidence(inp.job, inp.n_jobs, np.ones(inp.n_options))
    cons = [a_work @ h >= 1.0, a_wall @ h <= wall_limit]
    if finite.any():
        rows = np.flatnonzero(finite)
        remap = np.full(inp.n_markets, -1)
        remap[rows] = np.arange(len(rows))
        sel = finite[inp.market]
        a_cap = sp.csr_matrix(
            (inp.instances_per_hour[sel], (remap[inp.market[sel]], np.flatnonzero(sel))),
            shape=(len(rows), inp.n_options),
        )
        cons.append(a_cap @ h <= inp.capacity[rows] * span)
    return cons


def explain_infeasible(inp: PolicyInput, policy: str, wall_limit: Array) -> InfeasibleError:
    """The error for an infeasible deadline/horizon problem, naming each job and by how much.

    First the jobs that cannot finish in time even alone on their fastest allowed option; if
    there are none, the shortfall comes from shared capacity, and an elastic LP (minimise the
    total extension of the wall-time limits) tells which jobs must give and how many hours.
    """
    import cvxpy as cp

    check_runnable(inp, policy)
    need = fastest_hours(inp)
    late = np.flatnonzero(need > wall_limit * (1 + 1e-9))
    if len(late):
        best = np.full(inp.n_jobs, -1)
        order = np.argsort(inp.steps_per_hour)
        best[inp.job[order]] = order  # last write wins: the fastest option per job
        lines = [
            f"  {inp.job_name(int(j))}: needs {need[j]:.1f} h even on its fastest allowed market "
            f"({inp.market_name(int(inp.market[best[j]]))}), limit is {wall_limit[j]:.1f} h: "
            f"misses by {need[j] - wall_limit[j]:.1f} h"
            for j in late
        ]
        return InfeasibleError(
            f"{policy}: {len(late)} job(s) cannot meet their deadline (or the planning horizon):\n"
            + "\n".join(lines),
            hint="hint: extend the deadline, allow faster GPUs or more GPUs per job (gpus: {min, max})",
        )
    h = cp.Variable(inp.n_options, nonneg=True)
    slack = cp.Variable(inp.n_jobs, nonneg=True)
    longest = cp.Variable(nonneg=True)  # markets sell capacity for as long as the latest job runs
    cons = work_hours_constraints(inp, h, wall_limit + slack, inp.horizon_hours + longest)
    cons.append(slack <= longest)
    problem = cp.Problem(cp.Minimize(longest + 1e-3 * cp.sum(slack)), cons)
    if solve_lp(problem, policy) != "optimal":
        return InfeasibleError(f"{policy}: market capacity over the horizon cannot finish all jobs")
    extra = np.asarray(slack.value, dtype=float)
    over = float(np.asarray(longest.value))
    hours = np.clip(np.asarray(h.value, dtype=float), 0.0, None)
    load = np.bincount(inp.market, weights=hours * inp.instances_per_hour, minlength=inp.n_markets)
    full = np.isfinite(inp.capacity) & (load >= inp.capacity * (inp.horizon_hours + over) * (1 - 1e-6))
    on_full = np.zeros(inp.n_jobs, dtype=bool)
    on_full[inp.job[full[inp.market] & (hours > 1e-9)]] = True
    lines = []
    for j in (int(i) for i in np.flatnonzero(on_full | (extra > 1e-6))):
        markets = sorted(
            {inp.market_name(int(m)) for m in inp.market[(inp.job == j) & full[inp.market] & (hours > 1e-9)]}
        )
        late = max(float(extra[j]), over if on_full[j] else 0.0)
        lines.append(
            f"  {inp.job_name(int(j))}: up to {late:.1f} h past its limit of {wall_limit[j]:.1f} h"
            + (f" (shares full markets: {', '.join(markets[:3])})" if markets else "")
        )
    return InfeasibleError(
        f"{policy}: market capacity is too small to meet every deadline together "
        f"(the jobs need {over:.1f} h more than the limits allow):\n" + "\n".join(lines),
        hint="hint: raise market capacity, relax these deadlines, or allow more markets",
    )
