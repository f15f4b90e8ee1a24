"""Effective throughput of a job on a market: steps/s on its GPUs, discounted for preemption loss.

Three steps, each labelled with where its number came from (``source``):

1. **Figures.** The job's steps/s on ``d`` GPUs of a model: from the spec (``spec``), the
   throughput store (``measured`` / ``imported``), or an estimate (``estimated``) when the job
   has no figure for that GPU model: the *nearest reference workload* (the stored workload
   whose throughput ratios across the GPUs both have figures for are most alike, by the spread
   of log-ratios) scaled to this job's level.
2. **GPUs per job.** A job uses ``d`` GPUs of an instance with ``G``: ``k = floor(G / d)``
   copies fit, so one job slot costs ``price / k`` (the thesis' "multi-GPU" option: pack jobs at
   the per-GPU price; exact when the instance is full, a relaxation otherwise) and ``d = G`` is
   plain data-parallel training on the whole instance. Multi-GPU steps/s come from measured
   points when there are any for that count, else from the ring all-reduce model
   ``T(d) = T(1) · d / (1 + 2·r·(d-1))`` (Rubick's data-parallel communication volume
   ``2(d-1)/d`` of the gradients per step, no overlap), with ``r`` = communication / compute time
   of one step, fitted in closed form (least squares on ``T(1)·d/T(d) - 1 = 2r(d-1)``) to the
   job's measured multi-GPU points, else ``DEFAULT_COMM_RATIO`` (then labelled ``estimated``).
3. **Preemption loss.** On a market with ``rate`` preemptions per hour (MTBF = 1/rate), a job
   checkpoints every ``tau = sqrt(2·C·MTBF)`` (Young/Daly, ``C`` = checkpoint write time) and
   loses on average ``C/tau`` to writing checkpoints, ``tau/2`` of recomputation per preemption
   and ``restart_s`` per preemption: ``efficiency = 1 - C/tau - rate·(tau/2 + R)``. Billing
   continues through the loss, so the cost per hour is unchanged and the steps/hour shrink.
   A job that must hold a checkpoint at every planning boundary (``period_s``: the what-if tick,
   the mover's period; only there can it move without losing work) checkpoints at most one
   period apart, at an interval that divides the period, also where nothing preempts it: on
   on-demand that costs ``C/period``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spotopt.catalog import gpu_matches
from spotopt.jobspec import Job
from spotopt.young_daly import young_daly_s

DEFAULT_COMM_RATIO = 0.01
"""Communication/compute ratio of one data-parallel step when a job has no multi-GPU figures:
``eff(8) = 1/(1 + 0.14) ≈ 0.88``, typical of all-reduce over NVLink for CNNs (optimistic for
large language models over PCIe: give ``scaling.comm_ratio`` or measured points for those)."""


@dataclass(frozen=True, slots=True)
class Figure:
    """Steps/s of a job on ``gpus`` GPUs of ``gpu_model`` and where the number came from."""

    steps_per_s: float
    source: str  # spec | measured | imported | estimated
    note: str = ""

    @property
    def estimated(self) -> bool:
        return self.source == "estimated"


def family(gpu: str) -> str:
    return gpu.split("-")[0]


def _lookup(points: Mapping[tuple[str, int], Figure], gpu_model: str, gpus: int) -> Figure | None:
    """The most specific key (model before family) that matches ``gpu_model`` at ``gpus``."""
    hits = [(len(k), f) for (k, n), f in points.items() if n == gpus and gpu_matches(k, gpu_model)]
    return max(hits, key=lambda kf: kf[0])[1] if hits else None


def fit_comm_ratio(points: Mapping[tuple[str, int], Figure]) -> float | None:
    """Least-squares ``r`` from multi-GPU points with a non-estimated one-GPU point of the same GPU."""
    num = den = 0.0
    for (gpu, count), fig in points.items():
        one = points.get((gpu, 1))
        if count <= 1 or one is None or fig.estimated or one.estimated:
            continue
        u = one.steps_per_s * count / fig.steps_per_s - 1.0
        num += u * 2 * (count - 1)
        den += (2 * (count - 1)) ** 2
    return max(0.0, num / den) if den else None


def scaling_efficiency(gpus: int, comm_ratio: float) -> float:
    return 1.0 / (1.0 + 2.0 * comm_ratio * (gpus - 1))


def checkpoint_interval_s(
    checkpoint_s: float, rate_per_hour: float, period_s: float | None = None
) -> float | None:
    """Seconds between checkpoints; None when the job never needs one.

    Young/Daly ``sqrt(2·C·MTBF)``; with ``period_s``, at most one period and shortened to divide
    it evenly, so a checkpoint falls on every period boundary (also without preemptions).
    """
    tau = young_daly_s(checkpoint_s, rate_per_hour) if rate_per_hour > 0 else None
    if period_s is None or period_s <= 0:
        return tau
    if tau is None or tau >= period_s:
        return period_s
    if tau <= 0:
        return period_s
    return period_s / math.ceil(period_s / tau - 1e-9)


def preemption_efficiency(
    rate_per_hour: float, checkpoint_s: float, restart_s: float, period_s: float | None = None
) -> float:
    """Fraction of paid time that advances training (0 when preemptions outpace progress).

    ``period_s``: checkpoints are due at every planning boundary (see ``checkpoint_interval_s``).
    """
    tau = checkpoint_interval_s(checkpoint_s, rate_per_hour, period_s)
    if tau is None:
        return 1.0
    rate_s = max(rate_per_hour, 0.0) / 3600.0
    write = checkpoint_s / tau if tau > 0 else 0.0
    return max(0.0, 1.0 - write - rate_s * (tau / 2.0 + restart_s))


_RANK = {"spec": 0, "measured": 1, "imported": 2, "estimated": 3}
"""Which figure wins when several cover one GPU and count: the spec, then what the mover measured
on the job itself, then an imported figure, then an estimate (whatever order the rows come in)."""


@dataclass(frozen=True)
class StoredFigure:
    """One row of the throughput store, as the book needs it."""

    workload: str
    gpu_model: str
    gpu_count: int
    steps_per_s: float
    source: str


class JobThroughput:
    """All throughput knowledge about one job: spec figures, stored figures, references, scaling."""

    def __init__(self, job: Job, stored: Iterable[StoredFigure] = ()) -> None:
        self.job = job
        rows = list(stored)
        points: dict[tuple[str, int], Figure] = {}
        for row in rows:
            if row.workload == job.store_name:
                key = (row.gpu_model, row.gpu_count)
                if key not in points or _RANK[row.source] < _RANK[points[key].source]:
                    points[key] = Figure(row.steps_per_s, row.source)
        for gpu, value in job.throughput.items():  # the spec wins over the store
            if isinstance(value, Mapping):
                for count, tput in value.items():
                    points[(gpu, int(count))] = Figure(tput, "spec")
            else:
                points[(gpu, 1)] = Figure(value, "spec")
        self.points = points
        self.references: dict[str, dict[str, float]] = {}
        for row in rows:
            if row.workload != job.store_name and row.gpu_count == 1 and row.source != "estimated":
                self.references.setdefault(row.workload, {})[family(row.gpu_model)] = row.steps_per_s
        fitted = fit_comm_ratio(points)
        if job.scaling is not None:
            self.comm_ratio, self.comm_source = job.scaling.comm_ratio, "spec"
        elif fitted is not None:
            self.comm_ratio, self.comm_source = fitted, "measured"
        else:
            self.comm_ratio, self.comm_source = DEFAULT_COMM_RATIO, "estimated"
        self._cache: dict[tuple[str, int], Figure | None] = {}

    def single(self, gpu_model: str) -> Figure | None:
        """Steps/s on one GPU of ``gpu_model``: known, or estimated from the nearest reference."""
        known = _lookup(self.points, gpu_model, 1)
        return known if known is not None else self._estimate(gpu_model)

    def at(self, gpu_model: str, gpus: int) -> Figure | None:
        """Steps/s on ``gpus`` GPUs of ``gpu_model`` (None: no figure and no way to estimate one)."""
        key = (gpu_model, gpus)
        if key not in self._cache:
            self._cache[key] = self._at(gpu_model, gpus)
        return self._cache[key]

    def _at(self, gpu_model: str, gpus: int) -> Figure | None:
        known = _lookup(self.points, gpu_model, gpus)
        if known is not None:
            return known
        one = self.single(gpu_model)
        if one is None or gpus == 1:
            return one
        eff = scaling_efficiency(gpus, self.comm_ratio)
        source = "estimated" if one.estimated or self.comm_source == "estimated" else one.source
        note = f"data-parallel x{gpus} at {eff:.0%} efficiency (comm_ratio {self.comm_ratio:.3g})"
        return Figure(one.steps_per_s * gpus * eff, source, "; ".join(filter(None, [one.note, note])))

    def _estimate(self, gpu_model: str) -> Figure | None:
        mine = {family(g): f.steps_per_s for (g, n), f in self.points.items() if n == 1 and not f.estimated}
        target = family(gpu_model)
        best: tuple[float, int, str, float] | None = None
        for name, ref in sorted(self.references.items()):
            if target not in ref:
                continue
            common = [g for g in mine if g in ref]
            if not common:
                continue
            logs = [math.log(mine[g] / ref[g]) for g in common]
            mean = sum(logs) / len(logs)
            spread = (
                math.sqrt(sum((v - mean) ** 2 for v in logs) / (len(logs) - 1)) if len(logs) > 1 else math.inf
            )
            candidate = (spread, -len(common), name, math.exp(mean) * ref[target])
            if best is None or candidate[:3] < best[:3]:
                best = (spread, -len(common), name, candidate[3])
        if best is None:
            return None
        return Figure(best[3], "estimated", f"estimated from reference workload {best[2]!r}")
