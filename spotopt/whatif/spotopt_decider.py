"""The ``spotopt`` strategy: the simulator's adapter to the decision core.

Each tick it turns the simulator's state into a ``FleetState`` and the tick's prices into
``Options`` (with the causal forecast of ``spotopt.decide.forecast``), calls
``spotopt.decide.core.decide`` — the function the daemon calls — and applies the returned moves
as the simulated provider. Options are keyed by their index in ``SimJobs``. Each carries its
figure's low end too (``Options.steps_per_hour_low``): the core plans deadlines with it, as for
``spotopt plan``, while the simulator runs the job at the figure's point.

Only each job's frontier (``spotopt.whatif.frontier``) plus its current option, its target and
the dropped options that the rates learnt since the start make faster than their dominator are
handed to the core. The frontier looks at the prices of its whole window, but it only drops
options that cannot be chosen; tests replay with and without it, and with the future hidden, and
get the same decisions. A price older than the guardrail ``max_price_age_h`` at the simulated
clock is stale: the core prefers a job's fresh prices (``spotopt.decide.core.fresh_first``), and
at a tick where some market's price is stale every option is handed over, since the frontier
may have dropped a fresh option for a stale one that dominated it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from spotopt.decide.core import Memory, decide
from spotopt.decide.fleet import Availability, FleetState, Options
from spotopt.decide.forecast import forecast
from spotopt.decide.guardrails import Guardrails
from spotopt.price import instances_per_slot, per_slot
from spotopt.whatif.engine import SimState
from spotopt.whatif.frontier import OptionFrontier
from spotopt.whatif.jobs import SimJobs, checkpoint_terms
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]


class SpotoptDecider:
    """Decide tick by tick through the core; ``narrow=False`` hands it every option (slower,
    same decisions: the frontier's tests compare both)."""

    def __init__(
        self,
        tl: Timeline,
        sim: SimJobs,
        transfer: Array,
        guard: Guardrails,
        policy: str | None = None,
        narrow: bool = True,
    ) -> None:
        self.tl, self.sim, self.transfer, self.guard = tl, sim, transfer, guard
        self.policy = policy
        self.memory = Memory()
        self.start: int | None = None
        self.steps_per_hour = sim.expected_steps_per_hour
        self.steps_per_hour_low = sim.expected_steps_per_hour_low
        self.baseline, self.revert_h = forecast(tl.price, tl.tick_h)
        # The frontier keeps one of two twins (two zones at one price): with capacity replayed the
        # other is where a job fails over to, so every option is handed over.
        narrow = narrow and tl.capacity is None
        self.frontier = (
            OptionFrontier(tl, sim, self.steps_per_hour, self.baseline, low=self.steps_per_hour_low)
            if narrow
            else None
        )
        self.capacity = np.full(tl.n_markets, np.inf)
        self.start_rates = np.asarray(tl.rate, dtype=float)
        self.price_age_h = (
            None if tl.observed_h is None else np.arange(tl.n_ticks) * tl.tick_h - tl.observed_h
        )
        """Markets × ticks: the age of the price in effect (NaN: none yet)."""
        # Dropped options whose dominance may have moved with the rates, per window and set of
        # markets whose rate moved (see ``_revived``).
        self._pairs_for: tuple[Array, bytes] | None = None
        self._pairs = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    @property
    def solves(self) -> int:
        return self.memory.solves

    @property
    def notes(self) -> list[str]:
        return self.memory.notes

    def fleet_state(self, t: int, st: SimState) -> FleetState:
        """The simulator's state as the core sees it at the tick after a preemption: the instance
        is *lost* (gone, its work kept as far as its emergency or last checkpoint), as the
        daemon sees it at its next planning round."""
        sim = self.sim
        elapsed = (t - (self.start if self.start is not None else t)) * self.tl.tick_h
        return FleetState(
            names=tuple(sim.names),
            locations=tuple(self.tl.locations),
            option=np.where(st.started, st.option, -1),
            location=st.location.copy(),
            remaining_steps=np.where(st.done, 0.0, sim.work - st.progress),
            dwell_h=st.dwell_h.copy(),
            since_checkpoint_h=np.zeros(sim.n_jobs),
            deadline_h=sim.deadline_h - elapsed,
            notice=np.zeros(sim.n_jobs, dtype=bool),
            lost=st.started & ~st.alive & ~st.done,
            spent_usd=st.cost_usd.copy(),
            restart_h=sim.restart_h,
            save_h=sim.save_h,
            checkpoint_gb=sim.checkpoint_gb,
            dataset_gb=sim.dataset_gb,
            dataset_location=sim.dataset_location,
            clock_h=t * self.tl.tick_h,
        )

    def availability(self, t: int, st: SimState) -> Availability | None:
        """Capacity as the strategy knows it at tick ``t``: what a collector recorded before now
        (``Capacity.seen``), corrected by this run's own launches (refused just now: out; an
        instance running: available)."""
        cap = self.tl.capacity
        if cap is None:
            return None
        running = np.zeros(self.tl.n_markets, dtype=bool)
        running[self.sim.market[st.option[st.alive & (st.option >= 0)]]] = True
        return Availability.known(
            cap.observed, cap.seen[:, : t + 1], self.tl.tick_h, st.refused.copy(), running
        )

    def speeds(self, sub: Array, rates: Array, *, low: bool = False) -> Array:
        """Expected steps/h of options ``sub`` at the markets' preemption ``rates`` (``low``: at
        the low end of each figure's interval, what deadlines are planned with): only the
        options of markets whose rate moved since the start need theirs again."""
        sim = self.sim
        market = sim.market[sub]
        speed = (self.steps_per_hour_low if low else self.steps_per_hour)[sub].copy()
        moved = np.flatnonzero(rates[market] != self.start_rates[market])
        if len(moved):
            e = sub[moved]
            _, eff = checkpoint_terms(
                sim.save_h * 3600.0, sim.restart_h * 3600.0, sim.job[e], rates, sim.market[e], self.tl.tick_h
            )
            speed[moved] = (sim.steps_per_hour_low if low else sim.steps_per_hour)[e] * eff
        return speed

    def options(self, t: int, sub: Array, rates: Array | None = None) -> Options:
        """Options ``sub`` (sorted ``SimJobs`` indices) priced at tick ``t``, with the markets'
        preemption ``rates`` then (default: those known at the window's start)."""
        sim, tl = self.sim, self.tl
        market = sim.market[sub]
        slots = sim.slots[sub]
        rates = self.start_rates if rates is None else rates
        return Options(
            key=sub,
            job=sim.job[sub],
            market=market,
            location=sim.location[sub],
            steps_per_hour=self.speeds(sub, rates),
            steps_per_hour_low=self.speeds(sub, rates, low=True),
            usd_per_hour=per_slot(tl.price[market, t], slots),
            instances_per_hour=instances_per_slot(slots),
            on_demand=sim.on_demand[sub],
            baseline_usd_per_hour=per_slot(self.baseline[market, t], slots),
            revert_h=self.revert_h[market, t],
            preemptions_per_hour=rates[market],
            transfer=self.transfer,
            capacity=self.capacity,
            price_age_h=None if self.price_age_h is None else self.price_age_h[market, t],
        )

    def _candidates(self, t: int, st: SimState, rates: Array) -> Array:
        """Sorted indices of the options handed to the core in tick ``t``: the frontier, each
        job's current option and target, and the dropped options that the rates learnt since
        the start made faster than their dominator (``_revived``)."""
        if self.frontier is None or self._any_stale(t):
            return np.arange(self.sim.n_options)
        targets = np.fromiter(self.memory.target.values(), dtype=np.int64, count=len(self.memory.target))
        extra = np.concatenate([st.option[st.started], targets, self._revived(t, rates)])
        return np.union1d(self.frontier.candidates(t), extra)

    def _any_stale(self, t: int) -> bool:
        """Some market's price in effect at tick ``t`` is older than the guardrail allows."""
        return self.price_age_h is not None and bool(
            np.any(self.price_age_h[:, t] > self.guard.max_price_age_h)
        )

    def _revived(self, t: int, rates: Array) -> Array:
        """Dropped options no longer dominated by the option the frontier dropped them for: it
        is slower than them at ``rates`` (expected or at the low end). Only pairs with a market
        whose rate moved can be; they are found again only when the window or the set of such
        markets changes."""
        assert self.frontier is not None
        dropped, dominator = self.frontier.dominators(t)
        moved = rates != self.start_rates
        key = (dropped, moved.tobytes())
        if self._pairs_for is None or self._pairs_for[0] is not dropped or self._pairs_for[1] != key[1]:
            market = self.sim.market
            hit = moved[market[dropped]] | moved[market[dominator]]
            self._pairs_for, self._pairs = key, (dropped[hit], dominator[hit])
        e, d = self._pairs
        slower = self.speeds(d, rates) < self.speeds(e, rates)
        return e[slower | (self.speeds(d, rates, low=True) < self.speeds(e, rates, low=True))]

    def __call__(self, t: int, st: SimState) -> Array:
        if self.start is None:
            self.start = t
        # The rates a daemon would estimate now: the lives recorded by then and this run's own.
        rates = self.tl.rates_at(t * self.tl.tick_h, (st.own_preemptions, st.own_hours))
        opts = self.options(t, self._candidates(t, st, rates), rates)
        if self.tl.capacity is not None:
            opts = dataclasses.replace(opts, availability=self.availability(t, st))
        current = np.where(st.alive, st.option, -1)
        for mv in decide(self.fleet_state(t, st), opts, self.guard, self.memory, self.policy):
            current[mv.job] = mv.to
        return np.where(st.done, -1, current)
