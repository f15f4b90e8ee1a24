"""``max-throughput``: the most training progress per hour, cost no object (the thesis' baseline).

Variables are time shares ``x[e]`` (fraction of the hour job ``j`` spends on option ``e``):
``sum_e x[e] <= 1`` per job and ``sum_e s[e] x[e] <= cap[m]`` per market. The objective sums
each job's effective throughput normalised by its remaining work (fraction of the job done per
hour), because raw steps/s of different models are not comparable units. A job's wall time is
its work over its effective throughput at these shares.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from spotopt.policies.base import (
    Allocation,
    PolicyInput,
    check_runnable,
    incidence,
    per_job_sum,
    register,
    solve_lp,
)

NAME = "max-throughput"


@register(NAME)
def max_throughput(inp: PolicyInput) -> Allocation:
    import cvxpy as cp

    check_runnable(inp, NAME)
    x = cp.Variable(inp.n_options, nonneg=True)
    rate = inp.steps_per_hour / inp.work_steps[inp.job]
    cons = [incidence(inp.job, inp.n_jobs, np.ones(inp.n_options)) @ x <= 1.0]
    finite = np.isfinite(inp.capacity)
    if finite.any():
        sel = finite[inp.market]
        rows = np.flatnonzero(finite)
        remap = np.full(inp.n_markets, -1)
        remap[rows] = np.arange(len(rows))
        a_cap = sp.csr_matrix(
            (inp.instances_per_hour[sel], (remap[inp.market[sel]], np.flatnonzero(sel))),
            shape=(len(rows), inp.n_options),
        )
        cons.append(a_cap @ x <= inp.capacity[rows])
    problem = cp.Problem(cp.Maximize(rate @ x), cons)
    solve_lp(problem, NAME)
    shares = np.clip(np.asarray(x.value, dtype=float), 0.0, None)
    shares[shares < 1e-9] = 0.0
    progress = per_job_sum(inp, shares * inp.steps_per_hour)
    with np.errstate(divide="ignore"):
        wall = np.where(progress > 0, inp.work_steps / progress, np.inf)
    hours = shares * np.where(np.isfinite(wall), wall, 0.0)[inp.job]
    cost = np.where(np.isfinite(wall), per_job_sum(inp, hours * inp.usd_per_hour), np.inf)
    used = per_job_sum(inp, shares)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(used[inp.job] > 0, shares / used[inp.job], 0.0)
    return Allocation(NAME, "optimal", hours, share, wall, cost, float(problem.value))
