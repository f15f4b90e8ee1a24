"""What the daemon decides on: its jobs' options priced now, with the forecast from the history.

The what-if engine builds the same ``Options`` from its timeline (``spotopt.whatif.spotopt_decider``);
the daemon builds them here from the SQL history at the moment it decides: the snapshot at ``at``
(``spotopt.history.market.snapshot``: prices and preemption rates known then), the options of the jobs
(``spotopt.decide.options.enumerate_options``, the builder ``spotopt plan`` uses) and, per market, the
forecast of ``spotopt.decide.forecast`` learnt from the ``history_h`` hours before ``at``, sampled
every planning period as the what-if engine samples its ticks, and the markets' spot capacity as
recorded before ``at`` (``market_availability``: the what-if's ``Capacity.seen``, over the same
look-back). Nothing after ``at`` is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from spotopt.db.models import PricePoint
from spotopt.db.queries import MarketFilter, capacity_history, prices_at
from spotopt.decide.fleet import Availability, Options
from spotopt.decide.forecast import forecast, step_prices
from spotopt.decide.options import OptionTable, enumerate_options, price_options
from spotopt.history.capacity import Capacity
from spotopt.history.market import MarketState, snapshot
from spotopt.jobspec import JobSpec
from spotopt.throughput import StoredFigure

Array = np.ndarray[Any, Any]

FORECAST_STEP_MIN_H = 0.5
"""The forecast samples the history at the planning period, but no finer than this: a daemon run
with a period of seconds (tests, demos) would otherwise sample 30 days into millions of steps.
Prices change hourly at the finest, so a half-hour step loses nothing."""
HISTORY_H = 30 * 24.0
"""Hours of history the forecast learns excursion lengths from (its baseline uses its own 72 h),
and the capacity rule outage and run lengths."""
CAPACITY_STEPS_MAX = 4096
"""Capacity is sampled at the planning period itself (the capacity rule's tables tick at it),
over ``HISTORY_H`` or this many steps, whichever is shorter: a daemon run with a period of
seconds (tests, demos) learns from its last few hours rather than from millions of steps."""


@dataclass(frozen=True)
class MarketView:
    at: datetime
    markets: list[MarketState]
    table: OptionTable
    options: Options


def market_view(
    session: Session,
    spec: JobSpec,
    at: datetime,
    locations: list[tuple[str, str]],
    figures: Sequence[StoredFigure] = (),
    *,
    period_h: float = 1.0,
    billing: str = "instance",
    history_h: float = HISTORY_H,
    flt: MarketFilter | None = None,
) -> MarketView:
    """The options of ``spec``'s jobs at ``at``; ``locations`` (the fleet's) gains new regions."""
    markets = snapshot(session, at, flt)
    table = enumerate_options(
        spec, markets, at, figures, period_h=period_h, billing=billing, missed_deadlines=True
    )
    baseline, revert = market_forecast(session, markets, at, period_h, history_h, flt)
    opts = price_options(table, markets, at, locations, baseline, revert)
    return MarketView(at, markets, table, opts)


def market_availability(
    session: Session,
    markets: Sequence[MarketState],
    at: datetime,
    step_h: float,
    refused: Array,
    running: Array,
    history_h: float = HISTORY_H,
) -> Availability | None:
    """The spot capacity known at ``at`` of ``markets`` (``None``: none observed): per step of
    ``step_h`` hours ending at ``at`` what had been recorded before it (``Capacity.seen``, the
    what-if's own rule), corrected by the caller's launches (``refused``/``running``, masks over
    ``markets``; ``Availability.known``)."""
    spot = {m.quote.market_id: i for i, m in enumerate(markets) if m.quote.market == "spot"}
    n_steps = min(int(np.floor(history_h / step_h + 1e-9)) + 1, CAPACITY_STEPS_MAX)
    since = at - timedelta(hours=(n_steps - 1) * step_h)
    rows = capacity_history(session, list(spot), since, at)
    if not rows:
        return None
    cap = Capacity.from_observations(
        len(markets),
        n_steps,
        step_h,
        np.array([spot[r.market_id] for r in rows], dtype=np.int64),
        np.array([(r.observed_at - since).total_seconds() / 3600.0 for r in rows]),
        np.array([r.available for r in rows], dtype=bool),
    )
    return Availability.known(cap.observed, cap.seen, step_h, refused, running)


def market_forecast(
    session: Session,
    markets: Sequence[MarketState],
    at: datetime,
    period_h: float,
    history_h: float,
    flt: MarketFilter | None = None,
) -> tuple[Array, Array]:
    """Per market: the forecast's baseline and expected hours to it at ``at`` (instance prices);
    ``flt`` as the snapshot's, so only those markets' history is read."""
    since = at - timedelta(hours=history_h)
    period_h = max(period_h, FORECAST_STEP_MIN_H)
    n_ticks = int(np.floor(history_h / period_h + 1e-9)) + 1
    ticks_s = (np.arange(n_ticks) * period_h - (n_ticks - 1) * period_h) * 3600.0  # ends at ``at``
    ids = {m.quote.market_id: i for i, m in enumerate(markets)}
    rows: dict[int, list[tuple[float, float]]] = {i: [] for i in range(len(markets))}
    for market_id, observed_at, usd in history_points(session, since, at, flt or MarketFilter()):
        i = ids.get(market_id)
        if i is not None:
            rows[i].append(((observed_at - at).total_seconds(), usd))
    prices = np.full((len(markets), n_ticks), np.nan)
    for i, points in rows.items():
        if points:
            points.sort()
            times = np.array([t for t, _ in points])
            values = np.array([v for _, v in points])
            prices[i] = step_prices(times, values, ticks_s)
    baseline, revert = forecast(prices, period_h)
    return baseline[:, -1], revert[:, -1]


def history_points(
    session: Session, since: datetime, until: datetime, flt: MarketFilter
) -> Iterator[tuple[int, datetime, float]]:
    """``(market_id, observed_at, usd_per_hour)`` of the points ``price_history`` gives for
    ``[since, until]`` (the point in effect at ``since``, then every point in the window; of two
    sources at one instant the first by name), for every market: the caller keeps those of its
    snapshot, which ``flt`` selected. Three plain columns instead of a ``Quote`` per point: the
    forecast reads every point of every market each tick."""
    for q in prices_at(session, since, flt):
        if q.observed_at < since:
            yield q.market_id, q.observed_at, q.usd_per_hour
    stmt = (
        select(PricePoint.market_id, PricePoint.observed_at, PricePoint.usd_per_hour)
        .where(PricePoint.observed_at >= since, PricePoint.observed_at <= until)
        .order_by(PricePoint.market_id, PricePoint.observed_at, PricePoint.source)
    )
    last: tuple[int, datetime] | None = None
    for market_id, observed_at, usd in session.execute(stmt):
        if (market_id, observed_at) != last:
            last = (market_id, observed_at)
            yield market_id, observed_at, usd
