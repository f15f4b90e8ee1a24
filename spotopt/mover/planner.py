"""The planner: given where jobs run, the market now and a policy's targets, which jobs to move.

Pure: arrays in, a list of ``Move`` out; no clock, no I/O. The what-if engine calls it every
simulated tick and the mover daemon will call it every real period, so a what-if number is a
prediction of what the daemon does.

A job moves only when it pays for itself. For job ``j`` now on option ``c`` and a candidate
option ``e`` (a market slot, see ``PlannerOptions``):

- cost to finish on ``e``: ``remaining / steps_per_hour[e] * usd_per_hour[e]`` (expected
  effective throughput, i.e. already discounted for expected preemption loss);
- move cost: ``(restart_h + redo_h) * usd_per_hour[e]`` (provisioning + loading the checkpoint,
  and either writing a fresh checkpoint first or redoing the work since the last one, whichever
  is shorter) plus egress dollars: the checkpoint from the job's region to ``e``'s, and the
  dataset when ``e``'s region holds no copy (copies exist at the dataset's home and where the
  job runs now);
- a voluntary move needs: ``saving = finish(c) - finish(e) > move cost``, ``$/step(c) >=
  price_improvement * $/step(e)``, the job has dwelt ``min_dwell_h``, the spend-rate cap and the
  budget hold, and at most ``max_moves_per_tick`` voluntary moves are made (largest net saving
  first).

Forced placements (a job not yet started, a preemption notice, the current market gone) bypass
dwell and price improvement but never the budget or the spend-rate cap.

Deadline safety (the "uniform progress" idea of Can't-Be-Late, in its simplest safe form): a job
is *safe* while, after one more period anywhere (where a preemption could erase the period's
progress), an on-demand run plus a restart still fits before its deadline. When that no longer
holds, the job moves to the on-demand option that finishes cheapest in time (none in time: the
cheapest of the fastest) and stays there.
On-demand capacity is never preempted, so a job that was safe at the previous period finishes in
time whenever some on-demand market stays available.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from spotopt.mover.guardrails import Guardrails

Array = np.ndarray[Any, Any]

REASONS = ("start", "preempted", "unavailable", "deadline", "price")


@dataclass(frozen=True)
class PlannerOptions:
    """Every (job, market slot) a job may use now; length ``E``.

    ``usd_per_hour`` is what one slot costs now (NaN: the market has no price, i.e. is
    unavailable); ``steps_per_hour`` is the expected effective throughput; ``location`` indexes
    the ``(cloud, region)`` list the transfer matrix was built for.
    """

    job: Array
    location: Array
    steps_per_hour: Array
    usd_per_hour: Array
    on_demand: Array


@dataclass(frozen=True)
class PlannerJobs:
    """Per job (length ``J``); ``option`` is -1 when the job has no instance.

    ``location`` is where its latest checkpoint is (-1: none yet); ``notice`` means its instance
    is being (or was) preempted; ``deadline_h`` is the time left (``inf``: none).
    ``remaining_steps <= 0`` means finished: such jobs are ignored.
    """

    option: Array
    location: Array
    remaining_steps: Array
    dwell_h: Array
    since_checkpoint_h: Array
    deadline_h: Array
    notice: Array
    spent_usd: Array
    restart_h: Array
    save_h: Array
    checkpoint_gb: Array
    dataset_gb: Array
    dataset_location: Array


@dataclass(frozen=True, slots=True)
class Move:
    """Put job ``job`` on option ``to`` (``from_option`` -1: it had none). Dollars are expectations."""

    job: int
    from_option: int
    to: int
    reason: str
    saving_usd: float
    cost_usd: float


def move_costs(jobs: PlannerJobs, opts: PlannerOptions, transfer: Array) -> Array:
    """Expected dollars of moving each option's job onto it now (see the module docstring)."""
    j = opts.job
    cur = jobs.option[j]
    has_cur = cur >= 0
    cur_steps = np.where(has_cur, opts.steps_per_hour[np.maximum(cur, 0)], 0.0)
    redo_h = jobs.since_checkpoint_h[j] * cur_steps / opts.steps_per_hour
    redo_h = np.where(jobs.notice[j], redo_h, np.minimum(redo_h, jobs.save_h[j]))
    overhead_h = jobs.restart_h[j] + redo_h
    here = jobs.location[j]
    ckpt = jobs.checkpoint_gb[j] * transfer[here, opts.location]
    home = jobs.dataset_location[j]
    needs_data = (home >= 0) & (opts.location != home) & (opts.location != here)
    data = np.where(needs_data, jobs.dataset_gb[j] * transfer[home, opts.location], 0.0)
    return overhead_h * opts.usd_per_hour + ckpt + data


