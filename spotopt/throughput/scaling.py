"""Steps/s on several GPUs and nodes: Rubick's iteration time (seed 001 §4, seed 000 appendix A)
for data-parallel training, with a term for the GPUs of one node contending for its host.

A step is one GPU's share of work (what one GPU does in a one-GPU step), so ``d`` GPUs that
each take ``I(d)`` seconds per synchronised iteration make ``d / I(d)`` steps/s. One iteration
of ``d`` GPUs over ``n`` nodes, ``g = ceil(d/n)`` GPUs on each:

    I = T1 · (PHI + ((1 - PHI)^k + (y / T1)^k)^(1/k)) + T1 · c · (g - 1),
    y = 2(d-1)/d · G / B(n)

``T1`` is the one-GPU step time (Rubick's forward, backward, optimizer and per-step constant
``k_const`` together: with the per-GPU batch fixed, as in data-parallel scaling, none of them
changes with ``d``), ``PHI`` its part that cannot overlap the gradient all-reduce (forward,
optimizer, constant); the backward part overlaps the all-reduce of ``y`` seconds through
Rubick's ``(x^k + y^k)^(1/k)`` (``k = 1``: no overlap, large ``k``: perfect). A ring all-reduce
moves ``2(d-1)/d`` of the gradients' ``G`` bytes through each GPU's slowest link ``B``: the link
between the GPUs inside a node (NVLink/NVSwitch or PCIe, one direction), and across nodes the
node's network. ``G`` is the job's own (its model's gradients), so it carries over between GPU
models; ``T1`` is per GPU model.

The last term is what measured one-node scaling shows beside the all-reduce (Sia's and
Pollux's traces, whose model has it as a sync time linear in the GPU count): the GPUs of one
node share its CPUs (data loading), host memory and PCIe root, so each extra GPU on the node
costs a share ``c`` of a step, however the node is networked. It is why a fast link does not
make one-node scaling free, and why one node's losses do not predict a network's: ``c`` takes
the one-node losses, ``G`` the losses across nodes.

Fitting: the log step times of the job's points, least squares (RMSLE, as Rubick fits), with
priors that keep the parameters honest for the number of points: ``ln G`` towards the hardware
default ``G = T1 · peak FLOP/s / FLOP_PER_GRADIENT_BYTE`` (a faster GPU on the same link is the
more communication-bound), ``c`` towards ``CONTENTION``; with one point both are their
defaults, with 1- and 2-GPU points ``c`` is what the pair shows, and ``G`` moves only as far as
points across nodes pull it. ``k`` is fitted only where three or more multi-GPU points pin it.
A figure's spread is the model's leave-one-out error on the job's points, widened by its
distance from them (``ScalingFit.log_sigma``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np

from spotopt.catalog import Interconnect, gpu_models, instance_types, interconnects

PHI = 1 / 3
"""Share of a one-GPU step that cannot overlap the all-reduce (the forward pass: Rubick's
T_bwd ≈ 2 T_fwd; the optimizer and constant are small beside it). It matters only when k > 1."""
OVERLAP_K = 1.0
"""Default overlap exponent between backward compute and the all-reduce (tuned on the dev split)."""
FLOP_PER_GRADIENT_BYTE = 1e5
"""Default arithmetic of one step per byte of gradients, at the GPU's peak 16-bit rate: with it a
job computing for ``T1`` seconds communicates ``T1 · peak / 1e5`` bytes (tuned on the dev split;
the default ``G`` across nodes)."""
CONTENTION = 0.01
"""Default share of a step each extra GPU on a node costs (shared host; tuned on the dev split)."""
PRIOR_WEIGHT = 0.1
"""Weight of the default ``ln G`` against one log residual: a node's own points cannot tell the
all-reduce from contention, so ``G`` stays near its default until points across nodes move it."""
CONTENTION_WEIGHT = 0.3
"""Weight of the default ``c`` (in shares of a step) against one log residual (tuned on the dev
split): a pair of 1- and 2-GPU points sets ``c``; a single point keeps the default."""
SCALING_SIGMA = 0.10
"""Log-error of a multi-GPU figure scaled from the one-GPU figure (tuned on the dev split)."""
EXTRAPOLATION_SIGMA = 0.15
"""Log-error added per unit of ln(count / nearest measured count) (tuned on the dev split)."""
NETWORK_SIGMA = 0.10
"""Log-error added where the figure crosses more nodes than any of the job's points (tuned on
the dev split): the network's share is then the hardware default or an extrapolation."""
PCIE3_GBS = 32.0
"""The link assumed for a GPU that no catalog instance type has (PCIe gen3 x16, both directions)."""
NETWORK_GBPS = 25.0
"""The network assumed across nodes where the catalog gives none (a common 25 Gbit/s)."""


