"""The simulator: a simulated clock over a ``Timeline``, a simulated provider, one tick at a time.

Every strategy is a *decider* (which option each job should be on during tick ``t``) run by the
same ``simulate`` loop, and the oracle's DP uses the same tick rule (``tick_outcome``), so all
strategies pay the same overheads for the same events:

- A job entering an option (first start, a move, or a restart after a preemption) spends
  ``restart_h`` of the tick provisioning and loading its checkpoint: paid, no progress. Entering
  another region or cloud pays egress for the checkpoint and, where the region has no copy, the
  dataset (``spotopt.decide.egress.entry_usd``, the rule the decisions price moves with).
  ``free_moves`` (the seeds' ``dynamic``) waives both for a move between two running instances.
- While running, a job advances at ``steps_per_hour × checkpoint_eff`` (writing a checkpoint
  every ``tau_h`` costs its write time) and bills the slot's price per second.
- A preemption at position ``u`` of the tick is the cloud's *notice* (``spotopt.whatif.preemptions``):
  training stops there and the agent writes an emergency checkpoint, ``save_h``. If the write
  fits in the cloud's notice (``notice_h``: AWS 2 min, GCP and Azure 30 s) the job keeps all its
  work and the instance bills until the write is done (the agent then ends it); otherwise the
  cloud reclaims the instance ``notice_h`` after the notice, the job keeps the work up to its
  last periodic checkpoint (every ``tau_h`` from the end of the restart) and the instance bills
  until the reclaim. The job is placed again at the next tick, as the daemon does at its next
  planning round. (An instance still restarting has nothing to save: it ends at the notice.)
- A restart longer than what is left of the tick carries over: the job goes on restarting in
  the next ticks (paid, no progress) as long as it stays on the option.
- Where the timeline replays capacity (``Timeline.capacity``), a launch on a market without
  capacity at the tick's start is *refused*: it costs ``LAUNCH_ATTEMPT_H`` of the tick and no
  money, the market is marked in ``SimState.refused`` and the strategy is asked again within the
  tick (it may try another market, up to ``MAX_ATTEMPTS`` launches a tick); the job then enters
  its option that much later in the tick; a running job whose move is refused every time stays
  on its option, as a make-before-break move that is refused leaves the job where it runs. A
  running instance is reclaimed when its market
  turns unavailable (``spotopt.whatif.preemptions`` puts the notice before that time).
- A job that finishes mid-tick bills only the time it used.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spotopt.decide.egress import entry_usd
from spotopt.price import per_slot
from spotopt.whatif.jobs import SimJobs
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]

LAUNCH_ATTEMPT_H = 1.0 / 60.0
"""Wall time a refused launch costs (the API call and the capacity error: about a minute)."""
MAX_ATTEMPTS = 8
"""Launch attempts per job and tick; past them the job waits for the next tick."""


@dataclass
class SimState:
    """What a decider may look at before tick ``t`` (per job, length ``J``)."""

    option: Array
    alive: Array
    started: Array
    location: Array
    progress: Array
    dwell_h: Array
    cost_usd: Array
    done: Array
    preempted_last: Array
    own_preemptions: Array
    """Per market (length ``M``): preemptions of this run's own spot instances so far."""
    own_hours: Array
    """Per market: hours this run's own spot instances have run so far. With
    ``own_preemptions`` it is what a daemon records in ``instance_lifetimes`` and its rate
    estimate reads (``Timeline.rates_at``)."""
    restart_left_h: Array
    """Per job: restart hours still to pay on its option before it makes progress (a restart
    longer than a tick carries over)."""
    refused: Array
    """Per market: a launch there was refused for capacity in this tick (the strategy is asked
    again within the tick; reset at each tick)."""
    refused_at: Array
    """Per market: the last tick a launch there was refused (-1: never); with ``refused`` what
    this run learnt of capacity by launching."""

    @classmethod
    def initial(cls, n_jobs: int, n_markets: int) -> SimState:
        return cls(
            option=np.full(n_jobs, -1, dtype=np.int64),
            alive=np.zeros(n_jobs, dtype=bool),
            started=np.zeros(n_jobs, dtype=bool),
            location=np.full(n_jobs, -1, dtype=np.int64),
            progress=np.zeros(n_jobs),
            dwell_h=np.zeros(n_jobs),
            cost_usd=np.zeros(n_jobs),
            done=np.zeros(n_jobs, dtype=bool),
            preempted_last=np.zeros(n_jobs, dtype=bool),
            own_preemptions=np.zeros(n_markets),
            own_hours=np.zeros(n_markets),
            restart_left_h=np.zeros(n_jobs),
            refused=np.zeros(n_markets, dtype=bool),
            refused_at=np.full(n_markets, -1, dtype=np.int64),
        )


Decider = Callable[[int, SimState], Array]
"""``decide(t, state) -> option per job for tick t`` (-1: no instance this tick)."""


