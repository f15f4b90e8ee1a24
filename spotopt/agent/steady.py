"""Steps/s from an agent's progress reports, warm-up excluded: the one rule the agent's heartbeat
rate (which the daemon records as the ``measured`` figure) and ``spotopt throughput profile``
both use.

A training process's first steps run many times slower than the rest: CUDA context creation,
kernel compilation and autotuning (cuDNN benchmark, ``torch.compile``, XLA), the data loader
filling its queues, the allocator growing its pools; and a restored job's first interval also
holds the restore. A rate taken over them underestimates the job, by a factor of several on a
short window. So a rate starts only at a report at least ``WARMUP_STEPS`` steps past the step the
process started from; anything before that is warm-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

WARMUP_STEPS = 10
"""Steps after a (re)start left out of every rate: enough to cover the compilation and
autotuning of the first iterations (one to a few steps) and a data loader's prefetch (two
batches per worker by default in PyTorch), few enough to cost seconds, not minutes."""


@dataclass(frozen=True, slots=True)
class SteadyRate:
    """A rate and what it was taken over (the note of a measured figure says so)."""

    steps_per_s: float
    steps: int
    seconds: float


def steady_rate(
    reports: Sequence[tuple[float, int]], start_step: int, warmup_steps: int = WARMUP_STEPS
) -> SteadyRate | None:
    """Steps/s from ``reports`` (time in seconds, steps done by then; in time order) between the
    first report at least ``warmup_steps`` past ``start_step`` and the last report; None while
    fewer than two reports lie past the warm-up or no time passed between them."""
    past = [(t, step) for t, step in reports if step >= start_step + warmup_steps]
    if len(past) < 2:
        return None
    (t0, s0), (t1, s1) = past[0], past[-1]
    if t1 <= t0:
        return None
    return SteadyRate((s1 - s0) / (t1 - t0), s1 - s0, t1 - t0)
