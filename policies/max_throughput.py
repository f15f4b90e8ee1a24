"""``max-throughput``: the most training progress per hour, cost no object (the thesis' baseline).

Variables are time shares ``x[e]`` (fraction of the hour job ``j`` spends on option ``e``):
``sum_e x[e] <= 1`` per job and ``sum_e s[e] x[e] <= cap[m]`` per market. The objective sums
each job's effective throughput normalised by its remaining work (fraction of the job done per
hour), because raw steps/s of different models are not comparable units. A job's wall time is
its work over its effective throughput at these shares.

In cvxpy (``formulation``) over a set of options: ``maximize a @ x`` (``a = T / W``) subject to
``A_wall @ x <= 1`` and ``A_cap @ x <= cap``; column generation minimises ``-a @ x``, the
same problem with no work rows.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np

from spotopt.errors import PolicyError
from spotopt.policies.base import (
    Allocation,
    PolicyInput,
    explicit_hours,
    per_job_sum,
    register,
    solve_columns,
)
from spotopt.policies.columns import Formulation, MasterLP, OptionRows

NAME = "max-throughput"


def formulation(inp: PolicyInput) -> Formulation:
    """Time shares per option: each job's at most 1, each finite market's instances at most its capacity."""

    def build(rows: OptionRows, uncovered: cp.Variable | None) -> MasterLP:
        x = cp.Variable(rows.n, nonneg=True)
        return MasterLP(
            objective=-(rows.a @ x),
            h=x,
            wall=rows.wall @ x <= 1,
            cap=rows.cap @ x <= inp.capacity[rows.finite] if len(rows.finite) else None,
        )

    return Formulation(inp.work_steps, inp.capacity, build, rate_weight=-1.0, work=False)


@register(NAME)
def max_throughput(inp: PolicyInput) -> Allocation:
    result = solve_columns(inp, formulation(inp), NAME)
    if result is None:  # x = 0 is always feasible
        raise PolicyError(f"{NAME}: the solver found no feasible shares")
    sub, shares = explicit_hours(inp, result)
    shares = np.clip(shares, 0.0, None)
    shares[shares < 1e-9] = 0.0
    progress = per_job_sum(sub, shares * sub.steps_per_hour)
    with np.errstate(divide="ignore"):
        wall = np.where(progress > 0, sub.work_steps / progress, np.inf)
    hours = shares * np.where(np.isfinite(wall), wall, 0.0)[sub.job]
    cost = np.where(np.isfinite(wall), per_job_sum(sub, hours * sub.usd_per_hour), np.inf)
    used = per_job_sum(sub, shares)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(used[sub.job] > 0, shares / used[sub.job], 0.0)
    return Allocation(
        NAME,
        "optimal",
        hours,
        share,
        wall,
        cost,
        -result.objective,
        columns=None if sub is inp else sub,
        rounds=result.rounds,
    )
