"""The options of a fleet: every (job, market, GPUs per job) a job may use, as arrays.

The seam ``spotopt plan``, the what-if engine and the daemon share (``spotopt.decide.core``
decides over what it builds):

- ``enumerate_options(spec, markets, at, figures, ...) -> OptionTable``: dict ⇄ array
  conversion, done once: every (job, market, GPUs per job) option with its effective throughput.
- ``initial_state`` and ``price_options``: the fleet before any job runs and the options priced
  at a time, as the decision core reads them (``spotopt.decide.fleet``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import overload

import numpy as np

from spotopt.catalog import gpu_matches, gpu_models
from spotopt.decide.egress import transfer_matrix
from spotopt.decide.fleet import FleetState, Options
from spotopt.errors import InputError
from spotopt.history.market import MarketState
from spotopt.jobspec import Job, JobSpec
from spotopt.policies.base import Array
from spotopt.price import instances_per_slot, per_slot
from spotopt.throughput import (
    Figure,
    JobThroughput,
    StoredFigure,
    checkpoint_interval_s,
    preemption_efficiency,
)


@dataclass(frozen=True)
class Excluded:
    """A GPU model and count a job may not use because its memory cannot hold the job."""

    gpu_model: str
    gpu_count: int
    reason: str


def memory_shortfall(job: Job, gpu_model: str, gpus: int) -> str | None:
    """Why ``gpus`` GPUs of ``gpu_model`` cannot hold ``job`` (its ``memory``), or None when
    they can (or the spec does not say what the job needs, or the catalog lacks the model)."""
    model = gpu_models().get(gpu_model)
    if job.memory is None or model is None:
        return None
    need = job.memory.per_gpu_gb(gpus)
    if need <= model.memory_gib:
        return None
    return f"needs {need:.3g} GB per GPU, has {model.memory_gib:g}"


@dataclass(frozen=True)
class OptionInfo:
    """What an option means, for reports: not needed by the policies."""

    market: MarketState
    gpus: int
    slots: int
    figure: Figure
    efficiency: float
    checkpoint_interval_s: float | None
    egress_usd: float


def allowed(job: Job, market: MarketState) -> bool:
    q, a = market.quote, job.allow
    return (
        (not a.clouds or q.cloud in a.clouds)
        and (not a.markets or q.market in a.markets)
        and (not a.regions or q.region in a.regions)
        and (not a.instance_types or q.instance_type in a.instance_types)
        and (not a.gpus or any(gpu_matches(g, q.gpu) for g in a.gpus))
    )


def gpu_choices(job: Job, instance_gpus: float) -> list[int]:
    """GPUs per job on an instance with ``instance_gpus``: fixed, or min/max/powers of two/all."""
    low, high = job.gpu_range
    total = math.floor(instance_gpus + 1e-9)
    if low == high:
        return [low] if low <= total else []
    wanted = {low, high, total} | {2**i for i in range(0, 12)}
    return sorted(d for d in wanted if low <= d <= min(high, total))


def work_steps(job: Job, book: JobThroughput) -> float:
    if job.work.steps is not None:
        return job.work.steps
    assert job.work.gpu is not None and job.work.gpu_days is not None
    ref = book.single(job.work.gpu)
    if ref is None:
        raise InputError(
            f"job {job.name!r}: work.gpu is {job.work.gpu} but the job has no throughput on it; "
            f"add throughput.{job.work.gpu} or give work.steps"
        )
    return job.work.gpu_days * 86400.0 * ref.steps_per_s


BILLING = ("instance", "gpu")
"""How an option on ``d`` of an instance's ``G`` GPUs is billed: ``instance`` (the default) rents
the whole instance, as the daemon does; ``gpu`` is the thesis' packed accounting, ``price / k``
for ``k = floor(G / d)`` jobs sharing it, as if other jobs filled the rest (labelled wherever used)."""


class OptionInfos(Sequence[OptionInfo]):
    """The ``OptionInfo`` of every option of an ``OptionTable``, made when asked for.

    A fleet of 10k jobs has millions of options and reads the details of a few (the ones it
    moves to, the ones a plan reports); the table keeps their parts as arrays.
    """

    def __init__(
        self,
        markets: Sequence[MarketState],
        market: Array,
        gpus: Array,
        slots: Array,
        figures: Sequence[Figure],
        figure: Array,
        efficiency: Array,
        interval_s: Array,
        order: Array,
    ) -> None:
        """Option ``e``'s parts are at ``order[e]`` of the arrays (the table sorts by key)."""
        self._order = order
        self._markets = markets
        self._market, self._gpus, self._slots = market, gpus, slots
        self._figures, self._figure = figures, figure
        self._efficiency, self._interval_s = efficiency, interval_s

    def __len__(self) -> int:
        return len(self._market)

    @overload
    def __getitem__(self, e: int) -> OptionInfo: ...

    @overload
    def __getitem__(self, e: slice) -> list[OptionInfo]: ...

    def __getitem__(self, e: int | slice) -> OptionInfo | list[OptionInfo]:
        if isinstance(e, slice):
            return [self[i] for i in range(*e.indices(len(self)))]
        if not -len(self) <= e < len(self):
            raise IndexError(e)
        i = int(self._order[e])
        interval = float(self._interval_s[i])
        return OptionInfo(
            self._markets[int(self._market[i])],
            int(self._gpus[i]),
            int(self._slots[i]),
            self._figures[int(self._figure[i])],
            float(self._efficiency[i]),
            None if math.isnan(interval) else interval,
            0.0,
        )


