"""The ``spotopt`` strategy: the registered policy proposes, the planner decides, every tick.

Each tick the decider builds the policy's ``PolicyInput`` from the snapshot (available options of
unfinished jobs, expected throughput discounted for preemption loss, remaining steps, remaining
time to each deadline). A move's cost is folded into the option's hourly price amortised over
the job's remaining work, as ``spotopt.plan`` does for dataset egress, so the policy already
prefers staying put. The policy's target per job is its option with the largest time share; the
planner (``spotopt.mover.planner``) then decides which moves pay for themselves, applies the
guardrails and deadline safety.

Allocations are cached: the policy is re-solved only when the set of unfinished jobs or of
placed jobs changed, when some job's best expected $/step moved by more than half the price
improvement the planner demands (a smaller change cannot trigger a move), when a target market
lost its price, or, for jobs with deadlines, every ``resolve_deadline_h``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spotopt.errors import InfeasibleError
from spotopt.mover.guardrails import Guardrails
from spotopt.mover.planner import PlannerJobs, PlannerOptions, move_costs, plan_moves
from spotopt.plan import prune_dominated, select_options, solve
from spotopt.policies.base import PolicyInput
from spotopt.whatif.engine import SimState
from spotopt.whatif.frontier import OptionFrontier
from spotopt.whatif.jobs import SimJobs
from spotopt.whatif.timeline import Timeline

Array = np.ndarray[Any, Any]


class SpotoptDecider:
    """Decide tick by tick on each job's frontier (``spotopt.whatif.frontier``) plus the options
    the planner must compare (where the job runs and its target). ``narrow=False`` looks at
    every option: slower, same decisions (the frontier's tests compare both)."""

    def __init__(
        self,
        tl: Timeline,
        sim: SimJobs,
        transfer: Array,
        guard: Guardrails,
        policy: str | None = None,
        resolve_deadline_h: float = 6.0,
        narrow: bool = True,
    ) -> None:
        self.tl, self.sim, self.transfer, self.guard = tl, sim, transfer, guard
        self.policy = policy
        self.resolve_every = max(1, round(resolve_deadline_h / tl.tick_h))
        self.start: int | None = None
        self.target = np.full(sim.n_jobs, -1, dtype=np.int64)
        self._key: tuple[Any, ...] | None = None
        self._best: Array | None = None
        self.solves = 0
        self.notes: list[str] = []
        self.steps_per_hour = sim.expected_steps_per_hour
        self.frontier = OptionFrontier(tl, sim, self.steps_per_hour) if narrow else None

    def _jobs(self, t: int, st: SimState, sub: Array) -> PlannerJobs:
        sim = self.sim
        elapsed = (t - (self.start or 0)) * self.tl.tick_h
        return PlannerJobs(
            option=_positions(sub, np.where(st.started, st.option, -1)),
            location=st.location,
            remaining_steps=np.where(st.done, 0.0, sim.work - st.progress),
            dwell_h=st.dwell_h,
            since_checkpoint_h=np.zeros(sim.n_jobs),
            deadline_h=sim.deadline_h - elapsed,
            notice=st.started & ~st.alive & ~st.done,
            spent_usd=st.cost_usd,
            restart_h=sim.restart_h,
            save_h=sim.save_h,
            checkpoint_gb=sim.checkpoint_gb,
            dataset_gb=sim.dataset_gb,
            dataset_location=sim.dataset_location,
        )

    def _options(self, t: int, st: SimState) -> Array:
        """Sorted indices of the options looked at in tick ``t``."""
        if self.frontier is None:
            return np.arange(self.sim.n_options)
        base = self.frontier.candidates(t)
        extra = np.concatenate([st.option[st.started], self.target[self.target >= 0]])
        if len(base) == 0:
            return np.unique(extra)
        pos = np.minimum(np.searchsorted(base, extra), len(base) - 1)
        missing = np.unique(extra[base[pos] != extra])
        return np.insert(base, np.searchsorted(base, missing), missing) if len(missing) else base

    def __call__(self, t: int, st: SimState) -> Array:
        if self.start is None:
            self.start = t
        sim, tl = self.sim, self.tl
        sub = self._options(t, st)
        jobs = self._jobs(t, st, sub)
        opts = PlannerOptions(
            job=sim.job[sub],
            location=sim.location[sub],
            steps_per_hour=self.steps_per_hour[sub],
            usd_per_hour=tl.price[sim.market[sub], t] / sim.slots[sub],
            on_demand=sim.on_demand[sub],
        )
        self._refresh_targets(t, st, jobs, opts, sub)
        current = np.where(st.alive, st.option, -1)
        for mv in plan_moves(jobs, opts, _positions(sub, self.target), self.transfer, self.guard):
            current[mv.job] = sub[mv.to]
        return np.where(st.done, -1, current)

    def _refresh_targets(
        self, t: int, st: SimState, jobs: PlannerJobs, opts: PlannerOptions, sub: Array
    ) -> None:
        active = jobs.remaining_steps > 0
        avail = np.isfinite(opts.usd_per_hour) & active[opts.job]
        per_step = np.where(avail, opts.usd_per_hour / opts.steps_per_hour, np.inf)
        best = np.full(self.sim.n_jobs, np.inf)
        np.minimum.at(best, opts.job, per_step)
        deadline_tick = (
            bool(np.isfinite(self.sim.deadline_h[active]).any())
            and (t - (self.start or 0)) % self.resolve_every == 0
        )
        key = (active.tobytes(), st.alive.tobytes())
        with np.errstate(invalid="ignore"):
            moved = (
                np.abs(best - self._best) > self._best * (self.guard.price_improvement - 1.0) / 2.0
                if self._best is not None
                else None
            )
        target = _positions(sub, self.target)
        stale = (
            self._key != key
            or self._best is None
            or deadline_tick
            or bool(np.any(moved))
            or bool(np.any((target >= 0) & active & ~avail[np.maximum(target, 0)]))
        )
        if not stale:
            return
        self._key, self._best = key, best
        self.target = self._solve(jobs, opts, avail, sub)

    def _solve(self, jobs: PlannerJobs, opts: PlannerOptions, avail: Array, sub: Array) -> Array:
        sim = self.sim
        target = np.full(sim.n_jobs, -1, dtype=np.int64)
        idx = np.flatnonzero(avail & (opts.steps_per_hour > 0))
        if len(idx) == 0:
            return target
        with np.errstate(invalid="ignore"):
            move = move_costs(jobs, opts, self.transfer)[idx]
        job_of = opts.job[idx]
        here = jobs.option[job_of] == idx
        move = np.where(here & ~jobs.notice[job_of], 0.0, move)
        remaining = jobs.remaining_steps[job_of]
        tput = opts.steps_per_hour[idx]
        usd = opts.usd_per_hour[idx] + move * tput / remaining
        live = np.unique(job_of)
        remap = np.full(sim.n_jobs, -1, dtype=np.int64)
        remap[live] = np.arange(len(live))
        deadline = np.maximum(jobs.deadline_h[live], 1e-6)
        inp = PolicyInput(
            job=remap[job_of],
            market=sim.market[sub[idx]],
            steps_per_hour=tput,
            usd_per_hour=usd,
            instances_per_hour=1.0 / sim.slots[sub[idx]],
            work_steps=jobs.remaining_steps[live],
            deadline_hours=deadline,
            capacity=np.full(self.tl.n_markets, np.inf),
            horizon_hours=1e7,
            job_names=tuple(sim.names[j] for j in live),
        )
        keep = prune_dominated(inp)
        inp = select_options(inp, keep)
        chosen = sub[idx[keep]]
        name = self.policy or ("min-cost-slo" if np.isfinite(deadline).any() else "min-cost")
        try:
            alloc = solve(name, inp)
        except InfeasibleError:
            if name != "min-cost-slo":
                raise
            alloc = solve("min-cost", inp)  # deadline safety in the planner takes over
            note = "min-cost-slo infeasible at some tick: used min-cost; deadline safety decides"
            if note not in self.notes:
                self.notes.append(note)
        self.solves += 1
        share = alloc.share
        order = np.lexsort((-share, inp.job))
        first = np.ones(len(order), dtype=bool)
        first[1:] = inp.job[order][1:] != inp.job[order][:-1]
        pick = order[first & (share[order] > 0)]
        target[live[inp.job[pick]]] = chosen[pick]
        return target


def _positions(sub: Array, options: Array) -> Array:
    """Where each option of ``options`` sits in the sorted ``sub`` (-1 stays -1)."""
    pos = np.searchsorted(sub, np.maximum(options, 0))
    return np.where(options >= 0, pos, -1)
