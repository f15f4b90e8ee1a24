"""The ledger: what each placement of a managed job cost, by its cloud's billing rule.

One row per instance interval (a ``Placement`` from the launch call's return to the terminate
call's return, or to ``now`` while it runs). Its price is the market's price *in effect* over the
interval (the price history is a step function: a point holds until the next one), priced for
the job's slot as the decision core prices it (``spotopt.price``: the instance's price over the
jobs sharing it) and averaged over the time it ran; the billed seconds are the cloud's
(``spotopt.mover.billing``: AWS/GCP per second with a 60 s minimum, AWS spot interrupted in its
first hour free, Azure whole minutes). A placement run by the ``local`` provider is priced as the
market it stands for, so a trial on one machine reports what the cloud would have billed.

Each row also carries the data egress that entering its placement caused: the checkpoint moved
from the region of the placement that wrote it and, into a region holding no copy, the dataset
from its home, priced by the one egress rule the planner, the decision core and the what-if
engine use (``spotopt.decide.egress.entry_usd`` over ``transfer_matrix`` at the move's time).
The executor records it on the move once, when the move grants the lease to the new epoch
(``record_entry_egress``), and it is billed with the placement that move launched, so a start
whose launch never returned bills none. A row's ``billed_usd`` is its instance time plus its
egress; the ledger's total, ``spent_usd`` and ``spent_by_job`` sum those.

This is the one cost function of the mover: the budget checks of the executor and the daemon,
``jobs show`` and ``jobs cost`` all read ``intervals`` (or its batched twin ``spent_by_job``),
and the fleet's spend-rate cap reads the same prices in effect (``fleet_usd_per_hour``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotopt.checkpoints.store import parse_checkpoint_name
from spotopt.clouds.common.base import market_label
from spotopt.db.models import InstanceType, JobMove, ManagedJob, Market, Placement, PricePoint
from spotopt.decide.egress import entry_usd, transfer_matrix
from spotopt.jobspec import Job
from spotopt.mover.billing import billed_seconds
from spotopt.price import SlotPrice, per_slot, usd_for
from spotopt.types import MarketKey, MarketKind


@dataclass(frozen=True, slots=True)
class Interval:
    """One billed instance interval of a job."""

    placement_id: int
    epoch: int
    provider: str
    instance_id: str | None
    market: str
    """``cloud/region/zone/instance type/kind`` (``spotopt.clouds.common.base.market_label``)."""
    cloud: str
    started_at: datetime
    ended_at: datetime | None
    """None: still running (billed up to the ledger's ``now``)."""
    end_reason: str | None
    usd_per_hour: float
    """The job slot's price in effect, averaged over the interval."""
    billed_s: float
    cost_usd: float
    """Instance time: ``usd_per_hour`` x ``billed_s`` (``spotopt.price.usd_for``)."""
    egress_from: str | None
    """``cloud/region`` of the checkpoint entering this placement moved (None: none moved in)."""
    egress_to: str | None
    """``cloud/region`` entered (None: no egress recorded, e.g. a placement from before 0006)."""
    egress_gb: float
    """GB that crossed a region or cloud to enter this placement (checkpoint and dataset)."""
    egress_usd: float

    @property
    def billed_usd(self) -> float:
        """What the row adds to the ledger's total: instance time and egress."""
        return self.cost_usd + self.egress_usd


@dataclass(frozen=True, slots=True)
class Egress:
    """The data transfer entering one placement caused (recorded on the move that entered it)."""

    usd: float
    gb: float
    source: str | None
    """``cloud/region`` of the checkpoint restored (None: no checkpoint, or none we placed)."""
    dest: str | None


NO_EGRESS = Egress(0.0, 0.0, None, None)


def market_key(session: Session, market_id: int) -> MarketKey:
    """The market of ``market_id`` as the providers name it."""
    market, itype = session.execute(
        select(Market, InstanceType)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .where(Market.id == market_id)
    ).one()
    return MarketKey(itype.cloud, market.region, market.zone or None, itype.name, MarketKind(market.kind))


def price_in_effect(
    session: Session, market_id: int, start: datetime, end: datetime, fallback: float
) -> float:
    """The time-weighted mean price of ``market_id`` over ``[start, end]`` (``fallback`` where the
    history has no point yet, e.g. a market priced only at launch).

    Two sources reporting the same instant are ordered by source name (the last one holds), so
    SQLite and PostgreSQL agree on which one is in effect.
    """
    return mean_price(*_steps_in(session, market_id, start, end), start, end, fallback)


def _steps_in(
    session: Session, market_id: int, start: datetime, end: datetime
) -> tuple[float | None, list[tuple[datetime, float]]]:
    """``_window`` read from the database for one market: the point in effect at ``start`` (None:
    none yet) and the changes strictly inside ``[start, end]``."""
    before = session.scalar(
        select(PricePoint.usd_per_hour)
        .where(PricePoint.market_id == market_id, PricePoint.observed_at <= start)
        .order_by(PricePoint.observed_at.desc(), PricePoint.source.desc())
        .limit(1)
    )
    if end <= start:
        return before, []
    changes = session.execute(
        select(PricePoint.observed_at, PricePoint.usd_per_hour)
        .where(
            PricePoint.market_id == market_id,
            PricePoint.observed_at > start,
            PricePoint.observed_at < end,
        )
        .order_by(PricePoint.observed_at, PricePoint.source)
    ).all()
    return before, [(when, usd) for when, usd in changes]


def mean_price(
    before: float | None,
    changes: Sequence[tuple[datetime, float]],
    start: datetime,
    end: datetime,
    fallback: float,
) -> float:
    """The time-weighted mean of a step function over ``[start, end]``: ``before`` holds at
    ``start`` (None: ``fallback``), then each of ``changes`` (inside the interval, in time order)
    from its time on. The one computation behind ``price_in_effect`` and ``slot_mean``."""
    price = float(before) if before is not None else fallback
    if end <= start:
        return price
    total, at = 0.0, start
    for when, usd in changes:
        total += price * (when - at).total_seconds()
        price, at = float(usd), when
    total += price * (end - at).total_seconds()
    return total / (end - start).total_seconds()


def slot_usd_per_hour(session: Session, p: Placement, start: datetime, end: datetime) -> float:
    """The job slot's price of placement ``p`` in effect over ``[start, end]`` (``slot_mean``)."""
    return slot_mean(p.price, *_steps_in(session, p.market_id, start, end), start, end)


def slot_mean(
    launched: SlotPrice,
    before: float | None,
    changes: Sequence[tuple[datetime, float]],
    start: datetime,
    end: datetime,
) -> float:
    """The time-weighted mean price of a slot launched at ``launched`` over ``[start, end]``, its
    market's step function (``before``, ``changes``: instance prices, as ``_window`` reads them)
    priced for the slot by the decision core's rule (``spotopt.price.per_slot``), so a slot billed
    at the price it was decided at costs what the decision said; where the history has no price
    yet, the launch price as recorded. ``interval``, ``spent_by_job``, the fleet's spend rate and
    the budget checks all bill a slot by this."""
    jobs = launched.jobs_per_instance
    return mean_price(
        None if before is None else per_slot(before, jobs),
        [(when, per_slot(usd, jobs)) for when, usd in changes],
        start,
        end,
        launched.usd_per_hour,
    )


def fleet_usd_per_hour(session: Session, now: datetime) -> float:
    """What the launching and running placements cost per hour now: each slot at its market's
    price in effect now, the price the budget checks bill (the fleet's spend-rate cap compared
    launch prices once, so a price that rose since went unseen)."""
    running = session.scalars(select(Placement).where(Placement.state.in_(("launching", "running")))).all()
    steps = _price_steps(session, sorted({p.market_id for p in running}), now)
    total = 0.0
    for p in running:  # as ``slot_usd_per_hour(session, p, now, now)``, the prices read at once
        total += slot_mean(p.price, *_window(steps.get(p.market_id, ([], [])), now, now), now, now)
    return total


def intervals(session: Session, job_id: int, now: datetime) -> list[Interval]:
    """Every instance interval of the job that ran (launched and returned), oldest first."""
    placements = session.scalars(
        select(Placement)
        .where(Placement.job_id == job_id, Placement.started_at.is_not(None))
        .order_by(Placement.started_at, Placement.id)
    ).all()
    egress = _egress_by_placement(session, [p.id for p in placements])
    return [interval(session, p, now, egress.get(p.id, NO_EGRESS)) for p in placements]


def interval(session: Session, p: Placement, now: datetime, egress: Egress = NO_EGRESS) -> Interval:
    """The ledger row of one placement (``now`` ends it while it runs) with its entry's egress."""
    assert p.started_at is not None
    end = p.ended_at or max(now, p.started_at)
    slot_usd = slot_usd_per_hour(session, p, p.started_at, end)
    return _row(p, market_key(session, p.market_id), slot_usd, now, egress)


def _row(p: Placement, market: MarketKey, slot_usd: float, now: datetime, egress: Egress) -> Interval:
    """The ledger row of placement ``p`` on ``market`` at the slot's mean price ``slot_usd``."""
    assert p.started_at is not None
    end = p.ended_at or max(now, p.started_at)
    # Only a spot instance can be reclaimed by its cloud (AWS's first-hour refund is a Spot rule);
    # an on-demand placement that vanished is billed like one we ended.
    reclaimed = p.end_reason == "preempted" and market.kind is MarketKind.SPOT
    seconds = billed_seconds(market.cloud, p.started_at, end, interrupted_by_cloud=reclaimed)
    return Interval(
        placement_id=p.id,
        epoch=p.epoch,
        provider=p.provider,
        instance_id=p.instance_id,
        market=market_label(market),
        cloud=market.cloud,
        started_at=p.started_at,
        ended_at=p.ended_at,
        end_reason=p.end_reason,
        usd_per_hour=slot_usd,
        billed_s=seconds,
        cost_usd=usd_for(slot_usd, seconds),
        egress_from=egress.source,
        egress_to=egress.dest,
        egress_gb=egress.gb,
        egress_usd=egress.usd,
    )


def total_usd(rows: Sequence[Interval]) -> float:
    """The ledger's total: what every interval of the job cost, instance time and egress, across
    moves."""
    return sum((r.billed_usd for r in rows), 0.0)


def egress_usd(rows: Sequence[Interval]) -> float:
    """The part of ``total_usd`` that is data egress."""
    return sum((r.egress_usd for r in rows), 0.0)


def spent_usd(session: Session, job_id: int, now: datetime) -> float:
    """What the job has cost so far, running instances billed up to ``now``."""
    return total_usd(intervals(session, job_id, now))


BATCH = 2000
"""Ids per ``IN (...)`` list: well under SQLite's bound-parameter limit."""


def spent_by_job(session: Session, job_ids: Sequence[int], now: datetime) -> dict[int, float]:
    """``spent_usd`` of every job in ``job_ids`` at once (0.0 for a job that never ran).

    The daemon needs every active job's spend each tick; per job that is a query per placement
    and two per price lookup. Here it is a few queries in all: the placements, their markets, and
    the price points of those markets from the earliest placement start on (plus the point in
    effect then), plus the moves' recorded egress, after which each row is computed exactly as
    ``interval`` computes it (``slot_mean``, ``_row``) and summed as ``total_usd`` sums it, in the
    same order, so the totals are equal to the last bit.
    """
    out = dict.fromkeys(job_ids, 0.0)
    placements: list[Placement] = []
    for chunk in _chunks(list(out)):
        placements += session.scalars(
            select(Placement)
            .where(Placement.job_id.in_(chunk), Placement.started_at.is_not(None))
            .order_by(Placement.job_id, Placement.started_at, Placement.id)
        ).all()
    if not placements:
        return out
    market_ids = sorted({p.market_id for p in placements})
    keys = _market_keys(session, market_ids)
    steps = _price_steps(session, market_ids, min(p.started_at for p in placements if p.started_at))
    egress = _egress_by_placement(session, [p.id for p in placements])
    for p in placements:
        assert p.started_at is not None
        end = p.ended_at or max(now, p.started_at)
        window = _window(steps.get(p.market_id, ([], [])), p.started_at, end)
        slot_usd = slot_mean(p.price, *window, p.started_at, end)
        out[p.job_id] += _row(p, keys[p.market_id], slot_usd, now, egress.get(p.id, NO_EGRESS)).billed_usd
    return out


def _egress_by_placement(session: Session, placement_ids: list[int]) -> dict[int, Egress]:
    """The recorded egress of each placement that a move entered (placements are created by one
    move each, keyed by it, so a placement has at most one)."""
    out = {}
    for chunk in _chunks(placement_ids):
        rows = session.execute(
            select(
                JobMove.to_placement_id,
                JobMove.egress_usd,
                JobMove.egress_gb,
                JobMove.egress_from,
                JobMove.egress_to,
            ).where(JobMove.to_placement_id.in_(chunk), JobMove.egress_to.is_not(None))
        ).all()
        for pid, usd, gb, source, dest in rows:
            assert pid is not None  # matched by the IN list
            out[pid] = Egress(float(usd), float(gb), source, dest)
    return out


def record_entry_egress(session: Session, move_id: int, spec: Job, at: datetime) -> Egress:
    """Price and record on move ``move_id`` the egress of entering its market, once.

    The executor calls this when the move grants the lease to the new epoch, before the grant's
    side effect: from then on the new placement restores the checkpoint. A move that already
    has its egress (a step resumed after a crash) keeps it: the checkpoint it restores was
    decided before the lease moved, and the new placement may have written newer ones since.

    The checkpoint restored is the one the move verified (``checkpoint_name``; a start verifies
    none and restores the job's newest, ``ManagedJob.checkpoint_name``); its epoch names the
    placement that wrote it, whose region holds it. No checkpoint (a first start), or one no
    placement of ours wrote: nothing to move (``here`` -1), but a dataset living elsewhere still
    is, exactly as ``entry_usd`` rules. Prices are those in effect at ``at``.
    """
    move = session.get(JobMove, move_id, with_for_update=True)
    assert move is not None and move.market_id is not None
    if move.egress_to is not None:
        return Egress(move.egress_usd, move.egress_gb, move.egress_from, move.egress_to)
    egress = price_entry_egress(session, move, spec, at)
    move.egress_usd, move.egress_gb = egress.usd, egress.gb
    move.egress_from, move.egress_to = egress.source, egress.dest
    return egress


def price_entry_egress(session: Session, move: JobMove, spec: Job, at: datetime) -> Egress:
    """What entering ``move``'s market costs in egress (``record_entry_egress``'s rule, nothing
    written): also the launch's budget check, before the move has verified its checkpoint (the
    job's newest then stands for it: the placement being left writes both)."""
    assert move.market_id is not None
    job = session.get(ManagedJob, move.job_id)
    assert job is not None
    target = market_key(session, move.market_id)
    dest = (target.cloud, target.region)
    source = _checkpoint_location(session, job.id, move.checkpoint_name or job.checkpoint_name)
    data = spec.dataset if spec.dataset is not None and spec.dataset.gb > 0 else None
    home = (data.cloud, data.region) if data is not None else None
    locations = list(dict.fromkeys(loc for loc in (source, dest, home) if loc is not None))
    transfer = transfer_matrix(locations, at)
    n = len(locations)
    # 1 between two locations, 0 within one and from "nowhere": the same rule then counts GB.
    hops = np.vstack([1.0 - np.eye(n), np.zeros((1, n))])
    args = (
        np.array(locations.index(source) if source else -1),
        np.array(locations.index(dest)),
        np.array(spec.checkpoint_gb),
        np.array(data.gb if data is not None else 0.0),
        np.array(locations.index(home) if home else -1),
    )
    return Egress(
        usd=float(entry_usd(transfer, *args)),
        gb=float(entry_usd(hops, *args)),
        source=_place(source),
        dest=_place(dest),
    )


def _checkpoint_location(session: Session, job_id: int, checkpoint: str | None) -> tuple[str, str] | None:
    """``(cloud, region)`` of the placement that wrote ``checkpoint`` (None: none, or not ours)."""
    parsed = parse_checkpoint_name(checkpoint) if checkpoint else None
    if parsed is None:
        return None
    market_id = session.scalar(
        select(Placement.market_id).where(
            Placement.job_id == job_id, Placement.epoch == parsed[1], Placement.started_at.is_not(None)
        )
    )
    if market_id is None:
        return None
    key = market_key(session, market_id)
    return key.cloud, key.region


def _place(location: tuple[str, str] | None) -> str | None:
    return None if location is None else "/".join(location)


def _chunks(ids: list[int]) -> list[list[int]]:
    return [ids[i : i + BATCH] for i in range(0, len(ids), BATCH)]


def _market_keys(session: Session, market_ids: list[int]) -> dict[int, MarketKey]:
    out = {}
    for chunk in _chunks(market_ids):
        rows = session.execute(
            select(Market.id, InstanceType.cloud, Market.region, Market.zone, InstanceType.name, Market.kind)
            .join(InstanceType, InstanceType.id == Market.instance_type_id)
            .where(Market.id.in_(chunk))
        ).all()
        for mid, cloud, region, zone, name, kind in rows:
            out[mid] = MarketKey(cloud, region, zone or None, name, MarketKind(kind))
    return out


def _price_steps(
    session: Session, market_ids: list[int], since: datetime
) -> dict[int, tuple[list[datetime], list[float]]]:
    """Per market, its price points from the one in effect at ``since`` on, in time order."""
    out: dict[int, tuple[list[datetime], list[float]]] = {}
    for chunk in _chunks(market_ids):
        opening = session.execute(
            select(PricePoint.market_id, func.max(PricePoint.observed_at))
            .where(PricePoint.market_id.in_(chunk), PricePoint.observed_at <= since)
            .group_by(PricePoint.market_id)
        )
        starts: dict[int, datetime] = {mid: at for mid, at in opening}
        rows = session.execute(
            select(PricePoint.market_id, PricePoint.observed_at, PricePoint.usd_per_hour)
            .where(PricePoint.market_id.in_(chunk), PricePoint.observed_at >= min([since, *starts.values()]))
            .order_by(PricePoint.market_id, PricePoint.observed_at, PricePoint.source)
        )
        for mid, at, usd in rows:
            if at >= starts.get(mid, since):
                times, prices = out.setdefault(mid, ([], []))
                times.append(at)
                prices.append(usd)
    return out


def _window(
    steps: tuple[list[datetime], list[float]], start: datetime, end: datetime
) -> tuple[float | None, list[tuple[datetime, float]]]:
    """What ``price_in_effect`` reads for ``[start, end]``: the point in effect at ``start``
    (None: none yet) and the changes strictly inside the interval."""
    times, prices = steps
    first = bisect_right(times, start)
    before = prices[first - 1] if first else None
    last = bisect_left(times, end, lo=first)
    return before, list(zip(times[first:last], prices[first:last], strict=True))
