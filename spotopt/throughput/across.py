"""A job's one-GPU steps/s on a GPU model it was not measured on, from the reference workloads.

Log steps/s as a matrix, workloads × GPU models (the job one of its rows), completed by a
low-rank model (Gavel's matrix completion, seed 002 §5.3.3, with a hardware prior):

    y[w, g] = a[w] + b[g] + u[w]·v[g]

``a`` is a workload's size, ``b`` a GPU model's speed, ``u·v`` the rank-one interaction (a
workload bound by memory bandwidth gains less from a GPU with more FLOP/s). ``b`` is pulled
towards the GPU's datasheet prior ``c + beta·h[g]``, ``h`` the log of the geometric mean of its
peak compute and memory bandwidth (half of each, compute split between 16-bit and FP32 as the
job's precision is unknown), so a GPU model with no reference still has a speed; ``beta`` is
fitted where three or more GPU models have references. The job's own ``u`` comes from its
residuals on the kinds it has (none with one kind known: then it is the additive model).

The interval: the same estimate made for each reference workload that has the target GPU,
from its figures on the job's known GPUs only, without it (leave one out), gives log errors;
their root mean square is the sigma of a normal interval. With fewer than ``MIN_RESIDUALS`` of
them, the prior sigma (``SIGMA_PRIOR``) stands in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from spotopt.catalog import gpu_models

Z80 = 1.2815515655446004
"""Standard normal quantile of 0.9: an 80 % two-sided interval is ``exp(±Z80·sigma)``."""
PRIOR_WEIGHT = 0.1
"""Weight of a GPU's hardware prior against one observed log figure (ridge on ``b``)."""
BETA = 0.7
"""Slope of speed on the hardware prior where too few GPU models have references to fit it
(tuned on the dev split; datasheet peaks overstate real speed-ups)."""
RANK_RIDGE = 1.0
"""Shrinkage of the rank-one interaction (the job's ``u`` and the references')."""
SIGMA_PRIOR = 0.45
"""Log-error sigma where too few references allow leave-one-out (tuned on the dev split)."""
MIN_RESIDUALS = 3
HUBER = 0.1
"""Log residual beyond which a figure counts linearly, not squared (a robust fit: the median
ratio is what the baseline uses, and one workload's odd figure on a GPU must not move it)."""

Table = tuple[tuple[str, tuple[tuple[str, float], ...]], ...]
"""Hashable references: ((workload, ((gpu_model, log steps/s), ...)), ...)."""


@dataclass(frozen=True, slots=True)
class Estimate:
    log_steps: float
    sigma: float
    references: tuple[str, ...]
    note: str

    @property
    def steps_per_s(self) -> float:
        return math.exp(self.log_steps)

    @property
    def low(self) -> float:
        return math.exp(self.log_steps - Z80 * self.sigma)

    @property
    def high(self) -> float:
        return math.exp(self.log_steps + Z80 * self.sigma)


@lru_cache(maxsize=512)
def hardware_prior(gpu_model: str) -> float | None:
    model = gpu_models().get(gpu_model)
    if model is None:
        return None
    compute = 0.5 * (math.log(model.fp16_tflops) + math.log(model.fp32_tflops))
    return 0.5 * compute + 0.5 * math.log(model.memory_bandwidth_gbs)


def table(refs: Mapping[str, Mapping[str, float]]) -> Table:
    """``refs`` (workload → GPU model → steps/s) as the hashable log table the fits cache on."""
    return tuple(
        (w, tuple(sorted((g, math.log(v)) for g, v in figs.items())))
        for w, figs in sorted(refs.items())
        if figs
    )