@dataclass
class RunResult:
    """One strategy over one start. ``trace[j, k]`` is job ``j``'s option in tick ``start + k``."""

    cost_usd: Array
    egress_usd: Array
    finish_h: Array
    moves: Array
    preemptions: Array
    trace: Array
    start_tick: int
    on_demand_h: Array
    """Per job: instance-hours billed on on-demand (a slot's share of them)."""
    spot_h: Array
    """Per job: instance-hours billed on spot."""
    refusals: Array
    """Per job: launches refused for capacity."""
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class TickTerms:
    """The tick rule's ingredients for some (job, option) pairs, before knowing the remaining work.

    Hours count from the tick's start; the pair's instance exists from ``start_h`` (launch
    attempts before it are unpaid) and pays ``restart_h`` of it without progress.
    """

    price: Array
    start_h: Array
    restart_h: Array
    run_h: Array
    """Billed hours if the job does not finish in the tick."""
    prod_h: Array
    rate: Array
    tau_h: Array
    preempted: Array
    written: Array
    """Preempted, and the emergency checkpoint fits in the notice: all work is kept."""
    carry_h: Array
    """Restart hours left at the tick's end (the job goes on restarting in the next tick)."""

    @property
    def capacity(self) -> Array:
        """The most work these pairs can finish within the tick."""
        return self.rate * self.prod_h

    @property
    def saved(self) -> Array:
        """Work kept if the tick ends without finishing (preempted without a written emergency
        checkpoint: up to the last periodic one)."""
        lost = self.preempted & ~self.written
        kept_h = np.where(lost, np.floor(self.prod_h / self.tau_h + 1e-9) * self.tau_h, self.prod_h)
        return self.rate * kept_h


@dataclass(frozen=True)
class TickOutcome:
    cost_usd: Array
    gained: Array
    used_h: Array
    """Billed hours (from ``start_h``)."""
    finished: Array
    preempted: Array


def tick_terms(
    tl: Timeline,
    sim: SimJobs,
    events: Array,
    t: int,
    jobs: Array,
    opts: Array,
    restart_h: Array,
    start_h: Array | None = None,
) -> TickTerms:
    """Price, restart, run and productive hours of ``opts`` in tick ``t`` (see the module
    docstring). ``restart_h``: what each pair still has to restart (``sim.restart_h`` when it
    enters its option, a carried-over rest, or 0); ``start_h``: when its instance starts in the
    tick (after refused launches; default 0)."""
    m = sim.market[opts]
    u = events[m, t]
    start = np.zeros(len(opts)) if start_h is None else start_h
    notice_at = np.where(np.isfinite(u), np.nan_to_num(u) * tl.tick_h, tl.tick_h)
    # A notice before the instance starts ends it as it starts (nothing runs, nothing is paid).
    pre = np.isfinite(u)
    live_h = np.maximum(notice_at - start, 0.0)
    prod_h = np.maximum(live_h - restart_h, 0.0)
    save_h, notice_h = sim.save_h[jobs], sim.notice_h[opts]
    written = pre & (save_h <= notice_h)
    # After the notice the instance bills while it saves (or until the cloud reclaims it); an
    # instance with nothing to save yet ends at the notice.
    tail_h = np.where(prod_h > 0, np.where(written, save_h, notice_h), 0.0)
    return TickTerms(
        price=per_slot(tl.price[m, t], sim.slots[opts]),
        start_h=start,
        restart_h=restart_h,
        run_h=np.where(pre, np.where(live_h > 0, live_h + tail_h, 0.0), tl.tick_h - start),
        prod_h=prod_h,
        rate=sim.steps_per_hour[opts] * sim.checkpoint_eff[opts],
        tau_h=sim.tau_h[opts],
        preempted=pre,
        written=written,
        carry_h=np.where(pre, 0.0, np.maximum(restart_h - (tl.tick_h - start), 0.0)),
    )


