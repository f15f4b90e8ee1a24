"""The decision core's costs: what running an option for a while, moving a job onto one, and
keeping a deadline plan safe cost, in the forms every rule compares.

For job ``j`` and an option ``e`` with ``R`` steps left:

- *forecast cost* of running ``h`` hours on ``e``: ``usd_per_hour[e]`` for the first
  ``revert_h[e]`` hours, then ``baseline_usd_per_hour[e]`` (``spotopt.decide.forecast``); the
  cost to finish on ``e`` is that for ``h = R / steps_per_hour[e]`` (expected effective
  throughput, already discounted for preemption loss);
- *move cost* (``move_cost_usd``): the hours paid on ``e`` without progress — the restart
  (provision + load the checkpoint) plus either writing a fresh checkpoint first or redoing the
  work since the last one (whichever is shorter; a lost instance can only redo) — at ``e``'s
  price, plus egress (``spotopt.decide.egress.entry_usd``, the one egress rule);
- *deadline reserve* (``deadline_reserve_h``): the hours before a deadline no plan may use.

``round_costs`` gives a decision round both per-option arrays at once (the policy and the rules
read the same ones).

Pure: arrays in (``spotopt.decide.fleet``), arrays out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from spotopt.decide.egress import entry_usd
from spotopt.decide.fleet import FleetState, Options
from spotopt.decide.guardrails import Guardrails

Array = np.ndarray[Any, Any]


def forecast_usd(opts: Options, idx: Array, hours: Array) -> Array:
    """Forecast dollars of running options ``idx`` for ``hours`` from now (NaN: unavailable)."""
    revert = opts.revert_h[idx]
    now = np.minimum(hours, revert)
    return np.asarray(opts.usd_per_hour[idx] * now + opts.baseline_usd_per_hour[idx] * (hours - now))


def move_h(state: FleetState, opts: Options, cur: Array) -> Array:
    """Hours each option's job spends without progress when put on it now (``cur`` as in
    ``move_cost_usd``): the restart plus the shorter of writing a checkpoint first or redoing the
    work since the last one (a lost instance can only redo). What a move costs in dollars at the
    option's price, and in time before a deadline (``spotopt.decide.rules``)."""
    j = opts.job
    c = cur[j]
    cur_steps = np.where(c >= 0, opts.steps_per_hour[np.maximum(c, 0)], 0.0)
    redo_h = state.since_checkpoint_h[j] * cur_steps / opts.steps_per_hour
    redo_h = np.where(state.lost[j], redo_h, np.minimum(redo_h, state.save_h[j]))
    return np.asarray(state.restart_h[j] + redo_h)


def move_cost_usd(state: FleetState, opts: Options, cur: Array) -> Array:
    """Expected dollars of putting each option's job on it now (``cur``: positions of the jobs'
    current options in ``opts``, -1 none); see the module docstring."""
    j = opts.job
    egress = entry_usd(
        opts.transfer,
        state.location[j],
        opts.location,
        state.checkpoint_gb[j],
        state.dataset_gb[j],
        state.dataset_location[j],
    )
    return np.asarray(move_h(state, opts, cur) * opts.usd_per_hour + egress)


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
    reserve = guard.period_h + guard.per_job("deadline_margin_h", state.names) + state.restart_h
    reserve = reserve + rate * left_h * guard.period_h / 2.0
    reserve = reserve + RESERVE_SIGMAS * np.sqrt(rate * left_h) * loss_h
    return np.asarray(np.where(np.isfinite(state.deadline_h), reserve, 0.0))


def round_costs(state: FleetState, opts: Options, guard: Guardrails, cur: Array) -> tuple[Array, Array]:
    """A round's ``(move_cost_usd, deadline_reserve_h)``, computed once for the policy and the rules."""
    with np.errstate(invalid="ignore"):  # unavailable options are NaN
        move_usd = move_cost_usd(state, opts, cur)
    return move_usd, deadline_reserve_h(state, opts, guard)