@dataclass
class OptionTable:
    """Every (job, market, GPUs per job) option of a spec on a snapshot, before any pricing
    decision: what ``spotopt plan``, the what-if engine and the daemon all start from."""

    key: Array
    """A stable id per option, sorted: ``option_key(market_id, job, gpus)``."""
    job: Array
    market: Array
    steps_per_hour: Array
    """Expected effective throughput (discounted for preemption loss at the planning period)."""
    slots: Array
    """Jobs billed per instance: ``floor(G / d)`` with ``gpu`` billing, else 1."""
    infos: Sequence[OptionInfo]
    work_steps: Array
    deadline_hours: Array
    excluded: list[list[Excluded]] = field(default_factory=list)
    """Per job, the GPU models and counts its memory rules out (``memory_shortfall``)."""
    no_option: dict[int, str] = field(default_factory=dict)
    """Per job without any option, why: one line naming the job and the cause (``no_option_why``)."""
    steps_per_hour_low: Array | None = None
    """``steps_per_hour`` at the low end of each figure's interval (``Options.steps_per_hour_low``;
    None: every figure exact)."""


class _MarketColumns:
    """The snapshot's markets as integer codes, so a job's ``allow`` filter is a few array
    operations over all markets (the same tests as ``allowed``); masks are cached per filter."""

    def __init__(self, markets: Sequence[MarketState]) -> None:
        self.codes: dict[str, dict[str | None, int]] = {}
        self.columns: dict[str, Array] = {}
        for name, values in (
            ("cloud", [m.quote.cloud for m in markets]),
            ("market", [m.quote.market for m in markets]),
            ("region", [m.quote.region for m in markets]),
            ("instance_type", [m.quote.instance_type for m in markets]),
            ("gpu", [m.quote.gpu for m in markets]),
        ):
            codes: dict[str | None, int] = {}
            self.columns[name] = np.array([codes.setdefault(v, len(codes)) for v in values], dtype=np.int64)
            self.codes[name] = codes
        self.rate = np.array([m.preemptions_per_hour for m in markets], dtype=float)
        self._masks: dict[tuple[tuple[str, ...], ...], Array] = {}

    def allowed(self, job: Job) -> Array:
        a = job.allow
        key = (tuple(a.clouds), tuple(a.markets), tuple(a.regions), tuple(a.instance_types), tuple(a.gpus))
        if key not in self._masks:
            mask = np.ones(len(self.rate), dtype=bool)
            for name, wanted in (
                ("cloud", a.clouds),
                ("market", a.markets),
                ("region", a.regions),
                ("instance_type", a.instance_types),
            ):
                if wanted:
                    mask &= self._isin(name, set(wanted).__contains__)
            if a.gpus:
                mask &= self._isin("gpu", lambda v: any(gpu_matches(g, v) for g in a.gpus))
            self._masks[key] = mask
        return self._masks[key]

    def _isin(self, name: str, test: Callable[[str | None], bool]) -> Array:
        hits = [code for value, code in self.codes[name].items() if test(value)]
        return np.isin(self.columns[name], hits)


