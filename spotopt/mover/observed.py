"""What the mover learns from its own jobs: spot lifetimes, spot capacity and measured throughput.

All write into tables the planner and the reports already read, so a running fleet sharpens the
next decision without a second estimate anywhere:

- ``record_lifetime`` puts each spot placement's life into ``instance_lifetimes`` (source
  ``spotopt``): ``spotopt.history.market.snapshot`` refines the cloud's preemption rate with them (a
  censored exponential estimate under a Gamma prior, see ``spotopt.history.market``). A life the cloud
  ended is a preemption; one we ended (a move, the job finished, a budget stop) is censored: it
  says the market held at least that long, not that it failed.
- ``record_capacity`` turns each launch the daemon attempts on a spot market into a capacity
  observation (source ``daemon``): an instance came back, or the cloud refused for capacity.
- ``record_throughput`` keeps the agents' steps/s as the ``measured`` figure of the workload on
  that GPU, which ``spotopt.throughput.JobThroughput`` prefers to imported and estimated ones.

The executor calls them inside its own transactions; none commits.
"""

from __future__ import annotations

import math
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotopt.db.models import CapacityObservation, InstanceLifetime, Market, Placement, Throughput
from spotopt.history.ingest import insert_missing
from spotopt.history.throughput_store import validate_row
from spotopt.types import MarketKind

LIFETIME_SOURCE = "spotopt"
"""``instance_lifetimes.source`` of the lives the mover records (imports use their own)."""
CAPACITY_SOURCE = "daemon"
"""``capacity_observations.source`` of the daemon's launch attempts."""

THROUGHPUT_HALF_LIFE_S = 600.0
"""How fast the measured figure forgets: a heartbeat ten minutes old weighs half as much as now."""


PREEMPTION_ENDS = frozenset({"preempted", "noticed"})
"""``Placement.end_reason`` values that are preemptions: ``preempted``, the cloud reclaimed the
instance; ``noticed``, the cloud gave its preemption notice and the agent saved the job and
ended the instance before the reclaim. Only ``preempted`` earns a cloud's interruption refund
(``spotopt.mover.billing``): an instance we ended is billed like any other."""


def record_lifetime(session: Session, placement: Placement) -> None:
    """Write or update the ``instance_lifetimes`` row of a spot ``placement``.

    ``instance_ref`` is the placement's idempotency key, so calling this again (every tick while
    it runs, once more when it ends, again after a crash) updates the one row. ``end_reason`` is
    ``preempted`` when the cloud took the instance or gave notice that it would
    (``PREEMPTION_ENDS``) and ``terminated`` for every other end (we terminated it, its job
    exited or finished, it was lost): a censored life. A placement still
    running is recorded with no end, counting exposure up to the time the planner looks. An
    on-demand placement, or one that never started, records nothing: it says nothing about
    preemption. Only the leading daemon writes, so the look-up before the write does not race;
    the unique constraint (market, instance_ref, source) would refuse a second row regardless.
    """
    if placement.started_at is None:
        return
    kind = session.scalar(select(Market.kind).where(Market.id == placement.market_id))
    if kind != MarketKind.SPOT:
        return
    if placement.ended_at is None:
        end_reason = None
    else:
        end_reason = "preempted" if placement.end_reason in PREEMPTION_ENDS else "terminated"
    row = session.scalar(
        select(InstanceLifetime).where(
            InstanceLifetime.market_id == placement.market_id,
            InstanceLifetime.instance_ref == placement.key,
            InstanceLifetime.source == LIFETIME_SOURCE,
        )
    )
    if row is None:
        row = InstanceLifetime(
            market_id=placement.market_id, instance_ref=placement.key, source=LIFETIME_SOURCE
        )
        session.add(row)
    row.started_at = placement.started_at
    row.ended_at = placement.ended_at
    row.end_reason = end_reason
    session.flush()


def record_capacity(session: Session, market_id: int, at: datetime, available: bool) -> None:
    """Record that one launch on ``market_id`` at ``at`` got its instance (``available``: 1 of 1
    launched) or was refused for capacity (0 of 1). Other refusals (a quota, credentials, an
    image) say nothing about capacity, and callers record nothing for them; on-demand markets
    record nothing either (capacity observations are about spot markets). Two observations of
    one market at the same instant (two jobs launched there within one tick of a simulated
    clock) keep the first.
    """
    kind = session.scalar(select(Market.kind).where(Market.id == market_id))
    if kind != MarketKind.SPOT:
        return
    insert_missing(
        session,
        CapacityObservation,
        {
            "market_id": market_id,
            "observed_at": at,
            "source": CAPACITY_SOURCE,
            "available": available,
            "launched": int(available),
            "requested": 1,
        },
    )


def record_throughput(
    session: Session, workload: str, gpu_model: str, gpu_count: int, steps_per_s: float, at: datetime
) -> None:
    """Fold one heartbeat's steps/s into the ``measured`` figure of ``workload`` on ``gpu_count``
    GPUs of ``gpu_model`` (upsert on workload, GPU, count and source).

    Successive heartbeats combine as a time-decayed mean: the stored value moves towards the new
    one by ``1 - 0.5 ** (Δt / THROUGHPUT_HALF_LIFE_S)``, Δt the time since the stored figure. A
    heartbeat's rate covers a short window and is noisy (a checkpoint write, a slow data
    loader): the latest value alone would let one unlucky heartbeat re-plan the fleet, a plain
    mean of all of them would never follow a real change (new code, a slower host). The warm-up
    after a (re)start never reaches here: the agent reports no rate for an interval that began
    before it (``spotopt.agent.steady``), the rule ``spotopt throughput profile`` measures by.
    Weighing by elapsed time rather than by count makes the figure nearly the same whether the daemon polls
    every 5 s or every minute; a real change shows half within 10 minutes, 7/8 within 30.
    A heartbeat not newer than the stored figure (the same heartbeat read twice, or out of order)
    changes nothing, so re-reading is idempotent. ``gpu_model`` is canonicalised as
    ``spotopt throughput import`` does; a bad value raises ``InputError`` naming the field.
    """
    row = validate_row(
        f"throughput of {workload!r}",
        {"workload": workload, "gpu_model": gpu_model, "gpu_count": gpu_count, "steps_per_s": steps_per_s},
    )
    stored = session.scalar(
        select(Throughput).where(
            Throughput.workload == row["workload"],
            Throughput.gpu_model == row["gpu_model"],
            Throughput.gpu_count == row["gpu_count"],
            Throughput.source == "measured",
        )
    )
    if stored is None:
        session.add(
            Throughput(
                workload=row["workload"],
                gpu_model=row["gpu_model"],
                gpu_count=row["gpu_count"],
                steps_per_s=row["steps_per_s"],
                source="measured",
                recorded_at=at,
                note="from the agents' heartbeats",
            )
        )
    elif at > stored.recorded_at:
        elapsed_s = (at - stored.recorded_at).total_seconds()
        weight = 1.0 - math.pow(0.5, elapsed_s / THROUGHPUT_HALF_LIFE_S)
        stored.steps_per_s += weight * (row["steps_per_s"] - stored.steps_per_s)
        stored.recorded_at = at
    session.flush()
