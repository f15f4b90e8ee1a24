"""What each cloud bills for one instance interval: the mover's ledger (``jobs cost``) uses these.

The planner and the what-if engine price time continuously ($/h x hours). A real bill rounds each
instance's running time by the cloud's own rule, so a ledger that shows "what we paid" must apply
that rule per interval. Each cloud's rule, with the official statement
it rests on, is ``billed_seconds`` in ``spotopt/clouds/<cloud>/billing.py``, named by the cloud's
registry entry (``spotopt.clouds.registry``).
"""

from __future__ import annotations

import math
from datetime import datetime

from spotopt.clouds.registry import CLOUDS, BillingRule, load
from spotopt.errors import InputError
from spotopt.price import usd_for


def billed_seconds(
    cloud: str, started_at: datetime, ended_at: datetime, *, interrupted_by_cloud: bool = False
) -> float:
    """The seconds ``cloud`` bills for one instance that ran from ``started_at`` to ``ended_at``.

    ``interrupted_by_cloud``: the cloud reclaimed the (spot) instance, rather than we stopping it;
    only AWS has a rule for it (no charge within the first hour).
    """
    ran_s = _ran_seconds(started_at, ended_at)
    entry = CLOUDS.get(cloud)
    if entry is None or entry.billed_seconds is None:
        billed = ", ".join(name for name, c in CLOUDS.items() if c.billed_seconds is not None)
        raise InputError(f"cloud: {cloud!r} has no billing rule; use one of {billed}")
    rule: BillingRule = load(entry.billed_seconds)
    return rule(ran_s, interrupted_by_cloud)


def interval_cost_usd(
    cloud: str,
    usd_per_hour: float,
    started_at: datetime,
    ended_at: datetime,
    *,
    interrupted_by_cloud: bool = False,
) -> float:
    """What one instance interval costs at ``usd_per_hour`` under ``cloud``'s billing rule (the
    ledger's rule for a row, and the launch's budget check for the period ahead)."""
    if not math.isfinite(usd_per_hour) or usd_per_hour < 0:
        raise InputError(f"usd_per_hour: {usd_per_hour!r} is not a price; give a finite value >= 0")
    seconds = billed_seconds(cloud, started_at, ended_at, interrupted_by_cloud=interrupted_by_cloud)
    return usd_for(usd_per_hour, seconds)


def _ran_seconds(started_at: datetime, ended_at: datetime) -> float:
    if started_at.tzinfo is None or ended_at.tzinfo is None:
        raise InputError("started_at/ended_at: times must carry a time zone (UTC); a naive time is ambiguous")
    ran_s = (ended_at - started_at).total_seconds()
    if ran_s < 0:
        raise InputError(
            f"ended_at: {ended_at.isoformat()} is before started_at {started_at.isoformat()}; "
            "an interval must end after it starts"
        )
    return ran_s
