"""``min-cost``: the fewest dollars that finish every job within the planning horizon.

Exact, not Gavel's proxy. Gavel's cost policy maximises ``sum_m T_m·X_m / c_m·X_m`` (or its
surrogate ``sum T/c·X``), which rewards filling capacity; here the objective is the dollars
themselves, ``sum_e c[e] h[e]`` over job-hours (see ``policies.base`` for why that is the
Charnes–Cooper form of the per-job linear-fractional program and where it relaxes reality).
The cvxpy problem is ``cost_formulation``, shared with ``min-cost-slo``:

    h = cp.Variable(n, nonneg=True)
    minimise  c @ h
    s.t.      A_work @ h >= 1        (T / W per option: every job's work done)
              A_wall @ h <= D        (each job's hours; here the horizon)
              A_cap @ h <= cap * H   (instance-hours of the finite markets)
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np

from spotopt.policies.base import (
    Allocation,
    Array,
    PolicyInput,
    allocation_from_result,
    capacity_over,
    register,
    solve_columns,
)
from spotopt.policies.columns import Formulation, MasterLP, OptionRows
from spotopt.policies.infeasible import explain_infeasible

NAME = "min-cost"


def cost_formulation(inp: PolicyInput, wall_limit: Array) -> Formulation:
    """The min-cost LP in cvxpy: dollars, with work, wall-time (``wall_limit``) and capacity rows."""
    capacity_hours = capacity_over(inp, inp.horizon_hours)

    def build(rows: OptionRows, uncovered: cp.Variable | None) -> MasterLP:
        h = cp.Variable(rows.n, nonneg=True)
        return MasterLP(
            objective=rows.usd @ h,
            h=h,
            work=rows.work @ h + uncovered >= 1,
            wall=rows.wall @ h <= wall_limit,
            cap=rows.cap @ h <= capacity_hours[rows.finite] if len(rows.finite) else None,
        )

    return Formulation(inp.work_steps, inp.capacity, build, cost_weight=1.0, bound_wall=wall_limit)


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
