"""Exact delayed column generation for the job-hours LPs, on a HiGHS master (highspy).

Every policy here is an LP whose columns are options (job, market, GPUs) with the same shape:
option ``e`` of job ``j`` on market ``m`` has entry ``a = T[e] / W[j]`` in job ``j``'s work row,
``1`` in its wall-time row, ``s[e]`` in market ``m``'s capacity row (finite markets only),
``c[e]`` in the budget row (if any), and objective ``cost_weight * c + rate_weight * a``. A
policy adds a few variables of its own (the makespan, slacks) through ``Extra``.

Column generation solves the LP over a *restricted* set of options (``seed_columns``), reads
the row duals ``y``, and prices every option: its reduced cost ``c_e - A_e^T y``. An option
with a negative one could lower the objective, so the most negative few per job join the
master; HiGHS re-solves (from its previous basis when few columns came in: they enter
nonbasic, the basis stays primal feasible and a few primal pivots finish; see
``Master.run``). When no option prices below ``-tol`` (HiGHS' dual tolerance 1e-7, scaled to
the costs), the restricted optimum satisfies the full LP's optimality conditions: it *is* the
full LP's optimum, with no pruning heuristic anywhere.

Feasibility: each work row gets an artificial column with a big-M cost, so every restricted
master is feasible; the big M never changes the answer (see ``solve_by_columns``).

For the cost policies the last pricing round also gives a proof of optimality one can read:
with the wall-time rows kept as the set ``{h_j >= 0, sum h_j <= D_j}``, Lagrangian duality
gives ``LP >= master objective + sum_j D_j * min(0, min_e rc_e)`` (``bound``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp
from spotopt.policies.options import Array, Columns, OptionSource, Prices, price

from spotopt.errors import PolicyError

ADD_PER_JOB = 4
"""Most negative options per job added per pricing round."""
WARM_FRACTION = 0.01
"""Re-solve from the previous basis when the columns added since are at most this share."""
IPM_COLUMNS = 50_000
"""Cold solves of a master with at least this many option columns use the interior point method."""
PENALTY_FACTOR = 10.0
"""Big M of the cost policies, per job: this many times its dearest seed option's whole cost.
Any value gives the same answer (see ``solve_by_columns``); a big enough one saves rounds."""
MAX_ROUNDS = 500
"""Column generation terminates finitely; this only turns a numerical stall into an error."""


@dataclass(frozen=True)
class Extra:
    """Policy-specific variables and rows next to the option columns.

    ``matrix`` has one column per extra variable and a row for every master row (layout in
    ``Spec``), ``row_lower``/``row_upper`` bound the extra rows appended after the standard ones.
    """

    cost: Array
    lower: Array
    upper: Array
    matrix: sp.csc_matrix
    row_lower: Array = field(default_factory=lambda: np.zeros(0))
    row_upper: Array = field(default_factory=lambda: np.zeros(0))


@dataclass(frozen=True)
class Spec:
    """One policy's LP. Row layout: work rows (if ``work``), wall rows, capacity rows of the
    finite markets, the budget row (if ``budget`` is set), then ``extra`` rows.
    """

    work_steps: Array
    wall_upper: Array
    capacity: Array
    """Per market, the capacity row's upper bound (``inf``: no row)."""
    cost_weight: float = 0.0
    rate_weight: float = 0.0
    work: bool = True
    penalty: float = 0.0
    """Big M of a work row's artificial column, in objective units per job; cost policies add
    ``PENALTY_FACTOR`` times the dearest seed option's cost of a whole job."""
    budget: float | None = None
    extra: Extra | None = None

    @property
    def n_jobs(self) -> int:
        return len(self.work_steps)

    def layout(self) -> tuple[int, int, Array, int, int]:
        """(first wall row, first cap row, row of each market or -1, budget row or -1, rows before extra)."""
        n = self.n_jobs
        wall0 = n if self.work else 0
        cap0 = wall0 + n
        finite = np.isfinite(self.capacity)
        cap_row = np.where(finite, cap0 + np.cumsum(finite) - 1, -1)
        after = cap0 + int(finite.sum())
        budget_row = after if self.budget is not None else -1
        return wall0, cap0, cap_row, budget_row, after + (self.budget is not None)


@dataclass(frozen=True)
class Result:
    columns: Columns
    hours: Array
    extra: Array
    objective: float
    bound: float | None
    """A proven lower bound on the full LP's optimum (cost policies; ``None`` otherwise)."""
    rounds: int