@dataclass(frozen=True, slots=True)
class Topology:
    """Where the GPUs of one job sit: ``gpus_per_node`` share ``link_gbs`` (per GPU, both
    directions), nodes share ``network_gbps``."""

    gpus_per_node: int
    link_gbs: float
    network_gbps: float

    def bandwidth_bytes_s(self, nodes: int) -> float:
        """The all-reduce's bottleneck, bytes/s one way: the GPU link, and across nodes the network."""
        inside = self.link_gbs / 2 * 1e9
        return inside if nodes <= 1 else min(inside, self.network_gbps / 8 * 1e9)


def topology_of(link: Interconnect, gpus_per_node: int) -> Topology:
    return Topology(gpus_per_node, link.gpu_link_gbs, link.network_gbps or NETWORK_GBPS)


@cache
def default_topology(gpu_model: str) -> Topology:
    """The GPU model's largest catalog instance type (most GPUs, then the fastest link): the node
    a multi-GPU job of that model runs on when nothing names the instance type."""
    links = interconnects()
    best: tuple[float, float, Topology] | None = None
    for spec in instance_types():
        if spec.gpu_model != gpu_model or not spec.gpu_count or spec.gpu_count < 1:
            continue
        link = links[(spec.cloud, spec.name)]
        key = (spec.gpu_count, link.gpu_link_gbs, topology_of(link, int(spec.gpu_count)))
        if best is None or key[:2] > best[:2]:
            best = key
    return best[2] if best is not None else Topology(8, PCIE3_GBS, NETWORK_GBPS)


def nodes_for(gpus: int, topology: Topology) -> int:
    return max(1, math.ceil(gpus / topology.gpus_per_node))


def _volume(gpus: int) -> float:
    return 2.0 * (gpus - 1) / gpus


def iteration_ratio(gpus: int, nodes: int, comm_s: float, k: float, contention: float) -> float:
    """``I / T1`` for ``gpus`` over ``nodes`` where a full all-reduce of the gradients at the
    bottleneck link takes ``comm_s`` seconds per second of one-GPU step (``G / (B · T1)``) and
    each extra GPU on a node costs ``contention`` of a step."""
    if gpus <= 1:
        return 1.0
    y = _volume(gpus) * comm_s
    x = 1.0 - PHI
    per_node = math.ceil(gpus / nodes)
    return PHI + (x**k + y**k) ** (1.0 / k) + contention * (per_node - 1)


@dataclass(frozen=True, slots=True)
class Point:
    """One measured figure: steps/s on ``gpus`` GPUs of ``gpu_model`` over ``nodes`` nodes."""

    gpu_model: str
    gpus: int
    nodes: int
    steps_per_s: float
    topology: Topology


@dataclass(frozen=True)
class ScalingFit:
    """The job's fitted iteration-time model: one-GPU step time per GPU model that has points,
    gradient bytes ``grad_bytes`` (None: the hardware default), the node contention ``contention``,
    overlap ``k``, and how well it predicts its own points left out (``sigma``, log)."""

    step_s: Mapping[str, float]
    grad_bytes: float | None
    contention: float
    k: float
    sigma: float
    points: int
    placements: frozenset[tuple[int, int]] = frozenset()

    def log_sigma(self, gpus: int, nodes: int) -> float:
        """Log-error of the figure on ``gpus`` GPUs over ``nodes``: the fit's own ``sigma``, and
        more the farther the figure lies from the job's points. The residuals of the points only
        say how well the model passes through them; a count far beyond them (ln of the ratio to
        the nearest measured count) and a network no point crossed are extrapolations whose
        error the data shows growing (Sia's traces: 8 GPUs from 1 and 2 miss by twice what 4
        do, and nodes from one node's points miss by more than counts on it)."""
        if not self.placements or gpus <= 1:
            return self.sigma
        nearest = min(abs(math.log(gpus / g)) for g, _ in self.placements)
        network = nodes > max(n for _, n in self.placements)
        return math.hypot(self.sigma, EXTRAPOLATION_SIGMA * nearest, NETWORK_SIGMA if network else 0.0)

    def steps_per_s(self, one_gpu: float, gpu_model: str, gpus: int, nodes: int, topology: Topology) -> float:
        """Steps/s on ``gpus`` GPUs over ``nodes`` from the one-GPU figure ``one_gpu``."""
        if gpus <= 1:
            return one_gpu
        t1 = 1.0 / one_gpu
        grad = self.grad_bytes if self.grad_bytes is not None else default_grad_bytes(gpu_model, t1)
        comm = grad / topology.bandwidth_bytes_s(nodes) / t1
        return gpus / (t1 * iteration_ratio(gpus, nodes, comm, self.k, self.contention))


def default_grad_bytes(gpu_model: str, step_s: float) -> float:
    """Gradient bytes of a job that takes ``step_s`` on one ``gpu_model`` (hardware default)."""
    model = gpu_models().get(gpu_model)
    peak = (model.fp16_tflops if model is not None else 100.0) * 1e12
    return step_s * peak / FLOP_PER_GRADIENT_BYTE


FIT_CACHE_SIZE = 4096
"""Fits kept per process: a daemon refits every job each round from the same stored points,
and a fit is one least-squares solve per point (its leave-one-out spread), 0.8 s at 16 points."""


