"""Effective throughput of a job on a market: steps/s on its GPUs, discounted for preemption loss.

Three steps, each labelled with where its number came from (``source``):

1. **Figures.** The job's steps/s on ``d`` GPUs of a model: from the spec (``spec``), the
   throughput store (``measured`` / ``imported``), or an estimate (``estimated``, with an 80 %
   interval ``low``..``high`` and the reference workloads it came from) when the job has no
   figure for that GPU model: ``spotopt.throughput.across`` completes the job's log steps/s from
   the stored reference workloads and each GPU's datasheet prior (exact GPU models; a spec's
   family key such as ``V100`` stands for each model of the family).
2. **GPUs per job.** A job uses ``d`` GPUs of an instance with ``G``: ``k = floor(G / d)``
   copies fit, so one job slot costs ``price / k`` (the thesis' "multi-GPU" option: pack jobs at
   the per-GPU price; exact when the instance is full, a relaxation otherwise) and ``d = G`` is
   plain data-parallel training on the whole instance. Multi-GPU steps/s come from measured
   points when there are any for that count, else from ``spotopt.throughput.scaling``'s
   iteration-time model fitted to the job's points on any GPU model and count (a job measured
   only at 8 GPUs has a figure at 4), or, where the spec gives ``scaling.comm_ratio``, from
   ``T(d) = T(1) · d / (1 + 2·r·(d-1))`` as the spec says.
3. **Preemption loss.** On a market with ``rate`` preemptions per hour (MTBF = 1/rate), a job
   checkpoints every ``tau = sqrt(2·C·MTBF)`` (Young/Daly, ``C`` = checkpoint write time) and
   loses on average ``C/tau`` to writing checkpoints, ``tau/2`` of recomputation per preemption
   and ``restart_s`` per preemption: ``efficiency = 1 - C/tau - rate·(tau/2 + R)``. Billing
   continues through the loss, so the cost per hour is unchanged and the steps/hour shrink.
   A job that must hold a checkpoint at every planning boundary (``period_s``: the what-if tick,
   the mover's period; only there can it move without losing work) checkpoints at most one
   period apart, at an interval that divides the period, also where nothing preempts it: on
   on-demand that costs ``C/period``. A job that gives its cadence (``checkpoint.every``, which
   its agent keeps) checkpoints at that interval instead, whatever the period.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spotopt.catalog import gpu_matches, gpu_models
from spotopt.jobspec import Job
from spotopt.throughput import across, scaling
from spotopt.young_daly import young_daly_s


@dataclass(frozen=True, slots=True)
class Figure:
    """Steps/s of a job on ``gpus`` GPUs of ``gpu_model`` and where the number came from.

    ``low``/``high``: the 80 % interval of an estimate (None: a figure as given, exact);
    ``references``: the reference workloads an estimate was made from."""

    steps_per_s: float
    source: str  # spec | measured | imported | estimated
    note: str = ""
    low: float | None = None
    high: float | None = None
    references: tuple[str, ...] = ()

    @property
    def estimated(self) -> bool:
        return self.source == "estimated"

    @property
    def interval(self) -> tuple[float, float]:
        """(low, high); a figure as given is its own interval."""
        return (
            self.low if self.low is not None else self.steps_per_s,
            self.high if self.high is not None else self.steps_per_s,
        )


def _lookup(points: Mapping[tuple[str, int], Figure], gpu_model: str, gpus: int) -> Figure | None:
    """The most specific key (model before family) that matches ``gpu_model`` at ``gpus``."""
    hits = [(len(k), f) for (k, n), f in points.items() if n == gpus and gpu_matches(k, gpu_model)]
    return max(hits, key=lambda kf: kf[0])[1] if hits else None


def _models(key: str) -> list[str]:
    """The exact GPU models a figure's key stands for (a family key: each model of it)."""
    return [g for g in gpu_models() if gpu_matches(key, g)]


def comm_ratio_efficiency(gpus: int, comm_ratio: float) -> float:
    """A spec's ``scaling.comm_ratio`` model: ``eff(d) = 1/(1 + 2·r·(d-1))``."""
    return 1.0 / (1.0 + 2.0 * comm_ratio * (gpus - 1))


def checkpoint_interval_s(
    checkpoint_s: float, rate_per_hour: float, period_s: float | None = None, every_s: float | None = None
) -> float | None:
    """Seconds between checkpoints; None when the job never needs one.

    ``every_s``: the job's own cadence (``checkpoint.every``), which its agent keeps whatever
    the rate and the period (a move at a boundary asks the agent for a checkpoint first, so no
    boundary needs one of its own): the interval as given. Else Young/Daly
    ``sqrt(2·C·MTBF)``; with ``period_s``, at most one period and shortened to divide it evenly,
    so a checkpoint falls on every period boundary (also without preemptions).
    """
    if every_s is not None:
        return every_s
    tau = young_daly_s(checkpoint_s, rate_per_hour) if rate_per_hour > 0 else None
    if period_s is None or period_s <= 0:
        return tau
    if tau is None or tau >= period_s:
        return period_s
    if tau <= 0:
        return period_s
    return period_s / math.ceil(period_s / tau - 1e-9)


