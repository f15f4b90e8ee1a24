"""The price history of a window as numpy step functions: markets × ticks.

``price[m, t]`` is market ``m``'s price (USD per instance-hour) in effect at tick ``t``'s start,
the history's own rule (last point at or before the time); NaN means the market has no price
then and is unavailable. Prices are sampled at tick starts: a change inside a tick takes effect
at the next tick, which is when the planner would see it anyway. A float64 matrix rather than
quotes or ``spotopt.price.SlotPrice`` objects: the engine prices every option of every tick with
array operations (a job slot's share by the same ``spotopt.price.per_slot`` the daemon uses).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from spotopt.db.queries import (
    MarketFilter,
    Quote,
    capacity_history,
    lifetimes_started_before,
    price_history,
)
from spotopt.decide.forecast import step_prices
from spotopt.errors import InputError
from spotopt.history.capacity import Capacity
from spotopt.history.market import (
    DEFAULT_RATE_PER_HOUR,
    MarketState,
    cloud_state,
    interruptions_between,
    latest_interruptions,
    refined_rate,
    snapshot,
)

Array = np.ndarray[Any, Any]
SYNTHETIC_SOURCE = "synthetic-example"


@dataclass(frozen=True)
class Lives:
    """The recorded spot lives (``instance_lifetimes``) of a timeline's markets, as hours from
    its start: what the daemon's rate estimate reads as its clock advances."""

    market: Array
    start_h: Array
    end_h: Array
    """``inf``: no end recorded (still running, as far as the history knows)."""
    preempted: Array

    @classmethod
    def none(cls) -> Lives:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros(0, dtype=bool))

    def observed(self, h: float, n_markets: int) -> tuple[Array, Array]:
        """Per market ``(preemptions, exposure hours)`` known at hour ``h``: exactly
        ``spotopt.db.queries.observed_lifetimes`` at that time."""
        seen = self.start_h < h
        hours = np.where(seen, np.minimum(self.end_h, h) - self.start_h, 0.0)
        events = seen & self.preempted & (self.end_h <= h)
        out_events, out_hours = np.zeros(n_markets), np.zeros(n_markets)
        np.add.at(out_events, self.market, events)
        np.add.at(out_hours, self.market, hours)
        return out_events, out_hours


@dataclass(frozen=True)
class CloudRates:
    """The clouds' own preemption rates of a timeline's markets as a step function:
    ``rates[k]`` (per market) from hour ``since_h[k]`` of the window on (``since_h[0]`` is 0)."""

    since_h: Array
    rates: Array

    def at(self, h: float) -> Array:
        return np.asarray(self.rates[max(int(np.searchsorted(self.since_h, h, side="right")) - 1, 0)])


@dataclass
class Timeline:
    """Markets × ticks. ``markets[m]`` carries labels and the rate at the window start;
    ``cloud_rates`` are the clouds' own rates through the window, before the recorded ``lives``
    refine them (``spotopt.history.market``); ``capacity`` is the markets' observed spot capacity
    (``None``: not replayed, every priced market can launch)."""

    start: datetime
    tick_h: float
    price: Array
    markets: list[MarketState]
    rate: Array
    location: Array
    locations: list[tuple[str, str]]
    sources: set[str] = field(default_factory=set)
    last_observed: datetime | None = None
    cloud_rates: CloudRates | None = None
    lives: Lives = field(default_factory=Lives.none)
    capacity: Capacity | None = None
    observed_h: Array | None = None
    """Markets × ticks: hours from ``start`` of the newest price point at or before the tick
    (NaN: none yet), so a decider knows a price's age at its simulated clock; ``None`` (a
    hand-built timeline): every price is taken as fresh."""

    def launchable(self, t: int) -> Array:
        """Per market: it has a price at tick ``t`` and, where capacity is replayed, capacity."""
        ok = np.isfinite(self.price[:, t])
        return ok if self.capacity is None else ok & self.capacity.up[:, t]

    def rates_at(self, h: float, own: tuple[Array, Array] | None = None) -> Array:
        """Every market's rate as the daemon would estimate it ``h`` hours into the window: the
        clouds' rates observed by then, refined by the lives recorded by then and ``own`` (a
        run's own ``(preemptions, exposure hours)`` per market, which a daemon records as it
        goes). Without ``cloud_rates`` (a hand-built timeline) the start's ``rate`` holds."""
        base = self.rate if self.cloud_rates is None else self.cloud_rates.at(h)
        events, hours = self.lives.observed(h, self.n_markets)
        if own is not None:
            events, hours = events + own[0], hours + own[1]
        return np.where(self.on_demand, 0.0, refined_rate(base, events, hours))

    @property
    def n_ticks(self) -> int:
        return int(self.price.shape[1])

    @property
    def n_markets(self) -> int:
        return int(self.price.shape[0])

    @property
    def synthetic(self) -> bool:
        return SYNTHETIC_SOURCE in self.sources

    @property
    def on_demand(self) -> Array:
        return np.array([m.quote.market == "on-demand" for m in self.markets], dtype=bool)

    def time(self, tick: float) -> datetime:
        return self.start + timedelta(hours=tick * self.tick_h)

    def location_index(self, cloud: str, region: str) -> int:
        """Index of ``(cloud, region)``, added to ``locations`` if new (e.g. a dataset's home)."""
        key = (cloud, region)
        if key not in self.locations:
            self.locations.append(key)
        return self.locations.index(key)


