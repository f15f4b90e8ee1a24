"""Exact delayed column generation over a policy's cvxpy formulation.

Every policy writes its LP once, in cvxpy, over a given set of options (``Formulation.build``:
variables ``h >= 0`` for the options' job-hours, constraints in vectorised matrix form with the
``OptionRows`` matrices). All those LPs give an option the same *column shape*: option ``e`` of
job ``j`` on market ``m`` has entry ``a = T[e] / W[j]`` in job ``j``'s work row, ``1`` in its
wall-time row, ``s[e]`` in market ``m``'s capacity row (finite markets only), ``c[e]`` in the
budget row (if any), and objective ``cost_weight * c + rate_weight * a``.

Column generation solves the policy's cvxpy problem over a *restricted* set of options
(``seed_columns``), reads the duals of its named constraints (``constraint.dual_value``), and
prices every option in numpy with them: its reduced cost ``c_e - A_e^T y``. An option with a
negative one could lower the objective, so the most negative few per job join the restricted
set and the policy's problem is built again over it. When no option prices below ``-tol``
(HiGHS' dual tolerance 1e-7, scaled to the costs), the restricted optimum satisfies the full
LP's optimality conditions: it *is* the full LP's optimum, with no pruning heuristic anywhere.

Solving: cvxpy canonicalises the problem (``Problem.get_problem_data(cp.HIGHS)``: a few
hundredths of a second even at 70k columns, since everything is a sparse constant matrix) and
HiGHS, the pinned solver, solves cvxpy's data; ``Problem.unpack_results`` hands the values and
duals back to the cvxpy variables and constraints. ``run_highs`` builds the HiGHS model from
that data exactly as cvxpy's own HiGHS interface does, for one reason: after a round that added
only a few options, the next problem is the previous one plus a few columns, and HiGHS should
restart from the previous optimal *basis* (the new columns enter nonbasic, a few primal pivots
finish). cvxpy's ``warm_start`` only passes a previous solution of the *same* problem object.
Measured on the benchmark's 10k jobs × 5k markets: every round from scratch makes 4 interior
point solves of 2.2-2.8 s each (about 12 s end to end, summed from the measured rounds); from the basis,
the last two rounds take 0.05-0.15 s. A test checks that this path gives ``Problem.solve
(solver=cp.HIGHS)``'s optimum.

Feasibility: each work row gets an artificial column (``uncovered``) with a big-M cost, so
every restricted problem is feasible; the big M never changes the answer (see
``solve_by_columns``).

For the cost policies the last pricing round also gives a proof of optimality one can read:
with the wall-time rows kept as the set ``{h_j >= 0, sum h_j <= D_j}``, Lagrangian duality
gives ``LP >= master objective + sum_j D_j * min(0, min_e rc_e)`` (``bound``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import cvxpy as cp
import numpy as np
import scipy.sparse as sp

from spotopt.errors import PolicyError
from spotopt.policies.options import Array, Columns, OptionSource, Prices, price
from spotopt.stdio import native_stdout_discarded, native_stdout_to_stderr

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
class OptionRows:
    """The restricted options' columns as sparse constant matrices, built once per round.

    ``work`` (jobs × options): ``a = T / W`` (the share of the job's work one hour does);
    ``wall`` (jobs × options): 1; ``cap`` (finite markets × options): instances per job-hour;
    ``usd`` and ``a`` per option. ``finite``: the markets that have a capacity row, in row order.
    """

    work: sp.csr_matrix
    wall: sp.csr_matrix
    cap: sp.csr_matrix
    usd: Array
    a: Array
    finite: Array

    @property
    def n(self) -> int:
        return len(self.usd)

    @staticmethod
    def of(cols: Columns, work_steps: Array, capacity: Array) -> OptionRows:
        n_jobs, n, e = len(work_steps), len(cols), np.arange(len(cols))
        finite = np.flatnonzero(np.isfinite(capacity))
        row_of = np.full(len(capacity), -1)
        row_of[finite] = np.arange(len(finite))
        a = cols.steps_per_hour / work_steps[cols.job]
        on = np.flatnonzero(row_of[cols.market] >= 0)
        return OptionRows(
            work=sp.csr_matrix((a, (cols.job, e)), shape=(n_jobs, n)),
            wall=sp.csr_matrix((np.ones(n), (cols.job, e)), shape=(n_jobs, n)),
            cap=sp.csr_matrix(
                (cols.instances_per_hour[on], (row_of[cols.market[on]], on)), shape=(len(finite), n)
            ),
            usd=np.asarray(cols.usd_per_hour, dtype=float),
            a=a,
            finite=finite,
        )


@dataclass(frozen=True)
class MasterLP:
    """A policy's LP over some options, in cvxpy, with the constraints pricing reads by name.

    ``objective`` is minimised; ``h`` holds the options' variables; ``extra`` the policy's own
    variables (nonnegative, fixed sizes), whose values ``Result.extra`` returns concatenated.
    ``work`` (``>=``), ``wall``, ``cap``, ``budget`` (``<=``) are the rows an option's column
    enters (``None`` if the policy has no such row); ``others`` the rest.
    """

    objective: cp.Expression
    h: cp.Variable
    wall: cp.Constraint
    work: cp.Constraint | None = None
    cap: cp.Constraint | None = None
    budget: cp.Constraint | None = None
    extra: tuple[cp.Variable, ...] = ()
    others: tuple[cp.Constraint, ...] = ()

    def constraints(self) -> list[cp.Constraint]:
        named = [self.work, self.wall, self.cap, self.budget]
        return [c for c in named if c is not None] + list(self.others)


MasterFn = Callable[[OptionRows, "cp.Variable | None"], MasterLP]
"""Builds the policy's ``MasterLP`` over ``rows``; the second argument is the nonnegative
artificial per job to add to the work rows (``None`` when the policy has no work rows)."""


@dataclass(frozen=True)
class Formulation:
    """One policy's LP for column generation: its cvxpy builder and the options' column shape.

    ``cost_weight``/``rate_weight``: the objective's coefficient on an option is
    ``cost_weight * c + rate_weight * a`` (it must match ``build``; a test checks it);
    ``work``: the policy has work rows (and so artificials); ``penalty``: a base big M per job;
    ``bound_wall``: per job, the wall-time limit for the Lagrangian bound (cost policies).
    """

    work_steps: Array
    capacity: Array
    build: MasterFn
    cost_weight: float = 0.0
    rate_weight: float = 0.0
    work: bool = True
    penalty: float = 0.0
    bound_wall: Array | None = None

    @property
    def n_jobs(self) -> int:
        return len(self.work_steps)


@dataclass(frozen=True)
class Result:
    columns: Columns
    hours: Array
    extra: Array
    objective: float
    bound: float | None
    """A proven lower bound on the full LP's optimum (cost policies; ``None`` otherwise)."""
    rounds: int


@dataclass
class Solved:
    """A solved restricted problem: the cvxpy objects (values and duals filled in) and HiGHS' basis."""

    problem: cp.Problem
    lp: MasterLP
    uncovered: cp.Variable | None
    basis: Any
    layout: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per variable role (``h``, ``uncovered``, ``extra0``...): (first column, size) in cvxpy's data."""


def run_highs(data: dict[str, Any], options: dict[str, Any], basis: Any = None) -> dict[str, Any]:
    """Solve cvxpy's canonical HiGHS data (``Problem.get_problem_data(cp.HIGHS)``), optionally
    from ``basis``; returns results in the form cvxpy's HiGHS interface gives ``unpack_results``.

    The model is built as cvxpy's interface builds it (``min c x``, equality rows first, then
    ``A x <= b``, column bounds), so values and duals map back identically.
    """
    import highspy

    dims = data[cp.settings.DIMS]
    n_eq = dims.zero
    b = np.asarray(data[cp.settings.B], dtype=float)
    a = sp.csc_matrix(data[cp.settings.A])
    model = highspy.HighsLp()
    model.num_col_, model.num_row_ = a.shape[1], a.shape[0]
    model.col_cost_ = np.asarray(data[cp.settings.C], dtype=float)
    model.row_lower_ = np.r_[b[:n_eq], np.full(len(b) - n_eq, -highspy.kHighsInf)]
    model.row_upper_ = b
    lower, upper = data[cp.settings.LOWER_BOUNDS], data[cp.settings.UPPER_BOUNDS]
    model.col_lower_ = np.full(a.shape[1], -highspy.kHighsInf) if lower is None else lower
    model.col_upper_ = np.full(a.shape[1], highspy.kHighsInf) if upper is None else upper
    model.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    model.a_matrix_.start_ = a.indptr
    model.a_matrix_.index_ = a.indices
    model.a_matrix_.value_ = a.data
    with native_stdout_to_stderr():  # whatever HiGHS still prints stays off stdout
        with native_stdout_discarded():  # its banner, printed by the constructor before any option
            h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("log_to_console", False)
        h.setOptionValue("random_seed", 0)
        for name, value in options.items():
            h.setOptionValue(name, value)
        h.passModel(model)
        if basis is not None:
            h.setBasis(basis)
        h.run()
    return {
        "solution": h.getSolution(),
        "basis": h.getBasis(),
        "info": h.getInfo(),
        "model_status": h.getModelStatus().name,
        "run_time": h.getRunTime(),
    }


class Master:
    """The restricted master: the policy's cvxpy problem over the options added so far."""

    def __init__(self, form: Formulation, policy: str, penalty: float) -> None:
        self.form, self.policy, self.penalty = form, policy, penalty
        self.columns: list[Columns] = []
        self.keys = np.zeros(0, dtype=np.int64)
        self.feasibility = False
        self.added = 0
        self.last: Solved | None = None

    def add(self, cols: Columns) -> int:
        """Append the options not yet in the master; returns how many were new."""
        fresh = cols.take(np.flatnonzero(~np.isin(cols.key, self.keys)))
        if len(fresh) == 0:
            return 0
        self.columns.append(fresh)
        self.keys = np.union1d(self.keys, fresh.key)
        self.added += len(fresh)
        return len(fresh)

    def problem(self) -> Solved:
        """The policy's problem over the current options: its objective plus the penalised
        artificials, or (``feasibility``) the artificials' sum alone."""
        form = self.form
        rows = OptionRows.of(Columns.concat(self.columns), form.work_steps, form.capacity)
        uncovered = cp.Variable(form.n_jobs, nonneg=True) if form.work else None
        lp = form.build(rows, uncovered)
        if uncovered is None:
            objective = lp.objective
        elif self.feasibility:
            objective = cp.sum(uncovered)
        else:
            objective = lp.objective + self.penalty * cp.sum(uncovered)
        return Solved(cp.Problem(cp.Minimize(objective), lp.constraints()), lp, uncovered, None)

    def run(self) -> float:
        """Solve the restricted problem; its objective.

        After a few new columns, from the previous basis (a few primal pivots); after many
        (more than ``WARM_FRACTION`` of the master), from scratch: with presolve, and on a big
        master (``IPM_COLUMNS``) by HiGHS' interior point method with crossover. Measured on the
        benchmark's first master (23k rows): 10k jobs × 5k markets, dual simplex 35 s, IPM 2-4 s;
        warm primal pivots after 30k new columns were slower than either.
        """
        solved = self.problem()
        data, chain, inverse = solved.problem.get_problem_data(cp.HIGHS, ignore_dpp=True)
        solved.layout = _layout(solved, data)
        basis = self._warm_basis(solved, data) if self.added <= WARM_FRACTION * len(self.keys) else None
        n = int(solved.layout["h"][1])
        if basis is not None:
            options = {"presolve": "off", "solver": "simplex"}
        else:
            options = {"presolve": "on", "solver": "ipm" if n >= IPM_COLUMNS else "simplex"}
        results = run_highs(data, options, basis)
        if results["model_status"] != "kOptimal":
            raise PolicyError(f"{self.policy}: HiGHS ended with status {results['model_status']!r}")
        solved.problem.unpack_results(results, chain, inverse)
        solved.basis = results["basis"]
        self.last, self.added = solved, 0
        return float(solved.problem.value)

    def _warm_basis(self, solved: Solved, data: dict[str, Any]) -> Any:
        """The previous optimal basis, extended to this problem: the same rows, every variable
        where it was, new option columns nonbasic at their lower bound 0; ``None`` if the rows differ."""
        import highspy

        old = self.last
        if old is None or old.basis is None or not old.basis.valid:
            return None
        n_rows = sp.csc_matrix(data[cp.settings.A]).shape[0]
        if len(old.basis.row_status) != n_rows or old.layout.keys() != solved.layout.keys():
            return None
        n_cols = sum(size for _, size in solved.layout.values())
        col_status = np.full(n_cols, highspy.HighsBasisStatus.kLower, dtype=object)
        old_status = np.asarray(list(old.basis.col_status), dtype=object)
        for role, (start, size) in solved.layout.items():
            old_start, old_size = old.layout[role]
            keep = min(size, old_size)
            col_status[start : start + keep] = old_status[old_start : old_start + keep]
        basis = highspy.HighsBasis()
        basis.col_status = list(col_status)
        basis.row_status = list(old.basis.row_status)
        basis.valid = True
        return basis

    def prices(self) -> Prices:
        """Pricing data from the duals (cvxpy's sign: ``>=`` and ``<=`` duals both ``>= 0``)."""
        assert self.last is not None
        lp, n = self.last.lp, self.form.n_jobs

        def dual(c: cp.Constraint | None, size: int) -> Array:
            return np.zeros(size) if c is None else np.reshape(np.asarray(c.dual_value, dtype=float), size)

        weight = (0.0, 0.0) if self.feasibility else (self.form.cost_weight, self.form.rate_weight)
        cap = np.zeros(len(self.form.capacity))
        finite = np.flatnonzero(np.isfinite(self.form.capacity))
        cap[finite] = -dual(lp.cap, len(finite))
        return Prices(
            cost_weight=weight[0] + float(dual(lp.budget, 1)[0]),
            rate_weight=weight[1] - dual(lp.work, n),
            wall=-dual(lp.wall, n),
            cap=cap,
            work_steps=self.form.work_steps,
        )

    def artificial(self) -> Array:
        """Current values of the artificial columns (uncovered fraction of each job's work)."""
        assert self.last is not None
        if self.last.uncovered is None:
            return np.zeros(0)
        return np.asarray(self.last.uncovered.value, dtype=float)

    def solution(self) -> tuple[Columns, Array, Array]:
        assert self.last is not None
        lp = self.last.lp
        values = [np.ravel(np.asarray(v.value, dtype=float)) for v in lp.extra]
        extra = np.concatenate(values) if values else np.zeros(0)
        return Columns.concat(self.columns), np.asarray(lp.h.value, dtype=float), extra


def _layout(solved: Solved, data: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Where cvxpy put each variable among the data's columns, by role."""
    offsets = data[cp.settings.PARAM_PROB].var_id_to_col
    roles: dict[str, cp.Variable] = {"h": solved.lp.h}
    if solved.uncovered is not None:
        roles["uncovered"] = solved.uncovered
    roles.update({f"extra{i}": v for i, v in enumerate(solved.lp.extra)})
    return {role: (int(offsets[v.id]), int(v.size)) for role, v in roles.items()}


def solve_by_columns(form: Formulation, source: OptionSource, seed: Columns, policy: str) -> Result | None:
    """The LP ``form`` over every option of ``source``, by column generation from ``seed``
    (at least one option per job); ``None`` if infeasible.

    Artificial columns keep every restricted master feasible: a penalised one (big-M) first;
    if artificials are still in use when pricing finds nothing, a feasibility master (minimise
    the artificials) decides: it cannot reach 0 with every option priced, the LP is
    infeasible; it can, the penalty was too small and grows. The answer never depends on the
    penalty: the penalised LP relaxes the real one, so an optimum of it without artificials is
    the real optimum.
    """
    job_cost = seed.usd_per_hour * form.work_steps[seed.job] / seed.steps_per_hour
    penalty = form.penalty + PENALTY_FACTOR * form.cost_weight * float(np.max(job_cost, initial=1.0))
    master = Master(form, policy, penalty)
    master.add(seed)
    # reduced costs above -tol count as 0: HiGHS' own dual tolerance, in the objective's units
    scale = float(np.max(seed.usd_per_hour, initial=1.0)) if form.cost_weight else 1.0
    tol = 1e-7 * scale
    rounds = 0

    def converge() -> tuple[float, Array]:
        nonlocal rounds
        while rounds < MAX_ROUNDS:
            rounds += 1
            objective = master.run()
            new, lowest = price(source, master.prices(), ADD_PER_JOB, tol)
            if master.add(new) == 0:
                return objective, lowest
        raise PolicyError(f"{policy}: column generation did not converge in {MAX_ROUNDS} rounds")

    while True:
        objective, lowest = converge()
        if not form.work or master.artificial().max() <= 1e-7:
            break
        master.feasibility = True
        if converge()[0] > 1e-7 * form.n_jobs:
            return None
        master.penalty *= 1e3
        master.feasibility = False
    chosen, hours, extra = master.solution()
    bound = None
    if form.cost_weight and form.bound_wall is not None:
        bound = objective + float(np.sum(form.bound_wall * lowest))
    return Result(chosen, hours, extra, objective, bound, rounds)