def plan_moves(
    jobs: PlannerJobs,
    opts: PlannerOptions,
    target: Array,
    transfer: Array,
    guard: Guardrails,
) -> list[Move]:
    """Moves to make now. ``target[j]`` is the policy's option for job ``j`` (-1: none).

    ``transfer`` is USD per GB between locations, shape ``(L + 1, L)`` with the last row for
    "no checkpoint yet" (see ``spotopt.mover.egress.transfer_matrix``).
    """
    n_jobs = len(jobs.option)
    j_of = opts.job
    avail = np.isfinite(opts.usd_per_hour)
    price = np.where(avail, opts.usd_per_hour, np.inf)
    per_step = price / opts.steps_per_hour
    with np.errstate(invalid="ignore"):  # finished jobs (0 steps left) on unavailable options
        finish = np.where(avail, jobs.remaining_steps[j_of] * per_step, np.inf)
        move = np.where(avail, move_costs(jobs, opts, transfer), np.inf)
    eligible = avail.copy()
    if guard.max_usd_per_hour is not None:
        eligible &= opts.usd_per_hour <= guard.max_usd_per_hour
    od = eligible & opts.on_demand.astype(bool)
    need_od = np.where(od, jobs.restart_h[j_of] + jobs.remaining_steps[j_of] / opts.steps_per_hour, np.inf)
    min_need = np.full(n_jobs, np.inf)
    np.minimum.at(min_need, j_of, need_od)
    safe = ~np.isfinite(min_need) | (jobs.deadline_h - guard.period_h - guard.deadline_margin_h >= min_need)

    active = jobs.remaining_steps > 0
    cur = jobs.option
    cur_ok = (cur >= 0) & ~jobs.notice.astype(bool)
    cur_ok &= np.where(cur >= 0, avail[np.maximum(cur, 0)], False)
    cur_finish = np.where(cur_ok, finish[np.maximum(cur, 0)], 0.0)
    committed = float(np.sum(jobs.spent_usd)) + float(np.sum(cur_finish[active]))
    budget = guard.budget_usd

    def fits(j: int, e: int) -> bool:
        if budget is None:
            return True
        return committed - cur_finish[j] + finish[e] + move[e] <= budget + 1e-9

    by_job = np.argsort(j_of, kind="stable")
    bounds = np.searchsorted(j_of[by_job], np.arange(n_jobs + 1))
    moves: list[Move] = []
    voluntary: list[Move] = []
    for j in np.flatnonzero(active).tolist():
        mine = by_job[bounds[j] : bounds[j + 1]]
        c = int(cur[j])
        if not safe[j] and not (cur_ok[j] and od[c]):
            cand = mine[od[mine]]
            in_time = cand[need_od[cand] <= jobs.deadline_h[j]]
            fastest = cand[need_od[cand] <= need_od[cand].min(initial=np.inf)]
            pool = in_time if len(in_time) else fastest
            pick = _cheapest(pool, finish + move, j, fits)
            if pick is not None:
                moves.append(Move(j, c, pick, "deadline", 0.0, float(move[pick])))
                committed += finish[pick] + move[pick] - cur_finish[j]
            continue
        if not cur_ok[j]:
            reason = "start" if c < 0 else ("preempted" if jobs.notice[j] else "unavailable")
            pool = mine[eligible[mine]]
            if not safe[j]:
                pool = pool[od[pool]]
            t = int(target[j])
            chosen = t if t >= 0 and t in set(pool.tolist()) and fits(j, t) else None
            pick = chosen if chosen is not None else _cheapest(pool, finish + move, j, fits)
            if pick is not None:
                moves.append(Move(j, c, pick, reason, 0.0, float(move[pick])))
                committed += finish[pick] + move[pick]
            continue
        t = int(target[j])
        if t < 0 or t == c or not eligible[t] or jobs.dwell_h[j] < guard.min_dwell_h:
            continue
        if not safe[j] and not od[t]:
            continue
        saving = float(cur_finish[j] - finish[t])
        if per_step[c] < guard.price_improvement * per_step[t] or saving <= move[t]:
            continue
        voluntary.append(Move(j, c, t, "price", saving, float(move[t])))
    voluntary.sort(key=lambda m: (-(m.saving_usd - m.cost_usd), m.job))
    if guard.max_moves_per_tick is not None:
        voluntary = voluntary[: guard.max_moves_per_tick]
    for m in voluntary:
        if fits(m.job, m.to):
            moves.append(m)
            committed += finish[m.to] + move[m.to] - cur_finish[m.job]
    return moves


def _cheapest(pool: Array, cost: Array, job: int, fits: Callable[[int, int], bool]) -> int | None:
    """The option of ``pool`` with the lowest ``cost`` that ``fits(job, option)`` accepts."""
    for e in pool[np.argsort(cost[pool], kind="stable")].tolist():
        if np.isfinite(cost[e]) and fits(job, e):
            return int(e)
    return None