class Master:
    """The restricted master in HiGHS: rows fixed, option columns appended."""

    def __init__(self, spec: Spec, policy: str, penalty: float) -> None:
        import highspy

        self.spec, self.policy = spec, policy
        self.inf = highspy.kHighsInf
        self.h = highspy.Highs()
        self.h.setOptionValue("output_flag", False)
        self.h.setOptionValue("random_seed", 0)
        self.wall0, self.cap0, self.cap_row, self.budget_row, n_std = spec.layout()
        n = spec.n_jobs
        lower = np.full(n_std, -self.inf)
        upper = np.full(n_std, self.inf)
        if spec.work:
            lower[:n] = 1.0
        upper[self.wall0 : self.wall0 + n] = np.where(np.isfinite(spec.wall_upper), spec.wall_upper, self.inf)
        finite = np.isfinite(spec.capacity)
        upper[self.cap_row[finite]] = spec.capacity[finite]
        if spec.budget is not None:
            upper[self.budget_row] = spec.budget
        if spec.extra is not None:
            lower = np.r_[lower, spec.extra.row_lower]
            upper = np.r_[upper, spec.extra.row_upper]
        self.n_rows = len(lower)
        self.h.addRows(
            self.n_rows,
            lower,
            upper,
            0,
            np.zeros(self.n_rows, dtype=np.int32),
            np.zeros(0, dtype=np.int32),
            np.zeros(0),
        )
        self.n_extra = 0
        if spec.extra is not None:
            m = sp.csc_matrix(spec.extra.matrix)
            self.n_extra = m.shape[1]
            self._add(spec.extra.cost, spec.extra.lower, spec.extra.upper, m)
        self.n_art = n if spec.work else 0
        self.penalty = penalty
        if self.n_art:
            art = sp.csc_matrix((np.ones(n), (np.arange(n), np.arange(n))), shape=(self.n_rows, n))
            self._add(np.full(n, self.penalty), np.zeros(n), np.full(n, self.inf), art)
        self.columns: list[Columns] = []
        self.keys = np.zeros(0, dtype=np.int64)
        self.feasibility = False
        self.added = 0

    def _add(self, cost: Array, lower: Array, upper: Array, m: sp.csc_matrix) -> None:
        self.h.addCols(
            m.shape[1],
            np.asarray(cost, dtype=float),
            np.asarray(lower, dtype=float),
            np.where(np.isfinite(upper), upper, self.inf).astype(float),
            m.nnz,
            m.indptr[:-1].astype(np.int32),
            m.indices.astype(np.int32),
            m.data.astype(float),
        )

    def option_matrix(self, cols: Columns) -> sp.csc_matrix:
        """The master's column for each option (entries as in the module docstring)."""
        n = len(cols)
        rows = [cols.job.astype(np.int64) + self.wall0]
        vals = [np.ones(n)]
        if self.spec.work:
            rows.append(cols.job.astype(np.int64))
            vals.append(cols.steps_per_hour / self.spec.work_steps[cols.job])
        cap = self.cap_row[cols.market]
        on_cap = np.flatnonzero(cap >= 0)
        col_idx = [np.arange(n), np.arange(n) if self.spec.work else np.zeros(0, dtype=np.int64), on_cap]
        rows.append(cap[on_cap])
        vals.append(cols.instances_per_hour[on_cap])
        if self.spec.budget is not None:
            rows.append(np.full(n, self.budget_row))
            vals.append(cols.usd_per_hour)
            col_idx.append(np.arange(n))
        return sp.csc_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(col_idx))), shape=(self.n_rows, n)
        )

    def option_cost(self, cols: Columns) -> Array:
        if self.feasibility:
            return np.zeros(len(cols))
        a = cols.steps_per_hour / self.spec.work_steps[cols.job]
        return np.asarray(self.spec.cost_weight * cols.usd_per_hour + self.spec.rate_weight * a)

    def add(self, cols: Columns) -> int:
        """Append the options not yet in the master; returns how many were new."""
        fresh = cols.take(np.flatnonzero(~np.isin(cols.key, self.keys)))
        if len(fresh) == 0:
            return 0
        self._add(
            self.option_cost(fresh),
            np.zeros(len(fresh)),
            np.full(len(fresh), np.inf),
            self.option_matrix(fresh),
        )
        self.columns.append(fresh)
        self.keys = np.union1d(self.keys, fresh.key)
        self.added += len(fresh)
        return len(fresh)

    def set_objective(self, feasibility: bool) -> None:
        """The policy's objective with penalised artificials, or (``feasibility``) just their sum."""
        self.feasibility = feasibility
        extra = self.spec.extra.cost if self.spec.extra is not None else np.zeros(0)
        cost = np.r_[
            extra * (not feasibility),
            np.full(self.n_art, 1.0 if feasibility else self.penalty),
            *(self.option_cost(c) for c in self.columns),
        ]
        self.h.changeColsCost(len(cost), np.arange(len(cost), dtype=np.int32), cost.astype(float))

    def artificial(self) -> Array:
        """Current values of the artificial columns (uncovered fraction of each job's work)."""
        values = np.asarray(self.h.getSolution().col_value)
        return values[self.n_extra : self.n_extra + self.n_art]

    def run(self) -> tuple[float, Array]:
        """Solve; (objective, row duals).

        After a few new columns, from the previous basis (a few primal pivots); after many
        (more than ``WARM_FRACTION`` of the master), from scratch: with presolve, and on a big
        master (``IPM_COLUMNS``) by HiGHS' interior point method with crossover. Measured on the
        benchmark's first master (23k rows): 10k jobs × 5k markets, dual simplex 35 s, IPM 4 s;
        warm primal pivots after 30k new columns were slower than either.
        """
        import highspy

        cold = self.added > WARM_FRACTION * len(self.keys)
        self.h.setOptionValue("presolve", "on" if cold else "off")
        self.h.setOptionValue("solver", "ipm" if cold and len(self.keys) >= IPM_COLUMNS else "simplex")
        if cold:
            self.h.clearSolver()
        self.added = 0
        self.h.run()
        status = self.h.getModelStatus()
        if status != highspy.HighsModelStatus.kOptimal:
            raise PolicyError(
                f"{self.policy}: HiGHS ended with status {self.h.modelStatusToString(status)!r}"
            )
        sol = self.h.getSolution()
        return float(self.h.getInfo().objective_function_value), np.asarray(sol.row_dual)

    def prices(self, dual: Array) -> Prices:
        spec, n = self.spec, self.spec.n_jobs
        work = dual[:n] if spec.work else np.zeros(n)
        weight = (0.0, 0.0) if self.feasibility else (spec.cost_weight, spec.rate_weight)
        budget = dual[self.budget_row] if spec.budget is not None else 0.0
        cap = np.where(self.cap_row >= 0, dual[np.maximum(self.cap_row, 0)], 0.0)
        return Prices(
            cost_weight=weight[0] - budget,
            rate_weight=weight[1] - work,
            wall=dual[self.wall0 : self.wall0 + n],
            cap=cap,
            work_steps=spec.work_steps,
        )

    def solution(self) -> tuple[Columns, Array, Array]:
        values = np.asarray(self.h.getSolution().col_value)
        first = self.n_extra + self.n_art
        return Columns.concat(self.columns), values[first:], values[: self.n_extra]


