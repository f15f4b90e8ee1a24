"""The preemptions of one replay: ``when[m, t]`` = position in tick ``t`` (0..1) at which spot
market ``m`` gives its instances the cloud's preemption *notice*, NaN for none; the cloud
reclaims them ``NOTICE_S`` later (what the engine and the replayed daemon both do with it:
``spotopt.whatif.engine``, ``spotopt.replay.harness``).

One table per run, shared by every strategy and by the oracle (common random numbers): two
strategies that sit on the same market in the same hour see the same preemption, so their
difference is the strategy's, not the dice's. On-demand markets are never preempted.

- ``none``: no preemptions (the seeds' setting).
- ``model``: per spot market and tick a preemption with probability ``1 - exp(-rate · tick)``
  (exponential lifetimes with the market's rate from ``spotopt.history.market``), at a uniform position
  in the tick; numpy's PCG64 seeded with ``seed``, so equal seeds give equal tables.
- ``replay``: the recorded ends of preempted instances (``instance_lifetimes`` with
  ``end_reason = 'preempted'``) of each market: the notice ``NOTICE_S`` before each end, placed
  at its tick and position. A market whose capacity is replayed (``Timeline.capacity``, from
  capacity observations) is preempted exactly when it turns unavailable instead
  (``with_capacity``), and cannot be launched again until it is available.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from spotopt.db.queries import preemption_ends
from spotopt.errors import InputError
from spotopt.whatif.timeline import Timeline, load_capacity

Array = np.ndarray[Any, Any]


NOTICE_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
"""Seconds from a spot preemption notice to the reclaim, per cloud: AWS's interruption notice
(IMDS ``spot/instance-action``) comes two minutes ahead; GCP's ``instance/preempted`` about 30 s
ahead; Azure's Scheduled Events ``Preempt`` at least 30 s ahead (``shared/notes/cloud-apis.md``
§2.6, §3.5, §4.6, from each cloud's documentation)."""


class PreemptionMode(StrEnum):
    NONE = "none"
    MODEL = "model"
    REPLAY = "replay"


def no_preemptions(tl: Timeline) -> Array:
    return np.full(tl.price.shape, np.nan)


def model_preemptions(tl: Timeline, seed: int) -> Array:
    """Draw the table from each market's rate (see the module docstring)."""
    rng = np.random.default_rng(seed)
    p = 1.0 - np.exp(-np.asarray(tl.rate, dtype=float) * tl.tick_h)
    hit = rng.random(tl.price.shape) < p[:, None]
    pos = rng.random(tl.price.shape)
    out = np.where(hit, pos, np.nan)
    out[tl.on_demand] = np.nan
    return out


def replayed_preemptions(session: Session, tl: Timeline) -> tuple[Array, int]:
    """The table from recorded preemptions; also how many markets had any record in the window."""
    ids = {m.quote.market_id: i for i, m in enumerate(tl.markets)}
    end = tl.time(tl.n_ticks)
    rows = preemption_ends(session, tl.start, end)
    out = no_preemptions(tl)
    seen: set[int] = set()
    for market_id, ended in rows:
        m = ids.get(market_id)
        if m is None or tl.on_demand[m]:
            continue
        tick = _tick_of(tl, ended - timedelta(seconds=NOTICE_S[tl.markets[m].quote.cloud]))
        t = int(tick)
        if 0 <= t < tl.n_ticks and np.isnan(out[m, t]):
            out[m, t] = tick - t
            seen.add(m)
    return out, len(seen)


def with_capacity(tl: Timeline, table: Array) -> Array:
    """``table`` with every market whose capacity is replayed preempted when, and only when, it
    turns unavailable (``Capacity.down_at``): the notice ``NOTICE_S`` before the reclaim, in the
    tick it falls in. The first notice of a tick stands."""
    if tl.capacity is None:
        return table
    cap = tl.capacity
    out = table.copy()
    out[cap.observed] = np.nan
    for m in np.flatnonzero(cap.observed & ~tl.on_demand).tolist():
        ticks = np.flatnonzero(np.isfinite(cap.down_at[m]))
        notice = ticks + cap.down_at[m, ticks] - NOTICE_S[tl.markets[m].quote.cloud] / 3600.0 / tl.tick_h
        notice = notice[notice >= 0]
        at = np.floor(notice).astype(np.int64)
        first = np.ones(len(at), dtype=bool)
        first[1:] = at[1:] != at[:-1]
        out[m, at[first]] = notice[first] - at[first]
    return out


def _tick_of(tl: Timeline, at: datetime) -> float:
    return (at - tl.start).total_seconds() / 3600.0 / tl.tick_h


def preemption_table(session: Session | None, tl: Timeline, mode: PreemptionMode, seed: int) -> Array:
    """The table for ``mode``. ``replay`` also replays the capacity observed in the window
    (``Timeline.capacity``, set here): each market with capacity observations is launched only
    while available and preempted when it turns unavailable; the others by their recorded
    preemptions. ``replay`` with neither in the window is an error."""
    if mode is PreemptionMode.NONE:
        return no_preemptions(tl)
    if mode is PreemptionMode.MODEL:
        return model_preemptions(tl, seed)
    if session is None:
        raise InputError("--preemptions replay needs the history database")
    table, markets = replayed_preemptions(session, tl)
    tl.capacity = load_capacity(session, tl)
    if markets == 0 and tl.capacity is None:
        raise InputError(
            "--preemptions replay: the history has no recorded preemptions (instance_lifetimes) nor "
            "capacity observations in this window; import them (spotopt import lifetimes | "
            "availability) or use --preemptions model to draw them from the interruption rates"
        )
    return with_capacity(tl, table)
