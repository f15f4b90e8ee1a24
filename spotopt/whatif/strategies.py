"""The strategies: each a decider for the same engine (``spotopt.whatif.engine``).

The first six follow the seeds (thesis §6.3.2, Fig. 6.5/6.6), ranked by expected $/step
(price per job slot ÷ the job's steps/h on it) at the time of choosing:

- ``on-demand``: the cheapest on-demand instance with exactly the job's GPUs of its reference
  GPU (``work.gpu``), fixed.
- ``spot``: the cheapest spot instance of that kind in the job's *home cloud*, fixed at start
  (the seeds' baseline, "the cheapest 1×V100 instance"). Home cloud: the dataset's cloud, else
  the cloud of the cheapest such spot instance over the allowed clouds (at the first tick where
  one has a price).
- ``gpu-type``: the best $/step spot instance with exactly the job's GPUs, any GPU model, home
  cloud, fixed.
- ``multi-gpu``: also slots of multi-GPU instances at the per-slot price, home cloud, fixed.
- ``multi-cloud``: as ``multi-gpu`` over every allowed cloud and region, fixed.
- ``dynamic``: the ``multi-cloud`` choice remade every 24 h with free moves (the seeds' zero
  move overhead; restarts after preemptions still cost).
- ``dynamic-paid``: the same rule paying for its moves what every other strategy pays (restart,
  checkpoint, egress): what the thesis' rule would really cost.
- ``uniform-progress``, ``up-failover`` and ``greedy``: Can't Be Late's rules for deadlines on
  spot (Wu et al., NSDI '24), the published anchors: see ``DeadlineRuleDecider``.

A fixed choice is kept through preemptions (the job restarts on the same market) and remade by
the same rule only when its market has no price. When none of the strategy's markets has a price,
a job with a deadline waits; a job without one falls back to the cheapest priced option it may
run on (by the same $/step), held while priced and left as soon as a market of its strategy has
a price again. So no strategy idles a job without deadline while some option has a price, as
the oracle may not either, and the oracle stays a lower bound.

``spotopt`` is the policy + planner (``SpotoptDecider``); ``oracle`` is ``spotopt.whatif.oracle``.
Jobs without a deadline never idle in any strategy; none of the strategies here pauses on
purpose, only the oracle may (and only for jobs with a deadline).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spotopt.price import per_slot
from spotopt.whatif.engine import SimState
from spotopt.whatif.jobs import SimJobs, matches_ref
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]

FIXED = ("on-demand", "spot", "gpu-type", "multi-gpu", "multi-cloud")
PERIODIC = ("dynamic", "dynamic-paid")
DYNAMIC_PERIOD_H = 24.0


def best_per_job(score: Array, sim: SimJobs) -> Array:
    """Per job, the option with the lowest finite ``score`` (-1 if none); ties: lowest index."""
    return best_among(np.arange(sim.n_options), score, sim)


def best_among(idx: Array, score: Array, sim: SimJobs) -> Array:
    """``best_per_job`` over the options ``idx`` only (``score[k]`` belongs to ``idx[k]``)."""
    out = np.full(sim.n_jobs, -1, dtype=np.int64)
    ok = np.isfinite(score)
    if not ok.any():
        return out
    idx, score = idx[ok], score[ok]
    jobs = sim.job[idx]
    # Two unbuffered reductions instead of a sort: the deadline rules call this every tick over
    # every option (a lexsort of them made them 10 times slower than the other rules at scale).
    least = np.full(sim.n_jobs, np.inf)
    np.minimum.at(least, jobs, score)
    tied = score == least[jobs]
    first = np.full(sim.n_jobs, np.iinfo(np.int64).max)
    np.minimum.at(first, jobs[tied], idx[tied])
    return np.where(np.isfinite(least), first, out)


def usd_per_step(tl: Timeline, sim: SimJobs, t: int) -> Array:
    """Seeds' ranking: slot price ÷ undiscounted throughput at tick ``t`` (NaN: unavailable)."""
    return per_slot(tl.price[sim.market, t], sim.slots) / sim.steps_per_hour


def candidate_mask(name: str, tl: Timeline, sim: SimJobs, start_tick: int) -> Array:
    """Which options strategy ``name`` may choose from (see the module docstring)."""
    exact = sim.gpus == sim.gpus_min[sim.job]
    whole = exact & (sim.slots == 1)
    ref = matches_ref(sim)
    has_spot = np.zeros(sim.n_jobs, dtype=bool)
    has_spot[sim.job[~sim.on_demand]] = True
    spot_kind = np.where(has_spot[sim.job], ~sim.on_demand, sim.on_demand)
    if name == "on-demand":
        return sim.on_demand & ref & whole
    if name in ("multi-cloud", *PERIODIC):
        return spot_kind & exact
    home = home_cloud(tl, sim, start_tick, spot_kind & ref & whole)
    in_home = sim.cloud == home[sim.job]
    if name == "spot":
        return spot_kind & ref & whole & in_home
    if name == "gpu-type":
        return spot_kind & whole & in_home
    if name == "multi-gpu":
        return spot_kind & exact & in_home
    raise ValueError(f"no candidate rule for strategy {name!r}")


