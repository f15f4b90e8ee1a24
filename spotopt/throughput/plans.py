"""Iteration time of one training job by execution plan and placement: Rubick's model (seed 001
§4, seed 000 appendix A), fitted to a few profiled runs, for plans beside plain data parallel.

``scaling`` answers "how fast on d GPUs" for data-parallel jobs whose per-GPU batch is fixed
(weak scaling). Rubick's DeepSpeed jobs keep the *global* batch fixed and split it over the
data-parallel replicas (strong scaling), and choose among plans: data parallel (with gradient
accumulation to keep the batch), gradient checkpointing, ZeRO-2, ZeRO-offload, and 3D (data ×
tensor × pipeline) parallel, whose Megatron runs keep each replica's batch instead
(``Plan.replica_batch``). One iteration, in milliseconds:

    fwd                                  forward (measured, or ``Forward`` from the profile)
    bwd   = (k_bwd + gc) · fwd           backward; checkpointing recomputes one more forward
    sync  = k_sync · 2 S (dp-1)/dp / B_dp          data-parallel all-reduce of a rank's shard,
                                                   S = P / (tp·pp) (ZeRO-2's reductions too)
    comm  = k_sync · (V_tp / B_tp + V_pp / B_pp)   tensor / pipeline activations (not overlapped)
    cc    = (bwd^k + sync^k)^(1/k) + comm          backward overlaps the all-reduce (k ≥ 1)
    opt   = k_opt · P / shards                     on the GPU; shards = tp·pp (× dp under ZeRO)
          + k_sync · S (dp-1)/dp / min(B_dp, 50)   ZeRO-2: the updated shards all-gathered
          + k_offload · P / (dp · threads)         ZeRO-offload: the host CPUs' update
    ZeRO-offload also sends each replica's gradient shard to the host during backward:
    sync += k_swap · 2 P / dp / B_pcie (what one node's offloaded runs show beside plain ones).
    iter  = fwd + cc + opt + k_const

``P`` is the parameters' fp16 bytes (``BYTES_PER_PARAMETER``), ``V_tp = 4 · 8 · b · seq·hidden
· (tp-1)/tp`` with ``b`` one replica's batch and ``V_pp = 2 · 8 · seq·hidden · pp`` (Rubick's
volumes), each over the slowest link its group crosses: NVLink inside a node, else the NICs the
smallest node's GPUs reach (``Layout.network_gbs``), shared by the data-parallel rings of a
node's tensor ranks (tensor parallel innermost, then data parallel, pipeline stages outermost,
as Megatron orders ranks). The seven ``k`` are fitted by least squares on the logs of three
measured parts of each profiled run (backward+sync, optimizer, iteration), as Rubick fits its
RMSLE.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from spotopt.errors import InputError

NVLINK_GBS = 400.0
"""A800 NVLink, one direction, GB/s (Rubick's cluster, seed 001 §6; the catalog has no A800)."""
NIC_GBS = 12.5
"""One 100 Gbit/s RDMA NIC, GB/s. bert's DeepSpeed runs across nodes (trace, read with no
overlap) move their fp16 gradients at 11.8-13.7 GB/s whenever the smallest node holds one or two
of the job's GPUs (``11``, ``1111``, ``11111111``, ``2222``, ``26``, ``233``) and at 28-36 GB/s
with three or four (``35``, ``44``); roberta's iterations step the same way. Our reading: one
NIC per pair of GPUs. The paper's "100 GB/s RDMA" (seed 001 §6) as one link is 8x too fast."""
GPUS_PER_NIC = 2
"""GPUs sharing one NIC (an A800 HGX server pairs two GPUs and a NIC on each PCIe switch)."""
NICS_PER_NODE = 4
"""NICs per 8-GPU server: 4 × 100 Gbit/s (the paper's 100 GB/s if both directions count)."""
ZERO_GATHER_GBS = 50.0
"""What ZeRO-2's all-gather of the updated fp16 parameters reaches at best, GB/s: DeepSpeed runs
it after the step in 200 MB buckets (``allgather_bucket_size``), one NCCL call each, not
overlapped. bert's and roberta's zero-dp runs on one node take 30-56 GB/s for it (an eighth of
NVLink; the paper sets roberta's "NVLink" to 50 GB/s); chosen on those two models' traces."""
BYTES_PER_PARAMETER = 2
"""fp16 gradients and parameters (Rubick's DeepSpeed and Megatron runs train in mixed precision):
what the all-reduce, all-gather and offload move per parameter."""
PCIE_GBS = 32.0
"""PCIe Gen4 x16, one direction, GB/s: ZeRO-offload's path between GPU and host memory."""


@dataclass(frozen=True)
class Plan:
    """How a job runs on ``dp · tp · pp`` GPUs."""

    dp: int
    tp: int = 1
    pp: int = 1
    zero: bool = False
    """ZeRO-2: optimizer states and gradients sharded over the data-parallel replicas."""
    offload: bool = False
    """ZeRO-offload: the optimizer runs on the host's CPUs."""
    checkpointing: bool = False
    replica_batch: bool = False
    """Each data-parallel replica keeps the whole batch (the global batch grows with ``dp``), as
    Rubick's Megatron 3D runs do; otherwise the replicas split the global batch."""

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def batch_share(self) -> int:
        """The GPUs one batch is split over: all of them, or one replica's ``tp · pp``."""
        return self.tp * self.pp if self.replica_batch else self.gpus


_NAMED = {"dp", "ga", "gc", "zero-dp", "zero-offload"}


def parse_plan(name: str, gpus: int) -> Plan:
    """Rubick's plan name on ``gpus`` GPUs: a three-digit code ``<dp><tp><pp>`` (``184``: one
    replica, 8-way tensor parallel, 4 pipeline stages), or ``+``-joined names among dp, ga
    (gradient accumulation: plain data parallel at the fixed global batch), gc, zero-dp (ZeRO-2),
    zero-offload and tp (all GPUs tensor parallel). Refuses what the model cannot express."""
    if re.fullmatch(r"[1-9]{3}", name):
        dp, tp, pp = (int(ch) for ch in name)
        if dp * tp * pp != gpus:
            raise InputError(
                f"plan {name!r}: dp × tp × pp = {dp * tp * pp} but the placement has {gpus} GPUs; "
                "give the code whose digits multiply to the GPU count"
            )
        return Plan(dp, tp, pp, replica_batch=True)
    parts = set(name.split("+"))
    unknown = parts - _NAMED - {"tp"}
    if not name or unknown:
        raise InputError(
            f"plan {name!r}: unknown part(s) {', '.join(sorted(unknown)) or '(empty)'}; use a "
            "<dp><tp><pp> code or dp, ga, gc, zero-dp, zero-offload, tp joined by '+'"
        )
    zero, offload = "zero-dp" in parts, "zero-offload" in parts
    if "tp" in parts and (zero or offload):
        raise InputError(
            f"plan {name!r}: ZeRO with tensor parallelism is not modelled (Rubick neither); "
            "use tp with ga or gc, or ZeRO alone"
        )
    if zero and offload:
        raise InputError(f"plan {name!r}: zero-dp and zero-offload are exclusive; keep one")
    if "tp" in parts:
        return Plan(1, gpus, 1, checkpointing="gc" in parts)
    return Plan(gpus, zero=zero, offload=offload, checkpointing="gc" in parts)


@dataclass(frozen=True)
class Layout:
    """Where the GPUs sit: ``nodes`` servers, the smallest holding ``per_node`` of them."""

    nodes: int
    per_node: int
    nvlink_gbs: float = NVLINK_GBS
    nic_gbs: float = NIC_GBS
    pcie_gbs: float = PCIE_GBS

    @property
    def network_gbs(self) -> float:
        """What one ring crossing the nodes gets: a channel per NIC, and the smallest node's
        GPUs reach ``ceil(per_node / GPUS_PER_NIC)`` of its NICs (NCCL pins each GPU to the
        NIC on its PCIe switch)."""
        return self.nic_gbs * min(NICS_PER_NODE, math.ceil(self.per_node / GPUS_PER_NIC))


def layout_of(placement: str) -> Layout:
    """A placement as Rubick and Sia write it: GPUs per node, one digit a node (``2222``)."""
    if not re.fullmatch(r"[1-9]+", placement):
        raise InputError(f"placement {placement!r}: give one digit 1-9 per node, its GPU count")
    return Layout(len(placement), min(int(ch) for ch in placement))


@dataclass(frozen=True)
class Job:
    """The sizes Rubick's volumes need: parameters' bytes, global batch, sequence × hidden."""

    param_bytes: float
    batch: float
    seq_hidden: float
    cpu_threads: int = 4


@dataclass(frozen=True)
class Params:
    """Rubick's fitted constants (dimensionless, but ``k_const`` in ms)."""

    k_bwd: float
    k_sync: float
    k_overlap: float
    k_opt: float
    k_offload: float
    k_swap: float
    k_const: float


@dataclass(frozen=True)
class Parts:
    """One iteration's parts, ms."""

    forward: float
    backward_sync: float
    optimizer: float
    iteration: float


def _overlap(x: float, y: float, k: float) -> float:
    """``(x^k + y^k)^(1/k)``, scaled by the larger so a large ``k`` does not overflow."""
    top = max(x, y)
    return top * float(((x / top) ** k + (y / top) ** k) ** (1 / k)) if top > 0 else 0.0


def _ms(volume_bytes: float, gbs: float) -> float:
    return volume_bytes / (gbs * 1e6)


def iteration(p: Params, job: Job, plan: Plan, layout: Layout, forward_ms: float) -> Parts:
    """The modelled iteration of ``job`` under ``plan`` on ``layout`` (see the module doc)."""
    P = job.param_bytes

    def link(group_spans_gpus: int, rings: int = 1) -> float:
        """NVLink where the group fits in the smallest node, else the network, shared by the
        ``rings`` collectives that cross it at once."""
        inside = layout.nodes == 1 or group_spans_gpus <= layout.per_node
        return layout.nvlink_gbs if inside else layout.network_gbs / rings

    bwd = (p.k_bwd + plan.checkpointing) * forward_ms
    # each rank all-reduces its own shard's gradients, P / (tp · pp), with its data-parallel peers:
    # one ring per tensor-parallel rank, all crossing the same nodes' NICs at once. ZeRO-2 moves
    # as much in its bucketed reductions (the paper's V_dp holds for the ZeRO series too: bert's
    # and roberta's zero-dp runs spend about what ga's do here) and all-gathers after the step
    rings = min(plan.tp, layout.per_node)
    shard = P / (plan.tp * plan.pp)
    sync = p.k_sync * _ms(2 * shard * (plan.dp - 1) / plan.dp, link(plan.dp * plan.tp, rings))
    comm = 0.0
    if plan.tp > 1:
        replica = job.batch if plan.replica_batch else job.batch / plan.dp
        v_tp = 4 * 8 * replica * job.seq_hidden * (plan.tp - 1) / plan.tp
        comm += p.k_sync * _ms(v_tp, link(plan.tp))
    if plan.pp > 1:
        comm += p.k_sync * _ms(2 * 8 * job.seq_hidden * plan.pp, link(plan.gpus))
    if plan.offload:  # each replica's gradient shard goes to host memory during backward
        sync += p.k_swap * _ms(2 * P / plan.dp, layout.pcie_gbs)
    cc = _overlap(bwd, sync, p.k_overlap) + comm
    opt = p.k_opt * P / 1e6 / (plan.tp * plan.pp * (plan.dp if plan.zero else 1))
    if plan.zero:  # the updated shards are all-gathered back to every replica, bucket by bucket
        gather = min(ZERO_GATHER_GBS, link(plan.dp * plan.tp, rings))
        opt += p.k_sync * _ms(shard * (plan.dp - 1) / plan.dp, gather)
    if plan.offload:  # the CPUs update the shard; the GPU part (copying it back) stays
        opt += p.k_offload * P / 1e6 / (plan.dp * job.cpu_threads)
    return Parts(forward_ms, cc, opt, forward_ms + cc + opt + p.k_const)


@dataclass(frozen=True)
class Run:
    """One profiled run: its plan and layout and its measured parts (ms)."""

    plan: Plan
    layout: Layout
    measured: Parts


MIN_RUNS = 3
"""Fewer runs leave the seven constants unpinned even with three parts each."""


SYNC_PRIOR = 1.0
"""Weight holding ``ln k_sync`` at 0 (the links' stated bandwidths) against one log residual
when no run crosses nodes: one node's runs hide the all-reduce behind the backward pass, so
they barely pin ``k_sync``, and a drifted one multiplies every figure across nodes (the network
is 8-32x slower than NVLink). Runs across nodes pin it, and then they alone decide it."""


PARTS_SLACK = 0.01
"""How far a run's recorded parts may add up above its iteration (their rounding to the ms)
before the run contradicts the model: llama7b's profile (and llama30b's, its copy) holds two
ZeRO-offload runs 2.5 % and 3.8 % over, every other Rubick profile run is below."""


def _parts_exceed_iteration(m: Parts) -> bool:
    return m.forward + m.backward_sync + m.optimizer > (1 + PARTS_SLACK) * m.iteration


def fit(job: Job, runs: Sequence[Run]) -> Params:
    """Rubick's constants for ``job`` from its profiled runs: least squares on the log of each
    run's backward+sync, optimizer and iteration time (the sum of three RMSLE terms), with each
    run's measured forward as the input. Positive constants, overlap exponent at least 1.
    Refuses runs the model cannot be: parts adding up above their iteration (``PARTS_SLACK``)."""
    if len(runs) < MIN_RUNS:
        raise InputError(f"fit: {len(runs)} profiled run(s); Rubick's model needs at least {MIN_RUNS}")
    over = [r.measured for r in runs if _parts_exceed_iteration(r.measured)]
    if over:
        listed = "; ".join(
            f"{m.forward:g} + {m.backward_sync:g} + {m.optimizer:g} > {m.iteration:g} ms" for m in over
        )
        raise InputError(
            f"fit: {len(over)} profiled run(s) whose forward + backward/sync + optimizer exceed the "
            f"iteration ({listed}); the model's iteration is their sum plus a non-negative constant, "
            "so such a run cannot be fitted: measure it again or leave it out"
        )

    def params(theta: np.ndarray) -> Params:
        e = np.exp(theta)
        return Params(e[0], e[1], 1 + e[2], e[3], e[4], e[5], e[6])

    observed = np.log([[r.measured.backward_sync, r.measured.optimizer, r.measured.iteration] for r in runs])

    def residuals(theta: np.ndarray) -> np.ndarray:
        p = params(theta)
        pred = [iteration(p, job, r.plan, r.layout, r.measured.forward) for r in runs]
        fitted = (np.log([[q.backward_sync, q.optimizer, q.iteration] for q in pred]) - observed).ravel()
        return np.append(fitted, prior * theta[1])

    prior = SYNC_PRIOR if all(r.layout.nodes == 1 for r in runs) else 0.0

    start = np.log([2.0, 1.0, 1.0, 0.1, 1.0, 1.0, 10.0])
    with np.errstate(all="ignore"):  # far trial steps overflow; their cost loses the min below
        best = min(
            (least_squares(residuals, start + shift, method="lm") for shift in (0.0, -2.0, 2.0)),
            key=lambda r: float(r.cost),
        )
    return params(best.x)


@dataclass(frozen=True)
class Forward:
    """Forward time on ``g`` GPUs sharing the global batch: ``fixed + whole / g`` ms (the split
    batch shrinks each GPU's work; kernels' fixed costs do not shrink)."""

    fixed: float
    whole: float

    def at(self, gpus: int) -> float:
        return self.fixed + self.whole / gpus


def fit_forward(runs: Sequence[Run]) -> Forward:
    """``Forward`` by least squares on the runs' measured forward times (non-negative terms),
    for plans whose forward was not measured (Rubick's 3D rows record none)."""
    rows = [(r.plan.gpus, r.measured.forward) for r in runs if r.measured.forward > 0]
    if not rows:
        raise InputError("fit_forward: no profiled run has a measured forward time")
    a = np.array([[1.0, 1.0 / g] for g, _ in rows])
    y = np.array([f for _, f in rows])
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    if coef[0] < 0 or coef[1] < 0:  # one term alone: the better of the two non-negative fits
        whole = float(np.dot(a[:, 1], y) / np.dot(a[:, 1], a[:, 1]))
        fixed = float(np.mean(y))
        err_whole = float(np.sum((y - whole * a[:, 1]) ** 2))
        err_fixed = float(np.sum((y - fixed) ** 2))
        return Forward(0.0, whole) if err_whole <= err_fixed else Forward(fixed, 0.0)
    return Forward(float(coef[0]), float(coef[1]))


def predict(p: Params, job: Job, forward: Forward, plan: Plan, layout: Layout) -> float:
    """Iteration seconds of ``plan`` on ``layout``, its forward from ``forward``."""
    return iteration(p, job, plan, layout, forward.at(plan.batch_share)).iteration / 1000
