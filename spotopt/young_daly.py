"""The Young/Daly checkpoint period, the one formula the planner and the agent share (a leaf
module: the agent must import nothing heavy, the planner nothing of the agent)."""

from __future__ import annotations

import math


def young_daly_s(checkpoint_s: float, preemptions_per_hour: float) -> float:
    """Young/Daly's optimal checkpoint period ``sqrt(2 · C · MTBF)`` in seconds (MTBF = 1/rate).

    It balances the time spent writing checkpoints (``C/tau`` of all time) against the expected
    recomputation after a preemption (``tau/2`` per preemption); ``spotopt.throughput`` uses the
    same rule to price preemption loss, so the plan and the agent agree.
    """
    if preemptions_per_hour <= 0:
        return math.inf
    return math.sqrt(2.0 * checkpoint_s * 3600.0 / preemptions_per_hour)
