"""A job's one-GPU steps/s on a GPU model it was not measured on, from the reference workloads.

Log steps/s as a matrix, workloads × GPU models (the job one of its rows), completed by a
low-rank model (Gavel's matrix completion, seed 002 §5.3.3, with a hardware prior):

    y[w, g] = a[w] + s[w]·b[g]

``b`` is a GPU model's speed, fitted (robustly) on the references as ``a[w] + b[g]`` and pulled
towards the GPU's datasheet prior ``c + beta·h[g]``, ``h`` the log of the geometric mean of its
peak compute and memory bandwidth (half of each, compute split between 16-bit and FP32 as the
job's precision is unknown), so a GPU model with no reference still has a speed; ``beta`` is
fitted where three or more GPU models have references. ``a`` is the job's size and ``s`` how
much it gains from a faster GPU (the rank-one interaction with ``b`` as the GPU factor: a
host-bound workload gains nothing, ``s`` near 0): a regression on the job's own known figures,
``s`` shrunk towards the references' 1 by how far apart its known kinds are in ``b`` (one kind
known: ``s = 1``, the additive model) and kept within the references' own slopes.

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
SLOPE_RIDGE = 0.1
"""Prior weight on a job's slope being the references' (1), against its known figures' spread in
``b`` (squared): the noise variance of one log figure over the variance of workloads' slopes
(about 0.04 / 0.4 over the dev references' own fits; 0.1 chosen on the tune split)."""
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


def _gpu_speeds(rows: Table, gpus: list[str], prior: dict[str, float | None]) -> dict[str, float]:
    """``b``: each GPU model's log speed from the references' additive fit ``a[w] + b[g]``, pulled
    towards its datasheet prior; only the GPU models a reference or a datasheet pins down."""
    col = {g: i for i, g in enumerate(gpus)}
    n_w, n_g = len(rows), len(gpus)
    with_prior = [g for g in gpus if prior[g] is not None]
    observed_gpus = {g for _, figs in rows for g, _ in figs}
    fit_beta = len(observed_gpus & set(with_prior)) >= 3
    n_x = n_w + n_g + 1 + (1 if fit_beta else 0)  # a, b, c[, beta]
    design: list[np.ndarray] = []
    rhs: list[float] = []
    for i, (_, figs) in enumerate(rows):
        for g, y in figs:
            row = np.zeros(n_x)
            row[i] = 1.0
            row[n_w + col[g]] = 1.0
            design.append(row)
            rhs.append(y)
    n_obs = len(rhs)
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
    weight = np.ones(len(rhs))
    for _ in range(20):  # Huber by reweighting: one odd figure must not move a GPU model's speed
        x, *_ = np.linalg.lstsq(A * weight[:, None], values * weight, rcond=None)
        r = np.abs(A[:n_obs] @ x - values[:n_obs])
        weight[:n_obs] = np.sqrt(np.minimum(1.0, HUBER / np.maximum(r, 1e-12)))
    pinned = observed_gpus | set(with_prior)
    return {g: float(x[n_w + col[g]]) for g in gpus if g in pinned}


def _slope_range(rows: Table, b: Mapping[str, float]) -> tuple[float, float]:
    """The least-squares slopes of the references' log figures on ``b``, as (lowest but at
    least 0, highest): a job gains from a faster GPU no less than nothing and no more than some
    reference does (two known figures, one of them odd, can imply any slope)."""
    slopes = [1.0]  # the references' own slope on b, which one known kind takes
    for _, figs in rows:
        x = np.array([b[g] for g, _ in figs])
        if len(x) > 1 and np.ptp(x) > 1e-9:
            slopes.append(float(np.polyfit(x, [y for _, y in figs], 1)[0]))
    return max(0.0, min(slopes)), max(slopes)


def _fit(rows: Table, job: tuple[tuple[str, float], ...], target: str) -> float | None:
    """The job's log steps/s on ``target``: its own intercept and slope on the GPU speeds ``b``
    fitted to its known figures, the slope shrunk towards the references' 1 by ``SLOPE_RIDGE``
    (so one known kind is the additive model, and two close GPU models barely tilt it) and kept
    within the references' range (``_slope_range``); None when ``target`` or every known kind
    has neither references nor a datasheet prior."""
    gpus = sorted({g for _, figs in rows for g, _ in figs} | {g for g, _ in job} | {target})
    b = _gpu_speeds(rows, gpus, {g: hardware_prior(g) for g in gpus})
    mine = [(b[g], y) for g, y in job if g in b]
    if target not in b or not mine:
        return None
    x, y = np.array(mine).T
    dx, dy = x - x.mean(), y - y.mean()
    slope = (float(dx @ dy) + SLOPE_RIDGE) / (float(dx @ dx) + SLOPE_RIDGE)
    slope = float(np.clip(slope, *_slope_range(rows, b)))
    return float(y.mean() + slope * (b[target] - x.mean()))


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