def enumerate_options(
    spec: JobSpec,
    markets: Sequence[MarketState],
    at: datetime,
    figures: Sequence[StoredFigure] = (),
    *,
    period_h: float | None = 1.0,
    billing: str = "instance",
    missed_deadlines: bool = False,
) -> OptionTable:
    """All options of all jobs on ``markets`` (a snapshot at ``at``).

    A market whose GPU count is unknown or smaller than the job's minimum is skipped for it, and
    so is an option whose preemption loss leaves no progress, and a GPU model and count whose
    memory cannot hold the job (listed in ``excluded``: a plan says why). ``period_h`` is the planning period
    (checkpoints fall on its boundaries, see ``spotopt.throughput``). A deadline at or before
    ``at`` is bad input for a plan or a what-if; the daemon passes ``missed_deadlines`` because a
    running job can outlive its deadline: it keeps its hours left, <= 0 (the decision core then
    finishes it as soon as it can, as the what-if engine's jobs past their deadline).

    Per job and (GPU model, count) group the allowed markets are an array mask, and the
    preemption terms are computed once per distinct rate (with the scalar functions, so every
    value is the one a per-option loop gives).
    """
    if billing not in BILLING:
        raise InputError(f"--billing {billing!r}: must be one of {', '.join(BILLING)}")
    period_s = None if period_h is None else period_h * 3600.0
    by_gpu: dict[tuple[str, float], list[int]] = defaultdict(list)
    for i, m in enumerate(markets):
        if m.quote.gpu is not None and m.quote.gpu_count:
            by_gpu[(m.quote.gpu, m.quote.gpu_count)].append(i)
    models: dict[str, list[tuple[float, Array]]] = defaultdict(list)  # in (gpu, count) order
    for (gpu, count), idx in sorted(by_gpu.items()):
        models[gpu].append((count, np.asarray(idx, dtype=np.int64)))
    cols = _MarketColumns(markets)
    rates, rate_code = np.unique(cols.rate, return_inverse=True)
    rate_code = rate_code.reshape(-1)
    choices_of: dict[tuple[tuple[int, int], float], list[int]] = {}
    usable: dict[frozenset[tuple[str, int]], list[str]] = {}
    parts: dict[str, list[Array]] = defaultdict(list)
    found: list[Figure] = []  # one per leg: a (job, GPUs per job, figure) over some markets
    leg_rows: list[tuple[int, int, int, int]] = []  # (job, GPUs per job, slots, markets)
    work, deadlines = [], []
    excluded: list[list[Excluded]] = [[] for _ in spec.jobs]
    no_option: dict[int, str] = {}
    for j, job in enumerate(spec.jobs):
        book = JobThroughput(job, figures)
        work.append(work_steps(job, book))
        due = job.deadline_hours(at)
        if due is not None and due <= 0 and not missed_deadlines:
            raise InputError(
                f"job {job.name!r}: deadline {job.deadline} is not after the planning time {at.isoformat()} "
                "(--at, or a replay's --start); give a later deadline or an earlier time"
            )
        deadlines.append(math.inf if due is None else due)
        ok = cols.allowed(job)
        legs: list[tuple[int, int, Array]] = []  # (GPUs per job, slots, markets), one figure each
        for gpu in _models_with_figures(book, models, usable):
            for count, group in models[gpu]:
                choice = (job.gpu_range, count)
                if choice not in choices_of:
                    choices_of[choice] = gpu_choices(job, count)
                mine = group[ok[group]] if choices_of[choice] else group[:0]
                for d in choices_of[choice] if len(mine) else ():
                    short = memory_shortfall(job, gpu, d)
                    if short is not None:
                        if all((x.gpu_model, x.gpu_count) != (gpu, d) for x in excluded[j]):
                            excluded[j].append(Excluded(gpu, d, short))
                        continue
                    fig = book.at(gpu, d)
                    if fig is not None:
                        found.append(fig)
                        legs.append((d, math.floor(count / d + 1e-9) if billing == "gpu" else 1, mine))
        if not legs:
            no_option[j] = no_option_why(job, excluded[j], period_s, any_leg=False)
            continue
        # The job's candidate markets, leg after leg; what depends on the leg only is looked up
        # through ``leg_of`` once for all jobs.
        market = np.concatenate([m for *_, m in legs])
        eff_of, interval_of = _preemption_terms(job, rates, rate_code[market], period_s)
        parts["market"].append(market)
        parts["eff"].append(eff_of[rate_code[market]])
        parts["interval"].append(interval_of[rate_code[market]])
        for d, slots, mine in legs:
            leg_rows.append((j, d, slots, len(mine)))
    if leg_rows:
        leg = np.array(leg_rows, dtype=np.int64).reshape(-1, 4)
        leg_of = np.repeat(np.arange(len(leg)), leg[:, 3])
        eff = np.concatenate(parts["eff"])
        keep = np.flatnonzero(eff > 0)  # preemptions leave no progress: no option
        leg_of, eff = leg_of[keep], eff[keep]
        market = np.concatenate(parts["market"])[keep]
        interval = np.concatenate(parts["interval"])[keep]
    else:
        leg = np.zeros((0, 4), dtype=np.int64)
        leg_of = market = np.zeros(0, dtype=np.int64)
        eff = interval = np.zeros(0)
    job_of, gpus, slots = leg[leg_of, 0], leg[leg_of, 1], leg[leg_of, 2]
    for j in sorted(set(leg[:, 0].tolist()) - set(job_of.tolist())):  # every option lost to preemptions
        no_option[j] = no_option_why(spec.jobs[j], excluded[j], period_s, any_leg=True)
    steps_per_hour = np.array([f.steps_per_s * 3600.0 for f in found])[leg_of] * eff
    low = np.array([f.interval[0] * 3600.0 for f in found])[leg_of] * eff
    ids = np.array([m.quote.market_id for m in markets], dtype=np.int64)
    key = option_key(ids[market], job_of, gpus)
    order = np.argsort(key, kind="stable")
    infos = OptionInfos(markets, market, gpus, slots, found, leg_of, eff, interval, order)
    return OptionTable(
        key=key[order],
        job=job_of[order],
        market=market[order],
        steps_per_hour=steps_per_hour[order],
        slots=slots[order],
        infos=infos,
        work_steps=np.asarray(work, dtype=float),
        deadline_hours=np.asarray(deadlines, dtype=float),
        excluded=excluded,
        no_option=no_option,
        steps_per_hour_low=low[order],
    )


