"""``min-makespan-budget``: finish all jobs as early as possible without spending more than a budget.

One LP, no bisection: minimise ``M`` subject to every job's wall hours ``sum_e h[e] <= t_j``
with ``t_j <= M`` and ``t_j <=`` its deadline (capped by the horizon), each market's
instance-hours ``<= cap[m] * M`` (the makespan is the window in which capacity is sold), the
work constraints and ``sum_e c[e] h[e] <= budget``. The thesis writes this with the makespan
multiplying the cost rate, which is bilinear and needs a binary search over ``M``; in
job-hours both the cost and the time limits are linear. ``t`` and ``M`` are the master's
extra variables in column generation; the options' columns are the usual ones plus the budget.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp
from spotopt.policies.base import (
    Allocation,
    PolicyInput,
    allocation_from_result,
    register,
    solve_columns,
)
from spotopt.policies.columns import Extra, Spec
from spotopt.policies.min_cost import solve_min_cost

from spotopt.errors import InfeasibleError, InputError

NAME = "min-makespan-budget"


def makespan_spec(inp: PolicyInput, budget: float) -> Spec:
    """Rows: work, ``sum h - t_j <= 0``, ``sum s h - cap_m M <= 0``, budget, ``t_j - M <= 0``."""
    n = inp.n_jobs
    capacity = np.where(np.isfinite(inp.capacity), 0.0, np.inf)
    base = Spec(inp.work_steps, np.zeros(n), capacity, budget=budget, penalty=10 * inp.horizon_hours)
    wall0, _, cap_row, _, n_std = base.layout()
    finite = np.flatnonzero(cap_row >= 0)
    span = n
    rows = np.r_[wall0 + np.arange(n), n_std + np.arange(n), cap_row[finite], n_std + np.arange(n)]
    cols = np.r_[np.arange(n), np.arange(n), np.full(len(finite), span), np.full(n, span)]
    vals = np.r_[-np.ones(n), np.ones(n), -inp.capacity[finite], -np.ones(n)]
    extra = Extra(
        cost=np.r_[np.zeros(n), 1.0],
        lower=np.zeros(n + 1),
        upper=np.r_[inp.wall_limit(), np.inf],
        matrix=sp.csc_matrix((vals, (rows, cols)), shape=(n_std + n, n + 1)),
        row_lower=np.full(n, -np.inf),
        row_upper=np.zeros(n),
    )
    return dataclasses.replace(base, extra=extra)


@register(NAME)
def min_makespan_budget(inp: PolicyInput) -> Allocation:
    if inp.budget_usd is None:
        raise InputError(f"{NAME} needs a budget: pass --budget USD")
    result = solve_columns(inp, makespan_spec(inp, inp.budget_usd), NAME)
    if result is None:
        cheapest = solve_min_cost(inp, NAME, inp.wall_limit())  # raises if deadlines are the cause
        raise InfeasibleError(
            f"{NAME}: the budget of ${inp.budget_usd:,.2f} is below the cheapest plan that meets every "
            f"deadline (${cheapest.total_cost_usd:,.2f}): "
            f"short by ${cheapest.total_cost_usd - inp.budget_usd:,.2f}",
            hint="hint: raise --budget or relax deadlines",
        )
    return allocation_from_result(inp, NAME, result, result.objective)
