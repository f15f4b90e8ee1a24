"""``min-makespan-budget``: finish all jobs as early as possible without spending more than a budget.

One LP, no bisection: minimise ``M`` subject to every job's wall hours ``sum_e h[e] <= M`` (and
its deadline, if it has one), each market's instance-hours ``<= cap[m] * M`` (the makespan is the
window in which capacity is sold), the work constraints and ``sum_e c[e] h[e] <= budget``. The
thesis writes this with the makespan multiplying the cost rate, which is bilinear and needs a
binary search over ``M``; in job-hours both the cost and the time limits are linear.
"""

from __future__ import annotations

import numpy as np
from spotopt.policies.base import (
    Allocation,
    PolicyInput,
    allocation_from_hours,
    check_runnable,
    register,
    solve_lp,
    work_hours_constraints,
)
from spotopt.policies.min_cost import solve_min_cost

from spotopt.errors import InfeasibleError, InputError

NAME = "min-makespan-budget"


@register(NAME)
def min_makespan_budget(inp: PolicyInput) -> Allocation:
    import cvxpy as cp

    if inp.budget_usd is None:
        raise InputError(f"{NAME} needs a budget: pass --budget USD")
    check_runnable(inp, NAME)
    h = cp.Variable(inp.n_options, nonneg=True)
    span = cp.Variable(nonneg=True)
    cons = work_hours_constraints(inp, h, cp.minimum(span, inp.wall_limit()), span)
    cons.append(inp.usd_per_hour @ h <= inp.budget_usd)
    problem = cp.Problem(cp.Minimize(span), cons)
    if solve_lp(problem, NAME) == "infeasible":
        cheapest = solve_min_cost(inp, NAME, inp.wall_limit())  # raises if deadlines are the cause
        raise InfeasibleError(
            f"{NAME}: the budget of ${inp.budget_usd:,.2f} is below the cheapest plan that meets every "
            f"deadline (${cheapest.total_cost_usd:,.2f}): "
            f"short by ${cheapest.total_cost_usd - inp.budget_usd:,.2f}",
            hint="hint: raise --budget or relax deadlines",
        )
    alloc = allocation_from_hours(inp, NAME, h.value, float(np.asarray(span.value)))
    return alloc