def preemption_efficiency(
    rate_per_hour: float,
    checkpoint_s: float,
    restart_s: float,
    period_s: float | None = None,
    every_s: float | None = None,
) -> float:
    """Fraction of paid time that advances training (0 when preemptions outpace progress).

    ``period_s``: checkpoints are due at every planning boundary, unless the job checkpoints
    every ``every_s`` (see ``checkpoint_interval_s``).
    """
    tau = checkpoint_interval_s(checkpoint_s, rate_per_hour, period_s, every_s)
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
        for row in sorted(rows, key=lambda r: (r.workload, len(r.gpu_model))):
            if row.workload != job.store_name and row.gpu_count == 1 and row.source != "estimated":
                for model in _models(row.gpu_model):  # an exact model's row beats its family's
                    self.references.setdefault(row.workload, {})[model] = row.steps_per_s
        self._table = across.table(self.references)
        self.scaling = scaling.fit(self._scaling_points())
        self._cache: dict[tuple[str, int, int | None], Figure | None] = {}

    def _scaling_points(self) -> list[scaling.Point]:
        """The job's own figures (not estimates) per exact GPU model, for the iteration-time fit."""
        found: dict[tuple[str, int], Figure] = {}
        for (key, count), fig in self.points.items():
            if fig.estimated:
                continue
            for model in _models(key):
                known = _lookup(self.points, model, count)
                if known is not None:
                    found[(model, count)] = known
        out = []
        for (model, count), fig in sorted(found.items()):
            topo = scaling.default_topology(model)
            out.append(scaling.Point(model, count, scaling.nodes_for(count, topo), fig.steps_per_s, topo))
        return out

    def single(self, gpu_model: str) -> Figure | None:
        """Steps/s on one GPU of ``gpu_model``: known, or estimated (see ``at``)."""
        return self.at(gpu_model, 1)

    def at(
        self, gpu_model: str, gpus: int, nodes: int | None = None, topology: scaling.Topology | None = None
    ) -> Figure | None:
        """Steps/s on ``gpus`` GPUs of ``gpu_model`` (None: no figure and no way to estimate one).

        ``nodes``/``topology``: where the GPUs sit (default: as few nodes as the GPU model's
        largest catalog instance type allows, with its links); a known figure is for that."""
        key = (gpu_model, gpus, nodes)
        if topology is not None:
            return self._at(gpu_model, gpus, nodes, topology)
        if key not in self._cache:
            self._cache[key] = self._at(gpu_model, gpus, nodes, None)
        return self._cache[key]

    def _at(
        self, gpu_model: str, gpus: int, nodes: int | None, topology: scaling.Topology | None
    ) -> Figure | None:
        topo = topology or scaling.default_topology(gpu_model)
        fewest = scaling.nodes_for(gpus, topo)
        known = _lookup(self.points, gpu_model, gpus)
        if known is not None and (nodes is None or nodes == fewest):
            return known
        one = self._one(gpu_model)
        if one is None or gpus == 1:
            return one
        where = nodes or fewest
        if self.job.scaling is not None:
            eff = comm_ratio_efficiency(gpus, self.job.scaling.comm_ratio)
            ratio = self.job.scaling.comm_ratio
            note = f"data-parallel x{gpus} at {eff:.0%} efficiency (spec comm_ratio {ratio:.3g})"
            low, high = one.interval
            return Figure(
                one.steps_per_s * gpus * eff,
                one.source,
                "; ".join(filter(None, [one.note, note])),
                None if one.low is None else low * gpus * eff,
                None if one.high is None else high * gpus * eff,
                one.references,
            )
        value = self.scaling.steps_per_s(one.steps_per_s, gpu_model, gpus, where, topo)
        low, high = one.interval
        # the one-GPU figure's spread and the scaling model's at this placement, independent, in log space
        spread = self.scaling.log_sigma(gpus, where)
        below = math.hypot(math.log(one.steps_per_s / low) / across.Z80, spread)
        above = math.hypot(math.log(high / one.steps_per_s) / across.Z80, spread)
        fitted = "fitted to the job's points" if self.scaling.points > 1 else "hardware default"
        eff = value / (one.steps_per_s * gpus)
        note = f"x{gpus} GPUs on {where} node(s): iteration-time model ({fitted}), {eff:.0%} efficiency"
        return Figure(
            value,
            "estimated",
            "; ".join(filter(None, [one.note, note])),
            value * math.exp(-across.Z80 * below),
            value * math.exp(across.Z80 * above),
            one.references,
        )

    def _one(self, gpu_model: str) -> Figure | None:
        """One GPU of ``gpu_model``: known; from the job's multi-GPU points on it; or across GPUs."""
        known = _lookup(self.points, gpu_model, 1)
        if known is not None:
            return known
        step = self.scaling.step_s.get(gpu_model)
        if step is not None:
            sigma = self.scaling.sigma
            value = 1.0 / step
            return Figure(
                value,
                "estimated",
                "one GPU from the job's multi-GPU points (iteration-time model)",
                value * math.exp(-across.Z80 * sigma),
                value * math.exp(across.Z80 * sigma),
            )
        if not self.references:
            return None  # nothing measured beside the job: no estimate on another GPU model
        mine = {g: 1.0 / t for g, t in self.scaling.step_s.items()}
        for g in list(mine):
            exact = _lookup(self.points, g, 1)
            if exact is not None:
                mine[g] = exact.steps_per_s
        found = across.estimate(self._table, mine, gpu_model)
        if found is None:
            return None
        return Figure(found.steps_per_s, "estimated", found.note, found.low, found.high, found.references)