def fit(points: Sequence[Point]) -> ScalingFit:
    """``_fit_with_spread`` of ``points``, computed once per set of points in a process."""
    return _fit_with_spread(tuple(points))


@lru_cache(maxsize=FIT_CACHE_SIZE)
def _fit_with_spread(points: tuple[Point, ...]) -> ScalingFit:
    """The job's iteration-time model (``_fit``) with its spread ``sigma``: the root mean square
    of its leave-one-out log residuals, each point predicted by the model fitted to the others
    (at least ``SCALING_SIGMA``). The residuals of the points themselves cannot say how far off
    the model is: with 1, 2, 4 and 8 GPUs, three constants pass near any four points, so a job
    whose points jump about (a host-bound workload) got the same spread as a smooth one. Left
    out, a point is a small extrapolation of the job's own: how well the model predicts them is
    how well it predicts the next one."""
    model = _fit(points)
    misses = [m for m in (_left_out(points, i) for i in range(len(points))) if m is not None]
    sigma = math.sqrt(float(np.mean(np.square(misses)))) if misses else SCALING_SIGMA
    return dataclasses.replace(model, sigma=max(sigma, SCALING_SIGMA))


def _left_out(points: Sequence[Point], i: int) -> float | None:
    """ln(predicted / measured) of point ``i`` by the model fitted to the other points, from
    their one-GPU figure on its GPU model where measured, as ``JobThroughput`` scales it (None:
    no other point on its GPU model)."""
    left = points[i]
    rest = [p for j, p in enumerate(points) if j != i]
    if not any(p.gpu_model == left.gpu_model for p in rest):
        return None
    model = _fit(rest)
    ones = [p.steps_per_s for p in rest if p.gpu_model == left.gpu_model and p.gpus == 1]
    one = ones[0] if ones else 1.0 / model.step_s[left.gpu_model]
    predicted = model.steps_per_s(one, left.gpu_model, left.gpus, left.nodes, left.topology)
    return math.log(predicted / left.steps_per_s)


def _fit(points: Sequence[Point]) -> ScalingFit:
    """Fit ``T1`` per GPU model, ``G``, ``c`` and (with three multi-GPU points or more) ``k`` by
    least squares on log steps/s, each of ``G``, ``c``, ``k`` pulled towards its default; its
    ``sigma`` is ``SCALING_SIGMA`` until ``fit`` sets it."""
    if not points:
        return ScalingFit({}, None, CONTENTION, OVERLAP_K, SCALING_SIGMA, 0)
    gpus_of = sorted({p.gpu_model for p in points})
    n_t = len(gpus_of)
    multi = [p for p in points if p.gpus > 1]
    fit_k = len({(p.gpu_model, p.gpus, p.nodes) for p in multi}) >= 3
    # starting values: T1 from each model's points as if scaling were perfect
    t0 = [math.log(np.mean([p.gpus / p.steps_per_s for p in points if p.gpu_model == g])) for g in gpus_of]
    g_default = [
        math.log(default_grad_bytes(p.gpu_model, math.exp(t0[gpus_of.index(p.gpu_model)]))) for p in points
    ]
    prior_g = float(np.mean(g_default))
    x0 = np.array([*t0, prior_g, CONTENTION, *([math.log(OVERLAP_K)] if fit_k else [])])

    def predict(x: np.ndarray, p: Point) -> float:
        t1 = math.exp(x[gpus_of.index(p.gpu_model)])
        comm = math.exp(x[n_t]) / p.topology.bandwidth_bytes_s(p.nodes) / t1
        k = math.exp(x[n_t + 2]) if fit_k else OVERLAP_K
        return math.log(p.gpus / (t1 * iteration_ratio(p.gpus, p.nodes, comm, k, x[n_t + 1])))

    def residuals(x: np.ndarray) -> np.ndarray:
        res = [predict(x, p) - math.log(p.steps_per_s) for p in points]
        res.append(PRIOR_WEIGHT * (x[n_t] - prior_g))
        res.append(CONTENTION_WEIGHT * (x[n_t + 1] - CONTENTION))
        if fit_k:
            res.append(PRIOR_WEIGHT * (x[n_t + 2] - math.log(OVERLAP_K)))
        return np.asarray(res)

    lower = [-np.inf] * (n_t + 1) + [0.0] + ([0.0] if fit_k else [])
    upper = [np.inf] * (n_t + 2) + ([math.log(16.0)] if fit_k else [])
    # scipy only here: importing spotopt (every command's start) must not pay for it.
    from scipy.optimize import least_squares

    x = least_squares(residuals, x0, bounds=(lower, upper)).x
    return ScalingFit(
        step_s={g: math.exp(x[i]) for i, g in enumerate(gpus_of)},
        grad_bytes=math.exp(x[n_t]) if multi else None,
        contention=float(x[n_t + 1]),
        k=math.exp(x[n_t + 2]) if fit_k else OVERLAP_K,
        sigma=SCALING_SIGMA,
        points=len(points),
        placements=frozenset((p.gpus, p.nodes) for p in points),
    )