def home_cloud(tl: Timeline, sim: SimJobs, t: int, baseline: Array) -> Array:
    """Per job: its dataset's cloud, else the cloud of its cheapest baseline option at ``t`` (or,
    if none has a price then, at the first later tick where one has)."""
    best = best_per_job(np.where(baseline, usd_per_step(tl, sim, t), np.nan), sim)
    waiting = baseline & (best[sim.job] < 0)
    later = np.flatnonzero(np.isfinite(tl.price[sim.market[waiting], t:]).any(axis=0)) + t
    for tick in later.tolist():
        if (best >= 0).all():
            break
        found = best_per_job(np.where(baseline, usd_per_step(tl, sim, tick), np.nan), sim)
        best = np.where(best >= 0, best, found)
    home = np.empty(sim.n_jobs, dtype=object)
    for j in range(sim.n_jobs):
        home[j] = sim.dataset_cloud[j] or (sim.cloud[best[j]] if best[j] >= 0 else None)
    return home


class RuleDecider:
    """Choose by $/step among ``mask``; keep the choice, remake it every ``period_h`` (if set)
    or when its market has no price; fall back as the module docstring says."""

    def __init__(self, tl: Timeline, sim: SimJobs, mask: Array, period_h: float | None = None) -> None:
        self.tl, self.sim, self.mask = tl, sim, mask
        self.period = None if period_h is None else max(1, round(period_h / tl.tick_h))
        self.choice = np.full(sim.n_jobs, -1, dtype=np.int64)
        self.fallback = np.zeros(sim.n_jobs, dtype=bool)
        self.may_fall_back = ~np.isfinite(sim.deadline_h)
        self.start: int | None = None

    def __call__(self, t: int, state: SimState) -> Array:
        if self.start is None:
            self.start = t
        tl, sim = self.tl, self.sim
        have = self.choice >= 0
        lost = ~have | ~np.isfinite(tl.price[sim.market[np.maximum(self.choice, 0)], t])
        if self.period is not None and (t - self.start) % self.period == 0:
            lost[:] = True
        if lost.any() or self.fallback.any():
            score = usd_per_step(tl, sim, t)
            fresh = best_per_job(np.where(self.mask, score, np.nan), sim)
            lost |= self.fallback & (fresh >= 0)
            spare = lost & (fresh < 0) & self.may_fall_back
            if spare.any():
                fresh = np.where(spare, best_per_job(score, sim), fresh)
            self.choice = np.where(lost, fresh, self.choice)
            self.fallback = np.where(lost, spare & (fresh >= 0), self.fallback)
        return np.where(state.done, -1, self.choice)


def rule_decider(name: str, tl: Timeline, sim: SimJobs, start_tick: int) -> RuleDecider:
    mask = candidate_mask(name, tl, sim, start_tick)
    return RuleDecider(tl, sim, mask, DYNAMIC_PERIOD_H if name in PERIODIC else None)


class ScheduleDecider:
    """Follow a fixed plan ``plan[j, t - start]``; past its end, stay where the job is."""

    def __init__(self, plan: Array, start_tick: int) -> None:
        self.plan, self.start = plan, start_tick

    def __call__(self, t: int, state: SimState) -> Array:
        k = t - self.start
        want = self.plan[:, k] if k < self.plan.shape[1] else np.full(len(state.option), -2)
        keep = want == -2
        return np.where(state.done, -1, np.where(keep, state.option, want))


DEADLINE_RULES = ("uniform-progress", "up-failover", "greedy")


