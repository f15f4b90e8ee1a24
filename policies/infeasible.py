"""Why a deadline problem has no solution: the jobs to blame and by how many hours.

First the jobs that cannot finish in time even alone on their fastest allowed option (no LP
needed); otherwise the shortfall comes from shared capacity, and an elastic LP, written in
cvxpy like the policies and solved by the same column generation, tells which jobs must give.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np

from spotopt.errors import InfeasibleError
from spotopt.policies.base import (
    Array,
    PolicyInput,
    explicit_hours,
    job_best,
    no_market_error,
    solve_columns,
)
from spotopt.policies.columns import Formulation, MasterLP, OptionRows


def elastic_formulation(inp: PolicyInput, wall_limit: Array) -> Formulation:
    """Minimise how far wall-time limits must stretch: ``longest + 1e-3 * sum(slack)``.

    Job ``j`` may run ``D_j + slack_j`` hours, every ``slack_j <= longest``, and markets sell
    capacity for ``H + longest`` hours (for as long as the latest job runs).
    """
    capacity = inp.capacity

    def build(rows: OptionRows, uncovered: cp.Variable | None) -> MasterLP:
        h = cp.Variable(rows.n, nonneg=True)
        slack = cp.Variable(inp.n_jobs, nonneg=True)
        longest = cp.Variable(nonneg=True)
        cap = capacity[rows.finite]
        return MasterLP(
            objective=longest + 1e-3 * cp.sum(slack),
            h=h,
            work=rows.work @ h + uncovered >= 1,
            wall=rows.wall @ h - slack <= wall_limit,
            cap=rows.cap @ h <= cap * inp.horizon_hours + cap * longest if len(cap) else None,
            extra=(slack, longest),
            others=(slack <= longest,),
        )

    return Formulation(inp.work_steps, capacity, build, penalty=10 * inp.horizon_hours)


def explain_infeasible(inp: PolicyInput, policy: str, wall_limit: Array) -> InfeasibleError:
    """The error for an infeasible deadline/horizon problem, naming each job and by how much.

    First the jobs that cannot finish in time even alone on their fastest allowed option; if
    there are none, the shortfall comes from shared capacity, and an elastic LP (minimise the
    total extension of the wall-time limits, ``elastic_formulation``) tells which jobs must give and
    how many hours.
    """
    best, best_market = job_best(inp.options(), inp.n_jobs)
    if not (best > 0).all():
        return no_market_error(inp, policy, np.flatnonzero(best <= 0))
    need = inp.work_steps / best
    late = np.flatnonzero(need > wall_limit * (1 + 1e-9))
    if len(late):
        lines = [
            f"  {inp.job_name(int(j))}: needs {need[j]:.1f} h even on its fastest allowed market "
            f"({inp.market_name(int(best_market[j]))}), limit is {wall_limit[j]:.1f} h "
            "(the deadline less the reserve the mover keeps for restarts and preemptions): "
            f"misses by {need[j] - wall_limit[j]:.1f} h"
            for j in late
        ]
        return InfeasibleError(
            f"{policy}: {len(late)} job(s) cannot meet their deadline (or the planning horizon):\n"
            + "\n".join(lines),
            hint="hint: extend the deadline, allow faster GPUs or more GPUs per job (gpus: {min, max})",
        )
    result = solve_columns(inp, elastic_formulation(inp, wall_limit), policy)
    if result is None:
        return InfeasibleError(f"{policy}: market capacity over the horizon cannot finish all jobs")
    extra = np.clip(result.extra[: inp.n_jobs], 0.0, None)
    over = max(0.0, float(result.extra[inp.n_jobs]))
    sub, hours = explicit_hours(inp, result)
    hours = np.clip(hours, 0.0, None)
    load = np.bincount(sub.market, weights=hours * sub.instances_per_hour, minlength=sub.n_markets)
    full = np.isfinite(sub.capacity) & (load >= sub.capacity * (sub.horizon_hours + over) * (1 - 1e-6))
    running = full[sub.market] & (hours > 1e-9)
    on_full = np.zeros(sub.n_jobs, dtype=bool)
    on_full[sub.job[running]] = True
    lines = []
    for j in (int(i) for i in np.flatnonzero(on_full | (extra > 1e-6))):
        markets = sorted({sub.market_name(int(m)) for m in sub.market[(sub.job == j) & running]})
        late_h = max(float(extra[j]), over if on_full[j] else 0.0)
        lines.append(
            f"  {sub.job_name(int(j))}: up to {late_h:.1f} h past its limit of {wall_limit[j]:.1f} h"
            + (f" (shares full markets: {', '.join(markets[:3])})" if markets else "")
        )
    return InfeasibleError(
        f"{policy}: market capacity is too small to meet every deadline together "
        f"(the jobs need {over:.1f} h more than the limits allow):\n" + "\n".join(lines),
        hint="hint: raise market capacity, relax these deadlines, or allow more markets",
    )