def _fit(rows: Table, job: tuple[tuple[str, float], ...], target: str) -> float | None:
    """The job's log steps/s on ``target`` from the reference rows and its own known figures."""
    gpus = sorted({g for _, figs in rows for g, _ in figs} | {g for g, _ in job} | {target})
    prior = {g: hardware_prior(g) for g in gpus}
    if target not in {g for _, figs in rows for g, _ in figs} and prior[target] is None:
        return None
    col = {g: i for i, g in enumerate(gpus)}
    all_rows = [*rows, ("", job)]
    n_w, n_g = len(all_rows), len(gpus)
    with_prior = [g for g in gpus if prior[g] is not None]
    observed_gpus = {g for _, figs in all_rows for g, _ in figs}
    fit_beta = len(observed_gpus & set(with_prior)) >= 3
    n_x = n_w + n_g + 1 + (1 if fit_beta else 0)  # a, b, c[, beta]
    design: list[np.ndarray] = []
    rhs: list[float] = []
    for i, (_, figs) in enumerate(all_rows):
        for g, y in figs:
            row = np.zeros(n_x)
            row[i] = 1.0
            row[n_w + col[g]] = 1.0
            design.append(row)
            rhs.append(y)
    root = math.sqrt(PRIOR_WEIGHT)
    for g in with_prior:
        row = np.zeros(n_x)
        row[n_w + col[g]] = root
        row[n_w + n_g] = -root
        h = prior[g]
        assert h is not None
        if fit_beta:
            row[n_w + n_g + 1] = -root * h
            rhs.append(0.0)
        else:
            rhs.append(root * BETA * h)
        design.append(row)
    if fit_beta:  # beta itself weakly towards BETA, so two GPU models cannot swing it
        row = np.zeros(n_x)
        row[n_w + n_g + 1] = root
        design.append(row)
        rhs.append(root * BETA)
    A, values = np.asarray(design), np.asarray(rhs)
    n_obs = len(rhs) - len(with_prior) - (1 if fit_beta else 0)
    weight = np.ones(len(rhs))
    for _ in range(20):  # Huber by reweighting: one odd figure must not move a GPU model's speed
        x, *_ = np.linalg.lstsq(A * weight[:, None], values * weight, rcond=None)
        r = np.abs(A[:n_obs] @ x - values[:n_obs])
        weight[:n_obs] = np.sqrt(np.minimum(1.0, HUBER / np.maximum(r, 1e-12)))
    a, b = x[:n_w], x[n_w : n_w + n_g]
    if target not in observed_gpus and prior[target] is None:
        return None
    base = float(a[-1] + b[col[target]])
    return base + _interaction(all_rows, a, b, col, target)


def _interaction(
    rows: list[tuple[str, tuple[tuple[str, float], ...]]],
    a: np.ndarray,
    b: np.ndarray,
    col: dict[str, int],
    target: str,
) -> float:
    """``u_job · v_target`` of the rank-one fit of the references' residuals (0 when the job has
    one known kind, the target no reference, or nothing to fit)."""
    job = rows[-1][1]
    if len(job) < 2:
        return 0.0
    resid = np.full((len(rows) - 1, len(col)), np.nan)
    for i, (_, figs) in enumerate(rows[:-1]):
        for g, y in figs:
            resid[i, col[g]] = y - a[i] - b[col[g]]
    seen = ~np.isnan(resid)
    if not seen[:, col[target]].any():
        return 0.0
    r = np.where(seen, resid, 0.0)
    u = np.ones(len(rows) - 1)
    v = np.zeros(len(col))
    for _ in range(30):  # alternating least squares on the observed cells, ridge RANK_RIDGE
        v = (r * u[:, None]).sum(0) / ((seen * u[:, None] ** 2).sum(0) + RANK_RIDGE)
        u = (r * v[None, :]).sum(1) / ((seen * v[None, :] ** 2).sum(1) + RANK_RIDGE)
    mine = [(col[g], y - a[-1] - b[col[g]]) for g, y in job]
    u_job = sum(e * v[j] for j, e in mine) / (sum(v[j] ** 2 for j, _ in mine) + RANK_RIDGE)
    return float(u_job * v[col[target]])


@lru_cache(maxsize=4096)
def _sigma(rows: Table, known: tuple[str, ...], target: str) -> tuple[float, int]:
    """Leave-one-out log errors of the estimate for each reference that has ``target`` and some
    of ``known``: (their root mean square, how many), or (SIGMA_PRIOR, 0) with too few."""
    errors: list[float] = []
    for i, (_, figs) in enumerate(rows):
        mine = dict(figs)
        given = tuple((g, mine[g]) for g in known if g in mine)
        if target not in mine or not given:
            continue
        others = rows[:i] + rows[i + 1 :]
        guess = _fit(others, given, target)
        if guess is not None:
            errors.append(guess - mine[target])
    if len(errors) < MIN_RESIDUALS:
        return SIGMA_PRIOR, len(errors)
    n = len(errors)
    return math.sqrt(sum(e * e for e in errors) / n * (1 + 1 / n)), n


def estimate(rows: Table, known: Mapping[str, float], target: str) -> Estimate | None:
    """The job's one-GPU steps/s on ``target`` from its known one-GPU figures (GPU model →
    steps/s, exact models) and the reference ``rows``; None without a known figure, or when
    the target has neither references nor a datasheet prior."""
    if not known:
        return None
    job = tuple(sorted((g, math.log(v)) for g, v in known.items()))
    guess = _fit(rows, job, target)
    if guess is None:
        return None
    sigma, n = _sigma(rows, tuple(g for g, _ in job), target)
    on_target = tuple(w for w, figs in rows if any(g == target for g, _ in figs))
    kinds = ", ".join(g for g, _ in job)
    if on_target:
        basis = f"references on {target}: {', '.join(on_target)}"
    else:
        basis = f"no reference on {target}: its datasheet prior"
    spread = f"interval from {n} leave-one-out references" if n else "interval from the prior spread"
    note = f"estimated from the job on {kinds}; {basis}; {spread}"
    return Estimate(guess, sigma, on_target or tuple(w for w, _ in rows), note)