class DeadlineRuleDecider:
    """Can't Be Late's rules for jobs with a deadline (Wu et al., NSDI '24, and its simulator).

    With ``g`` the tick, ``d`` the job's restart, ``D`` its deadline, ``t`` the time since the
    start, ``C0`` the whole job and ``c`` the progress so far (both in hours on its on-demand
    option), ``ep(x) = C0·x/D`` the uniform line, and ``has_spot`` whether a spot instance can
    be had now (known while one runs; else learnt by launching, ``SimState.refused``):

    1. default: spot if ``has_spot``, else no instance (the job waits, even when ahead);
    2. ``uniform-progress`` and ``up-failover`` only: behind the line (``c < ep(t)``): spot if
       ``has_spot``, else on-demand; on on-demand, stay while there is no spot or
       ``c <= ep(t + 2d)`` (hysteresis);
    3. safety net: with the time left rounded down to whole ticks, ``RT = ⌊(D − t)/g⌋·g``: if
       ``⌈(C0 − c + 2d)/g⌉·g >= RT``, a job without an instance or on on-demand takes on-demand;
       if ``⌈(C0 − c + d)/g⌉·g >= RT``, a job on spot that has finished restarting rides it, any
       other takes on-demand.

    ``uniform-progress`` and ``greedy`` use one spot market, as in the paper: the job's spot
    option cheapest per step at its start among those as fast as its on-demand one (any spot
    option for a job with none), re-chosen only when it loses its price. ``up-failover`` is the
    same rules over every such spot option: a job that needs a spot instance tries them
    cheapest per step first and takes the first that launches (what a SkyPilot managed job does
    after a preemption). On-demand is the job's fastest on-demand option, cheapest of those. A
    job without a deadline takes spot like ``multi-cloud`` (the cheapest priced option when no
    spot one is).
    """

    def __init__(self, tl: Timeline, sim: SimJobs, rule: str) -> None:
        if rule not in DEADLINE_RULES:
            raise ValueError(f"no deadline rule {rule!r}")
        self.tl, self.sim, self.rule = tl, sim, rule
        self.od = sim.on_demand & (sim.gpus == sim.gpus_min[sim.job])
        od_speed = np.zeros(sim.n_jobs)
        np.maximum.at(od_speed, sim.job[self.od], sim.steps_per_hour[self.od])
        spot = candidate_mask("multi-cloud", tl, sim, 0) & ~sim.on_demand
        fast = spot & (sim.steps_per_hour >= od_speed[sim.job] * (1 - 1e-9))
        has_fast = np.zeros(sim.n_jobs, dtype=bool)
        has_fast[sim.job[fast]] = True
        self.spot_mask = np.where(has_fast[sim.job], fast, spot)
        self.market_of = np.full(sim.n_jobs, -1, dtype=np.int64)
        """The one spot option of ``uniform-progress`` and ``greedy`` per job (-1: not chosen yet)."""
        self.start: int | None = None

    def _fastest_od(self, t: int) -> Array:
        sim = self.sim
        idx = np.flatnonzero(self.od)
        per_step = usd_per_step(self.tl, sim, t)[idx]
        priced = np.isfinite(per_step)
        speed = np.where(priced, (sim.steps_per_hour * sim.checkpoint_eff)[idx], np.nan)
        top = np.full(sim.n_jobs, -np.inf)
        np.fmax.at(top, sim.job[idx], speed)
        fastest = priced & (speed >= top[sim.job[idx]])
        return best_among(idx, np.where(fastest, per_step, np.nan), sim)

    def _spot_now(self, t: int, st: SimState) -> Array:
        """Per job, the spot option to try now (-1: none left): its one market's, or for
        ``up-failover`` the cheapest per step of those that have not refused it in this tick."""
        sim = self.sim
        score = np.where(self.spot_mask, usd_per_step(self.tl, sim, t), np.nan)
        if self.rule != "up-failover":
            lost = (self.market_of < 0) | ~np.isfinite(score[np.maximum(self.market_of, 0)])
            if lost.any():
                self.market_of = np.where(lost, best_per_job(score, sim), self.market_of)
            keep = np.zeros(sim.n_options, dtype=bool)
            keep[self.market_of[self.market_of >= 0]] = True
            score = np.where(keep, score, np.nan)
        return best_per_job(np.where(st.refused[sim.market], np.nan, score), sim)

    def __call__(self, t: int, state: SimState) -> Array:
        if self.start is None:
            self.start = t
        tl, sim = self.tl, self.sim
        g = tl.tick_h
        elapsed = (t - self.start) * g
        od = self._fastest_od(t)
        cur = np.where(state.alive, state.option, -1)
        kind_od = sim.on_demand[np.maximum(cur, 0)]
        on_spot, on_od = (cur >= 0) & ~kind_od, (cur >= 0) & kind_od
        spot = np.where(on_spot, cur, self._spot_now(t, state))
        deadline = sim.deadline_h
        ruled = np.isfinite(deadline) & (od >= 0)
        at = np.maximum(od, 0)
        speed = sim.steps_per_hour[at] * sim.checkpoint_eff[at]
        whole, done, d = sim.work / speed, state.progress / speed, sim.restart_h
        with np.errstate(invalid="ignore", divide="ignore"):
            line_now = whole * elapsed / deadline
            line_ahead = whole * (elapsed + 2 * d) / deadline
        want = np.where(spot >= 0, _SPOT, _NONE)
        if self.rule != "greedy":
            want = np.where(done < line_now, np.where(spot >= 0, _SPOT, _OD), want)
            want = np.where(on_od & ((spot < 0) | (done <= line_ahead)), _OD, want)
        with np.errstate(invalid="ignore"):
            time_left = np.floor((deadline - elapsed) / g + 1e-9) * g
            net = np.ceil((whole - done + 2 * d) / g - 1e-9) * g >= time_left
            hard = np.ceil((whole - done + d) / g - 1e-9) * g >= time_left
        want = np.where(net & ~on_spot, _OD, want)
        want = np.where(hard, np.where(on_spot & (state.restart_left_h < 1e-3), _SPOT, _OD), want)
        out = np.select([want == _SPOT, want == _OD], [spot, np.where(on_od, cur, od)], -1)
        free = ~ruled & ~state.done
        if free.any():
            fallback = np.where(spot >= 0, spot, best_per_job(usd_per_step(tl, sim, t), sim))
            out = np.where(free, fallback, out)
        return np.where(state.done, -1, out)


_NONE, _SPOT, _OD = 0, 1, 2