def tick_outcome(terms: TickTerms, remaining: Array) -> TickOutcome:
    """What running for the tick costs and yields given the work still to do (egress excluded)."""
    done = terms.capacity >= remaining - 1e-9 * np.maximum(remaining, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        finish_in = terms.restart_h + remaining / terms.rate
    used_h = np.where(done, np.minimum(finish_in, terms.run_h), terms.run_h)
    gained = np.where(done, remaining, terms.saved)
    return TickOutcome(terms.price * used_h, gained, used_h, done, terms.preempted & ~done)


def simulate(
    tl: Timeline,
    sim: SimJobs,
    events: Array,
    transfer: Array,
    decide: Decider,
    start_tick: int = 0,
    free_moves: bool = False,
) -> RunResult:
    """Run ``decide`` from ``start_tick`` until every job finishes or the timeline ends."""
    n = sim.n_jobs
    st = SimState.initial(n, tl.n_markets)
    egress = np.zeros(n)
    finish = np.full(n, np.nan)
    moves = np.zeros(n, dtype=np.int64)
    preempts = np.zeros(n, dtype=np.int64)
    od_h, spot_h = np.zeros(n), np.zeros(n)
    refusals = np.zeros(n, dtype=np.int64)
    trace = np.full((n, max(tl.n_ticks - start_tick, 0)), -1, dtype=np.int64)
    for t in range(start_tick, tl.n_ticks):
        if st.done.all():
            break
        st.refused[:] = False
        target, start_h = _launch(tl, sim, st, decide, t, refusals)
        run = (target >= 0) & ~st.done
        jobs = np.flatnonzero(run)
        opts = target[jobs]
        switching = st.started[jobs] & (opts != st.option[jobs])
        entering = ~st.alive[jobs] | switching
        free = switching & st.alive[jobs] if free_moves else None
        restart = np.where(entering, sim.restart_h[jobs], st.restart_left_h[jobs])
        if free is not None:
            restart = np.where(free, 0.0, restart)
        # Launch attempts delay only a job entering an instance; one staying keeps running.
        terms = tick_terms(tl, sim, events, t, jobs, opts, restart, np.where(entering, start_h[jobs], 0.0))
        out = tick_outcome(terms, sim.work[jobs] - st.progress[jobs])
        egress_usd = entry_usd(
            transfer,
            st.location[jobs],
            sim.location[opts],
            sim.checkpoint_gb[jobs],
            sim.dataset_gb[jobs],
            sim.dataset_location[jobs],
        )
        paid_egress = np.where(entering, egress_usd, 0.0)
        if free is not None:
            paid_egress = np.where(free, 0.0, paid_egress)
        st.cost_usd[jobs] += out.cost_usd + paid_egress
        egress[jobs] += paid_egress
        st.progress[jobs] += out.gained
        moves[jobs] += switching
        preempts[jobs] += out.preempted
        spot = ~sim.on_demand[opts]
        billed = out.used_h / sim.slots[opts]
        od_h[jobs] += np.where(spot, 0.0, billed)
        spot_h[jobs] += np.where(spot, billed, 0.0)
        np.add.at(st.own_hours, sim.market[opts][spot], out.used_h[spot])
        np.add.at(st.own_preemptions, sim.market[opts][spot], out.preempted[spot])
        finished = jobs[out.finished]
        finish[finished] = (t - start_tick) * tl.tick_h + (terms.start_h + out.used_h)[out.finished]
        st.done[finished] = True
        st.dwell_h[jobs] = np.where(entering, tl.tick_h, st.dwell_h[jobs] + tl.tick_h)
        st.alive[:] = False
        st.alive[jobs] = ~out.preempted & ~out.finished
        st.restart_left_h[:] = 0.0
        st.restart_left_h[jobs] = np.where(st.alive[jobs], terms.carry_h, 0.0)
        st.preempted_last[:] = False
        st.preempted_last[jobs] = out.preempted
        st.option[jobs] = opts
        st.location[jobs] = sim.location[opts]
        st.started[jobs] = True
        trace[jobs, t - start_tick] = opts
    return RunResult(st.cost_usd, egress, finish, moves, preempts, trace, start_tick, od_h, spot_h, refusals)


def _launch(
    tl: Timeline, sim: SimJobs, st: SimState, decide: Decider, t: int, refusals: Array
) -> tuple[Array, Array]:
    """The strategy's options for tick ``t`` and when in the tick each job's instance starts.

    A job entering a priced market without capacity (where capacity is replayed) is refused:
    the market is marked in ``st.refused``, the attempt costs ``LAUNCH_ATTEMPT_H`` and the
    strategy is asked again. A job whose option has no price does not run this tick.
    """
    priced = np.isfinite(tl.price[:, t])
    up = np.ones(tl.n_markets, dtype=bool) if tl.capacity is None else tl.capacity.up[:, t]
    target = np.asarray(decide(t, st), dtype=np.int64)
    start_h = np.zeros(sim.n_jobs)

    def refused_now() -> Array:
        m = sim.market[np.maximum(target, 0)]
        entering = (target >= 0) & ~st.done & (~st.alive | (target != st.option))
        return np.asarray(entering & priced[m] & ~up[m])

    for _ in range(MAX_ATTEMPTS):
        bad = refused_now()
        if not bad.any():
            break
        markets = sim.market[target[bad]]
        st.refused[markets] = True
        st.refused_at[markets] = t
        refusals[bad] += 1
        start_h[bad] += LAUNCH_ATTEMPT_H
        target = np.where(bad, np.asarray(decide(t, st), dtype=np.int64), target)
    # A running job whose move was refused stays where it runs (make-before-break: the daemon
    # launches the new placement before it stops the old one, and a refusal aborts the move).
    stays = refused_now() & st.alive & ~st.done
    target = np.where(stays, st.option, target)
    start_h = np.where(stays, 0.0, start_h)
    m = sim.market[np.maximum(target, 0)]
    stop = refused_now() | ((target >= 0) & ~priced[m])
    return np.where(stop, -1, target), start_h
