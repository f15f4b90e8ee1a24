"""``min-makespan-budget``: finish all jobs as early as possible without spending more than a budget.

One LP, no bisection: minimise ``M`` subject to every job's wall hours ``sum_e h[e] <= t_j``
with ``t_j <= M`` and ``t_j <=`` its deadline (capped by the horizon), each market's
instance-hours ``<= cap[m] * M`` (the makespan is the window in which capacity is sold), the
work constraints and ``sum_e c[e] h[e] <= budget``. The thesis writes this with the makespan
multiplying the cost rate, which is bilinear and needs a binary search over ``M``; in
job-hours both the cost and the time limits are linear. In cvxpy (``formulation``) ``t`` and
``M`` are variables next to the options' ``h``; the options' columns are the usual ones plus
the budget row.
"""

from __future__ import annotations

import cvxpy as cp

from spotopt.errors import InfeasibleError, InputError
from spotopt.policies.base import (
    Allocation,
    PolicyInput,
    allocation_from_result,
    register,
    solve_columns,
)
from spotopt.policies.columns import Formulation, MasterLP, OptionRows
from spotopt.policies.min_cost import solve_min_cost

NAME = "min-makespan-budget"


def formulation(inp: PolicyInput, budget: float) -> Formulation:
    """``min M``: work, ``A_wall h <= t``, ``A_cap h <= cap M``, ``c h <= budget``, ``t <= M``, ``t <= D``."""
    wall_limit = inp.wall_limit()

    def build(rows: OptionRows, uncovered: cp.Variable | None) -> MasterLP:
        h = cp.Variable(rows.n, nonneg=True)
        t = cp.Variable(inp.n_jobs, nonneg=True)
        makespan = cp.Variable(nonneg=True)
        cap = inp.capacity[rows.finite]
        return MasterLP(
            objective=makespan,
            h=h,
            work=rows.work @ h + uncovered >= 1,
            wall=rows.wall @ h - t <= 0,
            cap=rows.cap @ h - cap * makespan <= 0 if len(cap) else None,
            budget=rows.usd @ h <= budget,
            extra=(t, makespan),
            others=(t - makespan <= 0, t <= wall_limit),
        )

    return Formulation(inp.work_steps, inp.capacity, build, penalty=10 * inp.horizon_hours)


@register(NAME)
def min_makespan_budget(inp: PolicyInput) -> Allocation:
    if inp.budget_usd is None:
        raise InputError(f"{NAME} needs a budget: pass --budget USD")
    result = solve_columns(inp, formulation(inp, inp.budget_usd), NAME)
    if result is None:
        cheapest = solve_min_cost(inp, NAME, inp.wall_limit())  # raises if deadlines are the cause
        raise InfeasibleError(
            f"{NAME}: the budget of ${inp.budget_usd:,.2f} is below the cheapest plan that meets every "
            f"deadline (${cheapest.total_cost_usd:,.2f}): "
            f"short by ${cheapest.total_cost_usd - inp.budget_usd:,.2f}",
            hint="hint: raise --budget or relax deadlines",
        )
    return allocation_from_result(inp, NAME, result, result.objective)
