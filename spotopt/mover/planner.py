"""The move test: given where jobs run, the options now and a policy's targets, which jobs move.

Pure: arrays in (``spotopt.mover.fleet``), a list of ``Move`` out; no clock, no I/O. It is the
last step of ``spotopt.mover.core.decide``, which every caller goes through.

**Costs.** For job ``j`` and an option ``e`` with ``R`` steps left:

- *forecast cost* of running ``h`` hours on ``e``: ``usd_per_hour[e]`` for the first
  ``revert_h[e]`` hours, then ``baseline_usd_per_hour[e]`` (``spotopt.mover.forecast``); the
  cost to finish on ``e`` is that for ``h = R / steps_per_hour[e]`` (expected effective
  throughput, already discounted for preemption loss);
- *move cost* (``move_cost_usd``): the hours paid on ``e`` without progress — the restart
  (provision + load the checkpoint) plus either writing a fresh checkpoint first or redoing the
  work since the last one (whichever is shorter; a lost instance can only redo) — at ``e``'s
  price, plus egress (``spotopt.mover.egress.entry_usd``, the one egress rule).

**A voluntary move** of ``j`` from ``c`` to ``e`` needs a forecast *saving net of the move's
cost* above ``move_margin`` × the move's cost, where the saving is the better of two plans
against staying on ``c`` until the end:

- go for good: ``finish(c) - (move(e) + finish(e))``;
- ride out ``c``'s excursion on ``e`` (only while ``c`` is in one, ``revert_h[c]`` finite): run on ``e`` for
  ``h = min(revert_h[c], R / steps[e])`` hours, then move back and finish on ``c`` at its
  baseline. When the job would finish inside the excursion this is the first plan.

The candidates are the policy's target and the option cheapest per step now among the
affordable ones (see below); a candidate dearer per step *now* than ``c`` is not taken
(a forecast drop is waited for, not bet on: this is also what keeps a job that rode out a spike
from returning before the spike is over). Also needed: the job has dwelt ``min_dwell_h``, the
spend-rate cap and the budget
hold, at most ``max_moves_per_tick`` voluntary moves (largest net saving first).

**Keeping to the policy's deadline plan.** ``min-cost-slo`` may mix a cheap slow option with a
fast one, to be run one after the other. The time a job may plan with is its deadline less a
reserve (``deadline_reserve_h``: deadline safety's slack of a period, the margin and a restart,
plus three standard deviations of the preemption losses possible in the time left); an option is
*affordable* when
the job can run one more period on it, move (a restart) and still finish in that time on its
fastest spot option (on-demand if it has none), so that deadline safety holds along the way. A
job on an option that is no longer affordable moves at once (reason ``deadline``) to the
policy's target if a faster affordable spot option, else to the faster affordable spot option
cheapest per step now (none: it stays, and deadline safety is the last resort); voluntary
moves only go to affordable options, and a job with a deadline never goes back to a slower
option, by choice or after a preemption (its slow leg is over; after a preemption an option
within ``SAME_LEG_SPREAD`` of the lost one's speed is the same leg). So the switch from the slow to
the fast leg happens in time whatever the policy's re-solve period.

**Forced placements** (a job not yet started, a preemption notice, a lost instance, a market
gone) bypass dwell and the saving test but never the budget or the spend-rate cap: the policy's
target if allowed, else the option cheapest to finish including the move.

**Deadline safety** (the safety net of Can't-Be-Late's uniform progress): a job is *safe* while,
after one more period anywhere (where a preemption could erase the period's progress), an
on-demand run plus a restart still fits before its deadline. When that no longer holds, the job
moves to the on-demand option that finishes cheapest in time (none in time: the cheapest of the
fastest) and stays there. On-demand capacity is never preempted, so a job that was safe at the
previous period finishes in time whenever some on-demand market stays available.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from spotopt.mover.egress import entry_usd
from spotopt.mover.fleet import FleetState, Move, Options
from spotopt.mover.guardrails import Guardrails

Array = np.ndarray[Any, Any]


def forecast_usd(opts: Options, idx: Array, hours: Array) -> Array:
    """Forecast dollars of running options ``idx`` for ``hours`` from now (NaN: unavailable)."""
    revert = opts.revert_h[idx]
    now = np.minimum(hours, revert)
    return np.asarray(opts.usd_per_hour[idx] * now + opts.baseline_usd_per_hour[idx] * (hours - now))


def move_cost_usd(state: FleetState, opts: Options, cur: Array) -> Array:
    """Expected dollars of putting each option's job on it now (``cur``: positions of the jobs'
    current options in ``opts``, -1 none); see the module docstring."""
    j = opts.job
    c = cur[j]
    cur_steps = np.where(c >= 0, opts.steps_per_hour[np.maximum(c, 0)], 0.0)
    redo_h = state.since_checkpoint_h[j] * cur_steps / opts.steps_per_hour
    redo_h = np.where(state.lost[j], redo_h, np.minimum(redo_h, state.save_h[j]))
    egress = entry_usd(
        opts.transfer,
        state.location[j],
        opts.location,
        state.checkpoint_gb[j],
        state.dataset_gb[j],
        state.dataset_location[j],
    )
    return np.asarray((state.restart_h[j] + redo_h) * opts.usd_per_hour + egress)


SAME_LEG_SPREAD = 0.05
"""A job replacing a lost instance takes any option at most this much slower than the one it
ran on as the same leg: expected speeds differ by their markets' preemption discounts, not by
their GPUs, and a market the job has run on a while looks faster than a fresh one only because
its rate estimate has learnt from that life (the capacity rule's ``POOL_SPREAD`` for the same
reason). Without it a recovery went back to its old market when a 4x cheaper one had appeared."""

RESERVE_SIGMAS = 3.0
"""How many standard deviations of preemption losses a deadline plan keeps in reserve."""


def deadline_reserve_h(state: FleetState, opts: Options, guard: Guardrails) -> Array:
    """Hours before each job's deadline that a plan must not use (0 without a deadline).

    Deadline safety's own slack (a period, the margin, a restart), the wall time a preempted job
    waits for the next decision (half a period per expected preemption: unpaid, so not in the
    effective throughput, which counts paid time), and a reserve for bad luck: the expected
    preemption losses are in the effective throughput, but their spread is not. A plan may use
    all the time left ``T`` (a cheap slow leg, then a fast one); on its fast leg's market
    preempting at ``λ``, the number of preemptions is Poisson with variance ``λT``, each costing
    at most a period plus a restart: ``RESERVE_SIGMAS · sqrt(λT) · (period + restart)``.
    """
    n = state.n_jobs
    spot = np.isfinite(opts.usd_per_hour) & ~opts.on_demand.astype(bool)
    # The fast leg's market: the job's fastest spot option, the cheapest of those (which options
    # a caller leaves out as dominated does not change it: see ``spotopt.whatif.frontier``).
    fastest = np.zeros(n)
    np.maximum.at(fastest, opts.job[spot], opts.steps_per_hour[spot])
    fast = spot & (opts.steps_per_hour >= fastest[opts.job])
    cheapest = np.full(n, np.inf)
    np.minimum.at(cheapest, opts.job[fast], opts.usd_per_hour[fast])
    leg = fast & (opts.usd_per_hour <= cheapest[opts.job])
    rate = np.zeros(n)
    np.maximum.at(rate, opts.job[leg], opts.preemptions_per_hour[leg])
    left_h = np.where(np.isfinite(state.deadline_h), np.maximum(state.deadline_h, 0.0), 0.0)
    loss_h = guard.period_h + state.restart_h
    reserve = guard.period_h + guard.deadline_margin_h + state.restart_h
    reserve = reserve + rate * left_h * guard.period_h / 2.0
    reserve = reserve + RESERVE_SIGMAS * np.sqrt(rate * left_h) * loss_h
    return np.asarray(np.where(np.isfinite(state.deadline_h), reserve, 0.0))


def plan_moves(
    state: FleetState,
    opts: Options,
    cur: Array,
    target: Array,
    guard: Guardrails,
    *,
    move_usd: Array | None = None,
    reserve_h: Array | None = None,
    skip: Array | None = None,
) -> list[Move]:
    """Moves to make now (``skip``: jobs an earlier rule decided). ``cur[j]`` and ``target[j]``
    are positions in ``opts`` (-1: none) of job
    ``j``'s current option and the policy's choice; moves name options by ``opts.key``.
    ``move_usd``/``reserve_h``: ``move_cost_usd(state, opts, cur)`` and
    ``deadline_reserve_h(state, opts, guard)`` when the caller has them already."""
    n_jobs = state.n_jobs
    j_of = opts.job
    avail = np.isfinite(opts.usd_per_hour)
    remaining = state.remaining_steps[j_of]
    with np.errstate(invalid="ignore"):  # finished jobs (0 steps left) on unavailable options
        finish = np.where(
            avail, forecast_usd(opts, np.arange(opts.n_options), remaining / opts.steps_per_hour), np.inf
        )
        move_usd = move_cost_usd(state, opts, cur) if move_usd is None else move_usd
        move = np.where(avail, move_usd, np.inf)
        per_step_now = np.where(avail, opts.usd_per_hour / opts.steps_per_hour, np.inf)
    eligible = avail.copy()
    if guard.max_usd_per_hour is not None:
        eligible &= opts.usd_per_hour <= guard.max_usd_per_hour
    od = eligible & opts.on_demand.astype(bool)
    need_od = np.where(od, state.restart_h[j_of] + remaining / opts.steps_per_hour, np.inf)
    min_need = np.full(n_jobs, np.inf)
    np.minimum.at(min_need, j_of, need_od)
    safe = ~np.isfinite(min_need) | (state.deadline_h - guard.period_h - guard.deadline_margin_h >= min_need)
    # Time a job may still plan with (the policy plans with the same, ``deadline_reserve_h``).
    # An option is *affordable* when the job can run one more period on it, then move (a
    # restart) and still finish in that time on its fastest spot option (on-demand if it has
    # none): deadline safety then holds all along the fast leg.
    reserve_h = deadline_reserve_h(state, opts, guard) if reserve_h is None else reserve_h
    usable_h = state.deadline_h - reserve_h
    fastest = np.zeros(n_jobs)
    fast_pool = eligible & ~opts.on_demand.astype(bool)
    np.maximum.at(fastest, j_of[fast_pool], opts.steps_per_hour[fast_pool])
    np.maximum.at(fastest, j_of[od], np.where(fastest[j_of[od]] > 0, 0.0, opts.steps_per_hour[od]))
    with np.errstate(invalid="ignore", divide="ignore"):
        rest_after = np.maximum(remaining - opts.steps_per_hour * guard.period_h, 0.0)
        after_h = rest_after / fastest[j_of] + state.restart_h[j_of]
        affordable = after_h <= usable_h[j_of] - guard.period_h
    at = np.maximum(cur, 0)
    behind = (cur >= 0) & np.isfinite(state.deadline_h) & ~np.where(cur >= 0, affordable[at], True)

    active = state.active
    cur_ok = (cur >= 0) & ~state.notice & ~state.lost
    cur_ok &= np.where(cur >= 0, avail[np.maximum(cur, 0)], False)
    cur_finish = np.where(cur_ok, finish[np.maximum(cur, 0)], 0.0)
    committed = float(np.sum(state.spent_usd)) + float(np.sum(cur_finish[active]))
    budget = guard.budget_usd

    def fits(j: int, e: int) -> bool:
        if budget is None:
            return True
        return committed - cur_finish[j] + finish[e] + move[e] <= budget + 1e-9

    def net_saving(j: int, c: int, e: int) -> float:
        stay = finish[c]
        go = move[e] + finish[e]
        revert = opts.revert_h[c]
        if np.isfinite(revert):
            hours = min(revert, state.remaining_steps[j] / opts.steps_per_hour[e])
            rest = state.remaining_steps[j] - hours * opts.steps_per_hour[e]
            ride = move[e] + float(forecast_usd(opts, np.array([e]), np.array([hours]))[0])
            if rest > 1e-9:
                base_c = opts.baseline_usd_per_hour[c]
                back = (state.restart_h[j] + state.save_h[j]) * base_c
                back += state.checkpoint_gb[j] * opts.transfer[opts.location[e], opts.location[c]]
                ride += back + base_c * rest / opts.steps_per_hour[c]
            go = min(go, ride)
        return float(stay - go)

    to_finish = finish + move  # once: a forced placement looks up its options' share of it
    by_job = np.argsort(j_of, kind="stable")
    bounds = np.searchsorted(j_of[by_job], np.arange(n_jobs + 1))
    key = opts.key
    moves: list[Move] = []
    voluntary: list[Move] = []
    for j in np.flatnonzero(active if skip is None else active & ~skip).tolist():
        mine = by_job[bounds[j] : bounds[j + 1]]
        c = int(cur[j])
        from_key = int(state.option[j])
        if not safe[j] and not (cur_ok[j] and od[c]):
            cand = mine[od[mine]]
            in_time = cand[need_od[cand] <= state.deadline_h[j]]
            quickest = cand[need_od[cand] <= need_od[cand].min(initial=np.inf)]
            pool = in_time if len(in_time) else quickest
            pick = _cheapest(pool, to_finish, j, fits)
            if pick is not None:
                moves.append(Move(j, from_key, int(key[pick]), "deadline", 0.0, float(move[pick])))
                committed += finish[pick] + move[pick] - cur_finish[j]
            continue
        if not cur_ok[j]:
            if from_key < 0:
                reason = "start"
            elif state.notice[j] or state.lost[j]:
                reason = "preempted"
            else:
                reason = "unavailable"
            pool = mine[eligible[mine]]
            if not safe[j]:
                pool = pool[od[pool]]
            else:
                if c >= 0 and np.isfinite(state.deadline_h[j]):  # replacing an instance: no slower leg
                    fast = opts.steps_per_hour[pool] >= opts.steps_per_hour[c] * (1 - SAME_LEG_SPREAD)
                    pool = pool[fast] if fast.any() else pool
                if affordable[pool].any():
                    pool = pool[affordable[pool]]
            t = int(target[j])
            chosen = t if t >= 0 and t in set(pool.tolist()) and fits(j, t) else None
            pick = chosen if chosen is not None else _cheapest(pool, to_finish, j, fits)
            if pick is not None:
                moves.append(Move(j, from_key, int(key[pick]), reason, 0.0, float(move[pick])))
                committed += finish[pick] + move[pick]
            continue
        t = int(target[j])
        if behind[j] and safe[j]:
            faster = opts.steps_per_hour[mine] > opts.steps_per_hour[c]
            ok = mine[eligible[mine] & affordable[mine] & faster & ~od[mine]]
            pick = t if t in set(ok.tolist()) and fits(j, t) else _cheapest(ok, per_step_now, j, fits)
            if pick is not None:
                moves.append(Move(j, from_key, int(key[pick]), "deadline", 0.0, float(move[pick])))
                committed += finish[pick] + move[pick] - cur_finish[j]
                continue
        if state.dwell_h[j] < guard.min_dwell_h:
            continue
        candidates = {t}
        pool = mine[eligible[mine] & affordable[mine]]
        if len(pool):
            candidates.add(int(pool[np.argmin(per_step_now[pool])]))
        best: Move | None = None
        for t in sorted(candidates):
            if t < 0 or t == c or not eligible[t] or not affordable[t] or (not safe[j] and not od[t]):
                continue
            if np.isfinite(state.deadline_h[j]) and opts.steps_per_hour[t] < opts.steps_per_hour[c] * (
                1 - 1e-9
            ):
                continue  # back to a slower leg: restarts and risk the deadline plan did not count
            if per_step_now[t] > per_step_now[c]:
                continue  # dearer now: a forecast drop is waited for, not bet on
            saving = net_saving(j, c, t)
            if saving > guard.move_margin * move[t] and (best is None or saving > best.saving_usd):
                best = Move(j, from_key, int(key[t]), "price", saving, float(move[t]))
        if best is not None:
            voluntary.append(best)
    voluntary.sort(key=lambda m: (-m.saving_usd, m.job))
    if guard.max_moves_per_tick is not None:
        voluntary = voluntary[: guard.max_moves_per_tick]
    for m in voluntary:
        e = int(np.searchsorted(key, m.to))  # ``key`` is sorted and unique
        if fits(m.job, e):
            moves.append(m)
            committed += finish[e] + move[e] - cur_finish[m.job]
    return moves


def _cheapest(pool: Array, cost: Array, job: int, fits: Callable[[int, int], bool]) -> int | None:
    """The option of ``pool`` with the lowest ``cost`` that ``fits(job, option)`` accepts."""
    for e in pool[np.argsort(cost[pool], kind="stable")].tolist():
        if np.isfinite(cost[e]) and fits(job, e):
            return int(e)
    return None
