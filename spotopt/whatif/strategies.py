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
- ``uniform-progress``: Can't-Be-Late's Uniform Progress policy (Wu et al., NSDI '24), the
  published anchor for deadlines on spot: see ``UniformProgressDecider``.

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
    order = np.lexsort((idx, score, jobs))
    first = np.ones(len(order), dtype=bool)
    first[1:] = jobs[order][1:] != jobs[order][:-1]
    out[jobs[order][first]] = idx[order][first]
    return out


def usd_per_step(tl: Timeline, sim: SimJobs, t: int) -> Array:
    """Seeds' ranking: slot price ÷ undiscounted throughput at tick ``t`` (NaN: unavailable)."""
    return tl.price[sim.market, t] / sim.slots / sim.steps_per_hour


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


class UniformProgressDecider:
    """Can't-Be-Late's Uniform Progress (Wu et al., NSDI '24) for jobs with a deadline.

    With ``d`` the restart overhead, ``ep(t)`` the uniform line from no progress at the start to
    the whole job at the deadline and ``cp(t)`` the progress so far:

    - running on spot: stay until preempted;
    - running on on-demand: stay until ``cp(t) >= ep(t + 2d)``, then behave as idle;
    - idle and behind the line (``cp(t) < ep(t)``): go on-demand and catch up;
    - idle otherwise: take the spot option cheapest per step now, if any has a price;
    - safety net: idle with the time left under the on-demand time for the work left plus
      ``2d``: on-demand to the end.

    On-demand is the job's fastest on-demand option (ties: the cheapest). Spot is, as in the
    paper, the same speed: the spot options at least as fast as that on-demand one (any spot
    option for a job with none). A job without a deadline takes spot like ``multi-cloud`` (any
    priced option when no spot one is).
    """

    def __init__(self, tl: Timeline, sim: SimJobs) -> None:
        self.tl, self.sim = tl, sim
        self.od = sim.on_demand & (sim.gpus == sim.gpus_min[sim.job])
        od_speed = np.zeros(sim.n_jobs)
        np.maximum.at(od_speed, sim.job[self.od], sim.steps_per_hour[self.od])
        spot = candidate_mask("multi-cloud", tl, sim, 0) & ~sim.on_demand
        fast = spot & (sim.steps_per_hour >= od_speed[sim.job] * (1 - 1e-9))
        has_fast = np.zeros(sim.n_jobs, dtype=bool)
        has_fast[sim.job[fast]] = True
        self.spot_idx = np.flatnonzero(np.where(has_fast[sim.job], fast, spot))
        self.od_idx = np.flatnonzero(self.od)
        self.to_end = np.zeros(sim.n_jobs, dtype=bool)
        self.start: int | None = None

    def _per_step(self, idx: Array, t: int) -> Array:
        sim = self.sim
        return np.asarray(self.tl.price[sim.market[idx], t] / sim.slots[idx] / sim.steps_per_hour[idx])

    def _fastest_od(self, t: int) -> Array:
        sim, idx = self.sim, self.od_idx
        per_step = self._per_step(idx, t)
        priced = np.isfinite(per_step)
        speed = np.where(priced, (sim.steps_per_hour * sim.checkpoint_eff)[idx], np.nan)
        top = np.full(sim.n_jobs, -np.inf)
        np.fmax.at(top, sim.job[idx], speed)
        fastest = priced & (speed >= top[sim.job[idx]])
        return best_among(idx, np.where(fastest, per_step, np.nan), sim)

    def __call__(self, t: int, state: SimState) -> Array:
        if self.start is None:
            self.start = t
        tl, sim = self.tl, self.sim
        elapsed = (t - self.start) * tl.tick_h
        deadline = sim.deadline_h
        od = self._fastest_od(t)
        od_speed = np.where(od >= 0, (sim.steps_per_hour * sim.checkpoint_eff)[np.maximum(od, 0)], np.nan)
        d = sim.restart_h

        def line(at_h: float | Array) -> Array:
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.asarray(sim.work * np.clip(at_h / deadline, 0.0, 1.0))

        with np.errstate(invalid="ignore", divide="ignore"):
            left_h = (sim.work - state.progress) / od_speed
        spot_now = best_among(self.spot_idx, self._per_step(self.spot_idx, t), sim)
        cur = state.option
        alive = state.alive
        on_od = alive & (cur >= 0) & sim.on_demand[np.maximum(cur, 0)]
        has_deadline = np.isfinite(deadline)
        self.to_end |= has_deadline & ~alive & (deadline - elapsed < left_h + 2 * d)
        leave_od = on_od & ~self.to_end & (state.progress >= line(elapsed + 2 * d))
        idle = ~alive | leave_od
        behind = has_deadline & (state.progress < line(elapsed))
        out = np.where(alive, cur, -1)
        go_od = idle & has_deadline & (self.to_end | behind | (spot_now < 0))
        out = np.where(go_od & (od >= 0), od, out)
        take_spot = idle & ~go_od & (spot_now >= 0)
        out = np.where(take_spot, spot_now, out)
        out = np.where(self.to_end & (od >= 0) & ~on_od, od, out)
        no_deadline_fallback = ~has_deadline & (out < 0)
        if no_deadline_fallback.any():
            out = np.where(no_deadline_fallback, best_per_job(usd_per_step(tl, sim, t), sim), out)
        return np.where(state.done, -1, out)
