"""``min-cost``: the fewest dollars that finish every job within the planning horizon.

Exact, not Gavel's proxy. Gavel's cost policy maximises ``sum_m T_m·X_m / c_m·X_m`` (or its
surrogate ``sum T/c·X``), which rewards filling capacity; here the objective is the dollars
themselves, ``sum_e c[e] h[e]`` over job-hours (see ``policies.base`` for why that is the
Charnes–Cooper form of the per-job linear-fractional program and where it relaxes reality).
The cvxpy problem is ``policies.base.cost_formulation``, shared with ``min-cost-slo``:

    h = cp.Variable(n, nonneg=True)
    minimise  c @ h
    s.t.      A_work @ h >= 1        (T / W per option: every job's work done)
              A_wall @ h <= D        (each job's hours; here the horizon)
              A_cap @ h <= cap * H   (instance-hours of the finite markets)
"""

from __future__ import annotations

import numpy as np
from spotopt.policies.base import (
    Allocation,
    Array,
    PolicyInput,
    allocation_from_result,
    cost_formulation,
    explain_infeasible,
    register,
    solve_columns,
)

NAME = "min-cost"


def solve_min_cost(inp: PolicyInput, policy: str, wall_limit: Array) -> Allocation:
    """Minimise total dollars with each job's wall time bounded by ``wall_limit`` (hours)."""
    result = solve_columns(inp, cost_formulation(inp, wall_limit), policy)
    if result is None:
        raise explain_infeasible(inp, policy, wall_limit)
    return allocation_from_result(inp, policy, result, result.objective)


@register(NAME)
def min_cost(inp: PolicyInput) -> Allocation:
    """Deadlines are ignored; every job must still finish within the horizon."""
    return solve_min_cost(inp, NAME, np.full(inp.n_jobs, inp.horizon_hours))
