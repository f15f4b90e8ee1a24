"""Job specs → flat arrays of options on a timeline's markets (built once per replay).

An *option* is (job, market, GPUs per job, jobs per instance), exactly as ``spotopt.plan``
builds them for ``spotopt plan`` (same throughput figures, same filters, same packing), so the
what-if engine and the planner see the same choices. Per option the engine also needs the
checkpoint interval it simulates: Young/Daly for the market's rate, capped at one tick and
shortened to divide the tick (``spotopt.throughput.checkpoint_interval_s`` with the tick as the
period), so that a checkpoint exists at every tick boundary, where the planner may move the job
without losing work. The expected efficiency the policy and the planner use is the throughput
model's for that same interval, so it counts the checkpoints the simulator writes on on-demand.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotopt.catalog import gpu_matches
from spotopt.decide.options import enumerate_options
from spotopt.jobspec import Job, JobSpec
from spotopt.throughput import StoredFigure, checkpoint_interval_s, preemption_efficiency
from spotopt.whatif.preemptions import NOTICE_S
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]


@dataclass
class SimJobs:
    """Per job (``J``) and per option (``E``) arrays; option arrays are sorted by job."""

    jobs: list[Job]
    names: list[str]
    work: Array
    deadline_h: Array
    restart_h: Array
    save_h: Array
    checkpoint_gb: Array
    dataset_gb: Array
    dataset_location: Array
    dataset_cloud: list[str | None]
    ref_gpu: list[str]
    gpus_min: Array
    # options
    job: Array
    market: Array
    gpus: Array
    slots: Array
    steps_per_hour: Array
    """Undiscounted steps per hour of running (the simulator applies preemptions itself): the
    figure's point, the replay's true speed."""
    steps_per_hour_low: Array
    """The same at the low end of the figure's 80 % interval (an estimate's; an exact figure:
    the point): the ``spotopt`` strategy plans deadlines with it, as ``spotopt plan`` does
    (``spotopt.decide.options.OptionTable.steps_per_hour_low``)."""
    expected_eff: Array
    """Expected fraction of paid time that advances training (the policy's discount)."""
    tau_h: Array
    checkpoint_eff: Array
    notice_h: Array
    """Hours from the cloud's preemption notice to the reclaim (``preemptions.NOTICE_S``)."""
    location: Array
    on_demand: Array
    cloud: Array
    gpu: list[str]
    figure_source: list[str]
    """Per option: where its figure came from (``spotopt.throughput.Figure.source``)."""

    @property
    def n_jobs(self) -> int:
        return len(self.names)

    @property
    def n_options(self) -> int:
        return len(self.job)

    @property
    def expected_steps_per_hour(self) -> Array:
        return self.steps_per_hour * self.expected_eff

    @property
    def expected_steps_per_hour_low(self) -> Array:
        """``expected_steps_per_hour`` at the low end of each figure's interval."""
        return self.steps_per_hour_low * self.expected_eff

    def bounds(self) -> Array:
        """``bounds[j]:bounds[j+1]`` are job ``j``'s options."""
        return np.searchsorted(self.job, np.arange(self.n_jobs + 1))


def reference_gpu(job: Job) -> str:
    """The GPU the job's work is counted on, else its fastest one-GPU figure (the seeds' "1×V100")."""
    if job.work.gpu is not None:
        return job.work.gpu
    singles = {g: v for g, v in job.throughput.items() if not isinstance(v, dict)}
    if not singles:
        return next(iter(job.throughput), "")
    return max(singles, key=lambda g: singles[g])


def checkpoint_terms(
    checkpoint_s: Array, restart_s: Array, job: Array, rate_per_hour: Array, market: Array, tick_h: float
) -> tuple[Array, Array]:
    """Per option (``job[e]``, ``market[e]``): the simulated checkpoint interval (hours) and the
    expected efficiency.

    Both come from ``spotopt.throughput`` with the tick as the period, evaluated once per
    distinct (checkpoint time, restart time, rate).
    """
    if len(job) == 0:
        return np.zeros(0), np.zeros(0)
    period_s = tick_h * 3600.0
    params, job_kind = np.unique(np.stack([checkpoint_s, restart_s], axis=1), axis=0, return_inverse=True)
    rates, market_kind = np.unique(rate_per_hour, return_inverse=True)
    pairs, inverse = np.unique(
        job_kind.reshape(-1)[job] * len(rates) + market_kind.reshape(-1)[market], return_inverse=True
    )
    tau_s = np.empty(len(pairs))
    eff = np.empty(len(pairs))
    for i, pair in enumerate(pairs.tolist()):
        (ckpt, restart), rate = params[pair // len(rates)].tolist(), float(rates[pair % len(rates)])
        tau = checkpoint_interval_s(ckpt, rate, period_s)
        tau_s[i] = period_s if tau is None else tau
        eff[i] = preemption_efficiency(rate, ckpt, restart, period_s)
    inverse = inverse.reshape(-1)
    return tau_s[inverse] / 3600.0, eff[inverse]


def build_jobs(
    spec: JobSpec, tl: Timeline, figures: Sequence[StoredFigure] = (), billing: str = "instance"
) -> SimJobs:
    """All options of all jobs on the timeline's markets (see the module docstring); ``billing``
    as in ``spotopt.decide.options.BILLING``."""
    table = enumerate_options(spec, tl.markets, tl.start, figures, period_h=tl.tick_h, billing=billing)
    order = np.argsort(table.job, kind="stable")
    infos = [table.infos[e] for e in order]
    market = table.market[order]
    ckpt_s = np.array([job.checkpoint_seconds for job in spec.jobs], dtype=float)
    restart_s = np.array([job.restart_s for job in spec.jobs], dtype=float)
    job_idx = table.job[order]
    tau, expected = checkpoint_terms(
        ckpt_s, restart_s, job_idx, np.asarray(tl.rate, dtype=float), market, tl.tick_h
    )
    ckpt_eff = 1.0 - (ckpt_s[job_idx] / 3600.0) / tau if len(tau) else np.zeros(0)
    keep = (ckpt_eff > 0) & (expected > 0)
    data_loc = []
    for job in spec.jobs:
        data = job.dataset
        data_loc.append(-1 if data is None or data.gb == 0 else tl.location_index(data.cloud, data.region))
    return SimJobs(
        jobs=list(spec.jobs),
        names=[job.name for job in spec.jobs],
        work=table.work_steps,
        deadline_h=table.deadline_hours,
        restart_h=np.array([job.restart_s / 3600.0 for job in spec.jobs]),
        save_h=ckpt_s / 3600.0,
        checkpoint_gb=np.array([job.checkpoint_gb for job in spec.jobs]),
        dataset_gb=np.array([job.dataset.gb if job.dataset else 0.0 for job in spec.jobs]),
        dataset_location=np.asarray(data_loc, dtype=np.int64),
        dataset_cloud=[job.dataset.cloud if job.dataset else None for job in spec.jobs],
        ref_gpu=[reference_gpu(job) for job in spec.jobs],
        gpus_min=np.array([job.gpu_range[0] for job in spec.jobs]),
        job=job_idx[keep],
        market=market[keep],
        gpus=np.array([o.gpus for o in infos])[keep] if infos else np.zeros(0, dtype=np.int64),
        slots=np.array([o.slots for o in infos])[keep] if infos else np.zeros(0, dtype=np.int64),
        steps_per_hour=np.array([o.figure.steps_per_s * 3600.0 for o in infos])[keep]
        if infos
        else np.zeros(0),
        steps_per_hour_low=np.array([o.figure.interval[0] * 3600.0 for o in infos])[keep]
        if infos
        else np.zeros(0),
        expected_eff=expected[keep],
        tau_h=tau[keep],
        checkpoint_eff=ckpt_eff[keep],
        notice_h=np.array([NOTICE_S[tl.markets[m].quote.cloud] / 3600.0 for m in market])[keep]
        if len(market)
        else np.zeros(0),
        location=tl.location[market][keep],
        on_demand=tl.on_demand[market][keep],
        cloud=np.array([tl.markets[m].quote.cloud for m in market], dtype=object)[keep],
        gpu=[o.market.quote.gpu or "" for o, k in zip(infos, keep, strict=True) if k],
        figure_source=[o.figure.source for o, k in zip(infos, keep, strict=True) if k],
    )


def matches_ref(sim: SimJobs) -> Array:
    """Per option: is its GPU the job's reference GPU (model or family match)?"""
    return np.array(
        [gpu_matches(sim.ref_gpu[j], g) for j, g in zip(sim.job, sim.gpu, strict=True)], dtype=bool
    )