def no_option_why(job: Job, excluded: Sequence[Excluded], period_s: float | None, *, any_leg: bool) -> str:
    """Why ``job`` has no option, naming the fix: every option's preemption and checkpoint
    losses leave no progress (``any_leg``: it had some), its memory fits no GPU it may use, or
    no market it may use has a throughput figure for its GPUs."""
    head = f"job {job.name!r} has no usable option"
    ckpt = job.checkpoint_seconds
    if any_leg and period_s is not None and job.checkpoint_every_s is None and ckpt >= period_s:
        return (
            f"{head}: the planning model checkpoints it at every period boundary ({period_s:g} s apart) "
            f"and a checkpoint takes {ckpt:g} s (checkpoint_s), leaving no time to train; give "
            "checkpoint.every (the cadence its agent keeps) or a longer period (daemon run --period)"
        )
    if any_leg:
        return (
            f"{head}: preemptions, checkpoint writes ({ckpt:g} s) and restarts ({job.restart_s:g} s) "
            "leave no progress on every market it may use; check checkpoint_s and restart_s"
        )
    if excluded:
        largest = {x.gpu_model: x for x in sorted(excluded, key=lambda x: x.gpu_count)}
        why = "; ".join(f"{x.gpu_model} x{x.gpu_count} {x.reason}" for x in largest.values())
        return (
            f"{head}: memory: no GPU it may use can hold it ({why}); give memory.zero_stage, "
            "a larger gpus.max or allow larger GPUs"
        )
    return (
        f"{head}: no priced market it may use has a throughput figure for its GPUs; widen its "
        "allow filters or add throughputs for more GPU models"
    )


def _models_with_figures(
    book: JobThroughput,
    models: dict[str, list[tuple[float, Array]]],
    usable: dict[frozenset[tuple[str, int]], list[str]],
) -> list[str]:
    """The GPU models (of ``models``, in order) on which ``book`` may have a figure: for any
    ``d``, ``book.at(gpu, d)`` is None unless ``gpu`` has a one-GPU figure (``book.at(gpu, 1)``)
    or a point at some count. Without stored references only the job's own points decide, so
    jobs naming the same GPUs share the answer (``usable``)."""
    points = frozenset(book.points)
    if book.references or points not in usable:
        found = [
            gpu
            for gpu in models
            if book.at(gpu, 1) is not None or any(n != 1 and gpu_matches(k, gpu) for k, n in points)
        ]
        if book.references:
            return found
        usable[points] = found
    return usable[points]


def _preemption_terms(job: Job, rates: Array, used: Array, period_s: float | None) -> tuple[Array, Array]:
    """Per distinct market rate (``rates``; ``used``: the codes of those the job's options
    have): the job's preemption efficiency and checkpoint interval (NaN: none), computed by
    ``preemption_efficiency``/``checkpoint_interval_s`` once per rate used."""
    eff = np.full(len(rates), np.nan)
    interval = np.full(len(rates), np.nan)
    for k in np.unique(used).tolist():
        rate = float(rates[k])
        every = job.checkpoint_every_s
        tau = checkpoint_interval_s(job.checkpoint_seconds, rate, period_s, every)
        eff[k] = preemption_efficiency(rate, job.checkpoint_seconds, job.restart_s, period_s, every)
        interval[k] = math.nan if tau is None else tau
    return eff, interval