def solve_by_columns(spec: Spec, source: OptionSource, seed: Columns, policy: str) -> Result | None:
    """The LP ``spec`` over every option of ``source``, by column generation from ``seed``
    (at least one option per job); ``None`` if infeasible.

    Artificial columns keep every restricted master feasible: a penalised one (big-M) first;
    if artificials are still in use when pricing finds nothing, a feasibility master (minimise
    the artificials) decides: it cannot reach 0 with every option priced, the LP is
    infeasible; it can, the penalty was too small and grows. The answer never depends on the
    penalty: the penalised LP relaxes the real one, so an optimum of it without artificials is
    the real optimum.
    """
    job_cost = seed.usd_per_hour * spec.work_steps[seed.job] / seed.steps_per_hour
    penalty = spec.penalty + PENALTY_FACTOR * spec.cost_weight * float(np.max(job_cost, initial=1.0))
    master = Master(spec, policy, penalty)
    master.add(seed)
    # reduced costs above -tol count as 0: HiGHS' own dual tolerance, in the objective's units
    scale = float(np.max(seed.usd_per_hour, initial=1.0)) if spec.cost_weight else 1.0
    tol = 1e-7 * scale
    rounds = 0

    def converge() -> tuple[float, Array]:
        nonlocal rounds
        while rounds < MAX_ROUNDS:
            rounds += 1
            objective, dual = master.run()
            new, lowest = price(source, master.prices(dual), ADD_PER_JOB, tol)
            if master.add(new) == 0:
                return objective, lowest
        raise PolicyError(f"{policy}: column generation did not converge in {MAX_ROUNDS} rounds")

    while True:
        objective, lowest = converge()
        if master.n_art == 0 or master.artificial().max() <= 1e-7:
            break
        master.set_objective(feasibility=True)
        if converge()[0] > 1e-7 * spec.n_jobs:
            return None
        master.penalty *= 1e3
        master.set_objective(feasibility=False)
    chosen, hours, extra = master.solution()
    wall = np.where(np.isfinite(spec.wall_upper), spec.wall_upper, 0.0)
    bound = objective + float(np.sum(wall * lowest)) if spec.cost_weight and spec.extra is None else None
    return Result(chosen, hours, extra, objective, bound, rounds)