def build_timeline(
    quotes: list[Quote],
    start: datetime,
    hours: float,
    tick_h: float,
    rates: dict[int, MarketState] | None = None,
) -> Timeline:
    """Step functions from price points (``quotes`` may include the point in effect at ``start``)."""
    if tick_h <= 0 or hours <= 0:
        raise InputError("what-if: the tick and the window must be positive")
    n_ticks = int(np.ceil(hours / tick_h - 1e-9))
    tick_s = np.arange(n_ticks) * tick_h * 3600.0
    per_market: dict[int, list[Quote]] = defaultdict(list)
    for q in quotes:
        per_market[q.market_id].append(q)
    ids = sorted(per_market, key=lambda i: _label(per_market[i][0]))
    price = np.full((len(ids), n_ticks), np.nan)
    observed_h = np.full((len(ids), n_ticks), np.nan)
    markets: list[MarketState] = []
    locations: list[tuple[str, str]] = []
    location = np.zeros(len(ids), dtype=np.int64)
    rate = np.zeros(len(ids))
    sources: set[str] = set()
    last: datetime | None = None
    for m, mid in enumerate(ids):
        rows = sorted(per_market[mid], key=lambda q: q.observed_at)
        sources.update(q.source for q in rows)
        last = max(last, rows[-1].observed_at) if last else rows[-1].observed_at
        times = np.array([(q.observed_at - start).total_seconds() for q in rows])
        values = np.array([q.usd_per_hour for q in rows])
        price[m] = step_prices(times, values, tick_s)
        observed_h[m] = step_prices(times, times / 3600.0, tick_s)
        state = (rates or {}).get(mid)
        if state is None:
            default = (
                0.0 if rows[0].market == "on-demand" else DEFAULT_RATE_PER_HOUR.get(rows[0].cloud, 1 / 24)
            )
            state = MarketState(rows[0], default, "on-demand" if default == 0 else "default", None)
        else:
            state = MarketState(
                rows[0], state.preemptions_per_hour, state.rate_source, state.rate_observed_at
            )
        markets.append(state)
        rate[m] = state.preemptions_per_hour
        key = (rows[0].cloud, rows[0].region)
        if key not in locations:
            locations.append(key)
        location[m] = locations.index(key)
    return Timeline(
        start, tick_h, price, markets, rate, location, locations, sources, last, observed_h=observed_h
    )


def cloud_rates(session: Session, tl: Timeline, end: datetime, flt: MarketFilter) -> CloudRates:
    """The clouds' rates of ``tl``'s markets from its start to ``end``: the snapshot's rule
    (``spotopt.history.market.cloud_state``) over the observations known at the start, then again after
    each later observation time, in the order the snapshot would see them."""
    found = latest_interruptions(session, tl.start, flt.clouds)

    def rates() -> Array:
        return np.array([cloud_state(m.quote, found).preemptions_per_hour for m in tl.markets], dtype=float)

    since, steps = [0.0], [rates()]
    changes = interruptions_between(session, tl.start, end, flt.clouds)
    for at, group in itertools.groupby(changes, key=lambda change: change[1][2]):
        for key, row in group:
            found[key] = row
        since.append((at - tl.start).total_seconds() / 3600.0)
        steps.append(rates())
    return CloudRates(np.array(since), np.array(steps))


def _label(q: Quote) -> tuple[str, str, str, str, str]:
    return (q.cloud, q.region, q.zone or "", q.instance_type, q.market)


def load_timeline(
    session: Session, start: datetime, hours: float, tick_h: float = 1.0, flt: MarketFilter | None = None
) -> Timeline:
    """The history between ``start`` and ``start + hours`` as a ``Timeline`` (GPU markets only).

    Preemption rates are those known at ``start`` (``spotopt.history.market.snapshot``): a replay must
    not use interruption data observed after the moment it pretends to be in.
    """
    flt = flt or MarketFilter()
    end = start + timedelta(hours=hours)
    quotes = price_history(session, flt, since=start, until=end)
    if not quotes:
        raise InputError(
            f"what-if: no prices in the history between {start:%Y-%m-%d %H:%M} and {end:%Y-%m-%d %H:%M} UTC; "
            "import or collect prices first (spotopt import …), or try `spotopt whatif --example`"
        )
    rates = {s.quote.market_id: s for s in snapshot(session, start, flt)}
    tl = build_timeline(quotes, start, hours, tick_h, rates)
    tl.cloud_rates = cloud_rates(session, tl, end, flt)
    ids = [m.quote.market_id for m in tl.markets]
    index = {market_id: m for m, market_id in enumerate(ids)}
    spot = [i for i, m in zip(ids, tl.markets, strict=True) if m.quote.market == "spot"]
    rows = lifetimes_started_before(session, end, spot)
    tl.lives = Lives(
        market=np.array([index[r[0]] for r in rows], dtype=np.int64),
        start_h=np.array([(r[1] - start).total_seconds() / 3600.0 for r in rows]),
        end_h=np.array([np.inf if r[2] is None else (r[2] - start).total_seconds() / 3600.0 for r in rows]),
        preempted=np.array([r[3] == "preempted" for r in rows], dtype=bool),
    )
    return tl


def load_capacity(session: Session, tl: Timeline) -> Capacity | None:
    """The spot capacity observed for ``tl``'s markets over its window (``None``: none observed)."""
    spot = {m.quote.market_id: k for k, m in enumerate(tl.markets) if m.quote.market == "spot"}
    rows = capacity_history(session, list(spot), tl.start, tl.time(tl.n_ticks))
    if not rows:
        return None
    return Capacity.from_observations(
        tl.n_markets,
        tl.n_ticks,
        tl.tick_h,
        np.array([spot[r.market_id] for r in rows], dtype=np.int64),
        np.array([(r.observed_at - tl.start).total_seconds() / 3600.0 for r in rows]),
        np.array([r.available for r in rows], dtype=bool),
    )