def option_key(market_id: Array, job: Array, gpus: Array) -> Array:
    """A stable id of (market, job, GPUs per job): the same option keeps its key from one
    snapshot to the next, so a fleet state that names it stays valid (the daemon's case)."""
    return np.asarray(market_id.astype(np.int64) * 2**32 + job.astype(np.int64) * 2**12 + gpus)


def initial_state(
    spec: JobSpec, table: OptionTable, markets: Sequence[MarketState], at: datetime
) -> tuple[FleetState, Options]:
    """The fleet before any job runs, and the table's options priced at the snapshot (no
    history: the forecast is today's price), for ``spotopt.decide.core``."""
    locations: list[tuple[str, str]] = []
    data_loc = [
        -1
        if job.dataset is None or job.dataset.gb == 0
        else location_index(locations, job.dataset.cloud, job.dataset.region)
        for job in spec.jobs
    ]
    opts = price_options(table, markets, at, locations)
    n = len(spec.jobs)
    state = FleetState(
        names=tuple(job.name for job in spec.jobs),
        locations=tuple(locations),
        option=np.full(n, -1, dtype=np.int64),
        location=np.full(n, -1, dtype=np.int64),
        remaining_steps=table.work_steps.copy(),
        dwell_h=np.zeros(n),
        since_checkpoint_h=np.zeros(n),
        deadline_h=table.deadline_hours.copy(),
        notice=np.zeros(n, dtype=bool),
        lost=np.zeros(n, dtype=bool),
        spent_usd=np.zeros(n),
        restart_h=np.array([job.restart_s / 3600.0 for job in spec.jobs]),
        save_h=np.array([job.checkpoint_seconds / 3600.0 for job in spec.jobs]),
        checkpoint_gb=np.array([job.checkpoint_gb for job in spec.jobs]),
        dataset_gb=np.array([job.dataset.gb if job.dataset else 0.0 for job in spec.jobs]),
        dataset_location=np.asarray(data_loc, dtype=np.int64),
    )
    return state, opts


def location_index(locations: list[tuple[str, str]], cloud: str, region: str) -> int:
    """Index of ``(cloud, region)`` in ``locations``, appended if new (append only: indices a fleet
    state holds stay valid)."""
    if (cloud, region) not in locations:
        locations.append((cloud, region))
    return locations.index((cloud, region))


def price_options(
    table: OptionTable,
    markets: Sequence[MarketState],
    at: datetime,
    locations: list[tuple[str, str]],
    baseline_usd_per_hour: Array | None = None,
    revert_h: Array | None = None,
) -> Options:
    """The table's options priced at the snapshot ``markets`` for ``spotopt.decide.core``.

    ``locations`` gains the markets' regions it lacks. The forecast is per market (instance
    prices; ``None``: today's price holds). Each option carries its market's price age at ``at``,
    so the core prefers a job's fresh prices to its stale ones (``spotopt.decide.core.fresh_first``).
    """
    market_loc = np.array(
        [location_index(locations, m.quote.cloud, m.quote.region) for m in markets], dtype=np.int64
    )
    slots = np.maximum(table.slots, 1)
    now = np.array([m.quote.usd_per_hour for m in markets], dtype=float)
    base = now if baseline_usd_per_hour is None else baseline_usd_per_hour
    revert = np.full(len(markets), np.inf) if revert_h is None else revert_h
    m = table.market
    return Options(
        key=table.key,
        job=table.job,
        market=m,
        location=market_loc[m],
        steps_per_hour=table.steps_per_hour,
        steps_per_hour_low=table.steps_per_hour_low,
        usd_per_hour=per_slot(now[m], slots),
        instances_per_hour=instances_per_slot(slots),
        on_demand=np.array([q.quote.market == "on-demand" for q in markets], dtype=bool)[m],
        baseline_usd_per_hour=per_slot(base[m], slots),
        revert_h=revert[m],
        preemptions_per_hour=np.array([q.preemptions_per_hour for q in markets], dtype=float)[m],
        transfer=transfer_matrix(locations, at),
        capacity=np.full(len(markets), math.inf),
        price_age_h=np.array([price_age_h(q.quote.observed_at, at) for q in markets], dtype=float)[m],
    )


def price_age_h(observed_at: datetime, at: datetime) -> float:
    """Hours from a price's observation to ``at`` (a point holds until the next one, so this is
    how long the history has said nothing new about the market)."""
    return (at - observed_at).total_seconds() / 3600.0
