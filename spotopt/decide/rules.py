"""The move rules: ordered, named rules that each decide some jobs of one decision round.

``spotopt.decide.core.decide`` builds a ``Round`` (the fleet state, the options now, the
policy's targets and everything derived from them once) and hands it to its rules in order.
A rule looks at the jobs no earlier rule decided, *takes* a job (``Round.take``: a move,
counted against the budget) or *settles* it (``Round.settle``: it stays as it is), and may
*narrow* a job's options (``Round.narrow``) for the rules after it. Adding a recovery or move
strategy is adding a ``Rule`` to the tuple ``decide`` runs (``spotopt.decide.core.RULES``).

One budget for all rules: ``Round.fits`` holds the spent dollars plus the expected cost to
finish every job where it runs, updated with each move taken, so rules that each respect the
budget respect it together. The spend-rate cap (``max_usd_per_hour``) is in ``eligible``.

The price rules, after the capacity rule (``spotopt.decide.capacity_rule``):

1. **Deadline safety** (``DEADLINE_SAFETY``, the safety net of Can't-Be-Late's uniform
   progress): a job is *safe* while, after one more period anywhere (where a preemption could
   erase the period's progress), an on-demand run plus a restart still fits before its
   deadline. When that no longer holds, the job must run on an option that finishes in time
   (``Round.in_time``: at the pessimistic end of its figure, counting a move's restart and the
   work lost since the checkpoint; on-demand ones first, never preempted): it stays on its
   working option if that is one, else it moves (reason ``deadline``) to the one cheapest to
   finish including the move. Whether it runs on spot or on-demand now does not matter: a
   slow on-demand instance is no safety net. None in time: the quickest (within
   ``SAME_LEG_SPREAD``, on-demand among them if any), the deadline at risk. On-demand capacity
   is never preempted, so a job that was safe at the previous period finishes in time whenever
   some on-demand market stays available.
2. **Replacement** (``REPLACE``): a job not yet started, with a preemption notice, a lost
   instance or a market gone is placed now, bypassing dwell and the saving test but never the
   budget or the spend-rate cap: the policy's target if allowed, else the option cheapest to
   finish including the move. A job with a deadline replacing an instance never takes a slower
   leg (``SAME_LEG_SPREAD``), and prefers affordable options (below); with none affordable
   it takes its fast leg (``Round.fast_leg``), never the plan's slow one.
3. **Catch-up** (``CATCH_UP``): keeping to the policy's deadline plan. ``min-cost-slo`` may mix
   a cheap slow option with a fast one, to be run one after the other. A plan's legs are the
   job's spot options, its on-demand ones if it has no spot (``Round.leg``). The time a job may
   plan with is its deadline less a reserve (``spotopt.decide.costs.deadline_reserve_h``); an
   option is *affordable* when the job can run one more period on it, move (a restart) and
   still finish in that time on its fastest leg, so that deadline safety holds along the way.
   A job on an option that is no longer affordable (spot or on-demand) moves at once (reason
   ``deadline``) to the policy's target if a faster affordable leg, else to the faster
   affordable leg cheapest per step now (none affordable: the fastest legs, for each period
   on a slower one brings deadline safety nearer; none faster: the price rule still looks, and
   deadline safety is the last resort). So the switch from the slow to the fast leg happens
   in time whatever the policy's re-solve period.
4. **Dwell** (``DWELL``): a job that arrived less than ``min_dwell_h`` ago stays (the
   guardrails are per job where a spec sets them: ``Guardrails.per_job``).
5. **Price** (``PRICE``): a voluntary move of ``j`` from ``c`` to ``e`` needs a forecast
   *saving net of the move's cost* above ``move_margin`` × the move's cost, where the saving is
   the better of two plans against staying on ``c`` until the end: go for good,
   ``finish(c) - (move(e) + finish(e))``; or ride out ``c``'s excursion on ``e`` (only while
   ``c`` is in one, ``revert_h[c]`` finite): run on ``e`` for ``h = min(revert_h[c], R /
   steps[e])`` hours, then move back and finish on ``c`` at its baseline. The candidates are the
   policy's target and the affordable option cheapest per step now; one dearer per step *now*
   than ``c`` is not taken (a forecast drop is waited for, not bet on: this also keeps a job
   that rode out a spike from returning before the spike is over), nor, for a job with a
   deadline, a slower one (its slow leg is over). At most ``max_moves_per_tick`` voluntary
   moves, largest net saving first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spotopt.decide.costs import forecast_usd, move_h, round_costs
from spotopt.decide.fleet import FleetState, Move, Options
from spotopt.decide.guardrails import Guardrails

Array = np.ndarray[Any, Any]

SAME_LEG_SPREAD = 0.05
"""A job replacing a lost instance takes any option at most this much slower than the one it
ran on as the same leg: expected speeds differ by their markets' preemption discounts, not by
their GPUs, and a market the job has run on a while looks faster than a fresh one only because
its rate estimate has learnt from that life (the capacity rule's ``POOL_SPREAD`` for the same
reason). Without it a recovery went back to its old market when a 4x cheaper one had appeared."""


@dataclass
class Round:
    """One decision round: what every rule reads, and what the rules decided so far.

    ``cur[j]`` and ``target[j]`` are positions in ``opts`` (-1: none) of job ``j``'s current
    option and the policy's choice; ``move_usd`` and ``reserve_h`` as ``move_cost_usd`` and
    ``deadline_reserve_h`` give them. The arrays derived from the usable options (``finish``,
    ``safe``, ``affordable``, ...) are computed once and again after a ``narrow``; among them
    ``done_h`` (per option, the hours its job needs to finish there at the pessimistic end of
    the figure, with the move's restart and lost work unless it runs there now) and ``leg``
    (the options a deadline plan's legs run on: spot, on-demand for a job without spot).
    """

    state: FleetState
    opts: Options
    guard: Guardrails
    cur: Array
    target: Array
    move_usd: Array
    reserve_h: Array
    decided: Array = field(init=False)
    moves: list[Move] = field(init=False, default_factory=list)
    usable: Array = field(init=False)
    _taken_usd: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        self.decided = ~self.state.active
        self.min_dwell_h = self.guard.per_job("min_dwell_h", self.state.names)
        self.move_margin = self.guard.per_job("move_margin", self.state.names)
        self.deadline_margin_h = self.guard.per_job("deadline_margin_h", self.state.names)
        self.usable = np.isfinite(self.opts.usd_per_hour)
        order = np.argsort(self.opts.job, kind="stable")
        self._by_job = order
        self._bounds = np.searchsorted(self.opts.job[order], np.arange(self.state.n_jobs + 1))
        self._derive()

    @classmethod
    def build(
        cls,
        state: FleetState,
        opts: Options,
        cur: Array,
        target: Array,
        guard: Guardrails,
    ) -> Round:
        """A round with its costs computed (``spotopt.decide.costs.round_costs``)."""
        return cls(state, opts, guard, cur, target, *round_costs(state, opts, guard, cur))

    def options_of(self, j: int) -> Array:
        """Positions of job ``j``'s options (usable or not)."""
        return np.asarray(self._by_job[self._bounds[j] : self._bounds[j + 1]])

    def undecided(self) -> list[int]:
        """The jobs no rule has decided yet, in fleet order."""
        return np.flatnonzero(~self.decided).tolist()

    def fits(self, j: int, e: int) -> bool:
        """Whether putting job ``j`` on option ``e`` keeps the fleet within its budget."""
        budget = self.guard.budget_usd
        if budget is None:
            return True
        committed = self._committed_base + self._taken_usd
        return bool(committed - self.cur_finish[j] + self.finish[e] + self.move[e] <= budget + 1e-9)

    def take(self, j: int, e: int, reason: str, saving_usd: float = 0.0) -> None:
        """Move job ``j`` to option ``e`` (decided; its expected cost to finish is committed)."""
        key = int(self.opts.key[e])
        self.moves.append(Move(j, int(self.state.option[j]), key, reason, saving_usd, float(self.move[e])))
        self._taken_usd += float(self.finish[e] + self.move[e] - self.cur_finish[j])
        self.decided[j] = True

    def settle(self, j: int) -> None:
        """Job ``j`` stays as it is: no later rule looks at it."""
        self.decided[j] = True

    def narrow(self, keep: Array) -> None:
        """Only options in ``keep`` (a mask over options) stay usable for the rules after this."""
        self.usable = self.usable & keep
        self._derive()

    def fast_leg(self, pool: Array) -> Array:
        """The spot options of ``pool`` (one job's; all of it if it has none) within
        ``SAME_LEG_SPREAD`` of the fastest: where a job with a deadline goes when no option is
        affordable any more, since each period on a slower one brings deadline safety's
        on-demand nearer (which stays deadline safety's to choose)."""
        spot = pool[~self.od[pool]]
        pool = spot if len(spot) else pool
        if not len(pool):
            return pool
        speed = self.opts.steps_per_hour[pool]
        return np.asarray(pool[speed >= speed.max() * (1 - SAME_LEG_SPREAD)])

    def in_time(self, j: int) -> Array:
        """Job ``j``'s options that finish by its deadline (``done_h``, at the pessimistic end of
        each figure, counting a move's restart and lost work); none in time: the quickest to
        finish, within ``SAME_LEG_SPREAD``. Of either, the on-demand ones if any (never
        preempted). What kind of GPU or market the job runs on now does not matter: a slow
        on-demand instance is no safety net, and a faster spot option beats one that misses."""
        mine = self.options_of(j)
        mine = mine[self.eligible[mine]]
        done = self.done_h[mine]
        ok = done <= self.state.deadline_h[j]
        if not ok.any():
            ok = done <= done.min(initial=np.inf) * (1 + SAME_LEG_SPREAD)
        od = ok & self.od[mine]
        return np.asarray(mine[od] if od.any() else mine[ok])

    def cheapest(self, pool: Array, cost: Array, j: int) -> int | None:
        """The option of ``pool`` with the lowest ``cost`` that fits the budget for job ``j``."""
        for e in pool[np.argsort(cost[pool], kind="stable")].tolist():
            if np.isfinite(cost[e]) and self.fits(j, e):
                return int(e)
        return None

    def _derive(self) -> None:
        state, opts, guard, cur = self.state, self.opts, self.guard, self.cur
        n_jobs, j_of = state.n_jobs, opts.job
        avail = self.usable
        remaining = state.remaining_steps[j_of]
        with np.errstate(invalid="ignore"):  # finished jobs (0 steps left) on unavailable options
            hours = remaining / opts.steps_per_hour
            self.finish = np.where(avail, forecast_usd(opts, np.arange(opts.n_options), hours), np.inf)
            self.move = np.where(avail, self.move_usd, np.inf)
            self.per_step_now = np.where(avail, opts.usd_per_hour / opts.steps_per_hour, np.inf)
        eligible = avail.copy()
        if guard.max_usd_per_hour is not None:
            eligible &= opts.usd_per_hour <= guard.max_usd_per_hour
        self.eligible = eligible
        self.od = od = eligible & opts.on_demand.astype(bool)
        low = opts.low  # deadlines are planned at the pessimistic end of an estimate
        self.need_od = np.where(od, state.restart_h[j_of] + remaining / low, np.inf)
        min_need = np.full(n_jobs, np.inf)
        np.minimum.at(min_need, j_of, self.need_od)
        slack = state.deadline_h - guard.period_h - self.deadline_margin_h
        self.safe = ~np.isfinite(min_need) | (slack >= min_need)
        usable_h = state.deadline_h - self.reserve_h
        spot = eligible & ~od
        has_spot = np.zeros(n_jobs, dtype=bool)
        has_spot[j_of[spot]] = True
        self.leg = spot | (od & ~has_spot[j_of])
        fastest = np.zeros(n_jobs)
        np.maximum.at(fastest, j_of[self.leg], low[self.leg])
        with np.errstate(invalid="ignore", divide="ignore"):
            rest_after = np.maximum(remaining - low * guard.period_h, 0.0)
            after_h = rest_after / fastest[j_of] + state.restart_h[j_of]
            self.affordable = after_h <= usable_h[j_of] - guard.period_h
        at = np.maximum(cur, 0)
        on_one = cur >= 0
        self.behind = on_one & np.isfinite(state.deadline_h) & ~np.where(on_one, self.affordable[at], True)
        self.cur_ok = on_one & ~state.notice & ~state.lost & np.where(on_one, avail[at], False)
        here = self.cur_ok[j_of] & (cur[j_of] == np.arange(opts.n_options))
        with np.errstate(invalid="ignore", divide="ignore"):
            self.done_h = np.where(
                eligible, np.where(here, 0.0, move_h(state, opts, cur)) + remaining / low, np.inf
            )
        self.cur_finish = np.where(self.cur_ok, self.finish[at], 0.0)
        self._committed_base = float(np.sum(state.spent_usd)) + float(np.sum(self.cur_finish[state.active]))


@dataclass(frozen=True)
class Rule:
    """A named step of the decision: ``apply`` decides some of a round's undecided jobs."""

    name: str
    apply: Callable[[Round], None]


def _deadline_safety(rnd: Round) -> None:
    """An unsafe job runs on an option that finishes in time, on-demand first (module docstring)."""
    for j in rnd.undecided():
        if rnd.safe[j]:
            continue
        pool = rnd.in_time(j)
        c = int(rnd.cur[j])
        if rnd.cur_ok[j] and c in set(pool.tolist()):
            if not rnd.od[c]:
                rnd.settle(j)  # spot in time where no on-demand is: no later rule may take it off
            continue
        pick = rnd.cheapest(pool, rnd.finish + rnd.move, j)
        if pick is None:
            rnd.settle(j)
        else:
            rnd.take(j, pick, "deadline")


def _replace(rnd: Round) -> None:
    """A job without a working instance is placed now (module docstring)."""
    state, opts = rnd.state, rnd.opts
    for j in rnd.undecided():
        if rnd.cur_ok[j]:
            continue
        c = int(rnd.cur[j])
        if state.option[j] < 0:
            reason = "start"
        elif state.notice[j] or state.lost[j]:
            reason = "preempted"
        else:
            reason = "unavailable"
        mine = rnd.options_of(j)
        pool = mine[rnd.eligible[mine]]
        if not rnd.safe[j]:
            pool = pool[rnd.od[pool]]
        else:
            if c >= 0 and np.isfinite(state.deadline_h[j]):  # replacing an instance: no slower leg
                fast = opts.steps_per_hour[pool] >= opts.steps_per_hour[c] * (1 - SAME_LEG_SPREAD)
                pool = pool[fast] if fast.any() else pool
            if rnd.affordable[pool].any():
                pool = pool[rnd.affordable[pool]]
            elif np.isfinite(state.deadline_h[j]):
                pool = rnd.fast_leg(pool)  # behind the plan already: a slower option falls further
        t = int(rnd.target[j])
        chosen = t if t >= 0 and t in set(pool.tolist()) and rnd.fits(j, t) else None
        pick = chosen if chosen is not None else rnd.cheapest(pool, rnd.finish + rnd.move, j)
        if pick is None:
            rnd.settle(j)
        else:
            rnd.take(j, pick, reason)


def _catch_up(rnd: Round) -> None:
    """A safe job behind its deadline plan moves to a faster affordable option of its legs' kind
    (spot; on-demand for a job without spot): none affordable, its fast leg."""
    opts = rnd.opts
    for j in rnd.undecided():
        if not (rnd.behind[j] and rnd.safe[j]):
            continue
        mine = rnd.options_of(j)
        # Another leg, not a twin whose expected speed differs by its market's preemption
        # discount: a twin reads faster whenever the job's own market just preempted it (its
        # learnt rate rose), and hopping to it paid a restart each period for nothing.
        faster = opts.steps_per_hour[mine] > opts.steps_per_hour[int(rnd.cur[j])] * (1 + SAME_LEG_SPREAD)
        legs = mine[faster & rnd.leg[mine]]
        ok = legs[rnd.affordable[legs]] if rnd.affordable[legs].any() else rnd.fast_leg(legs)
        t = int(rnd.target[j])
        pick = t if t in set(ok.tolist()) and rnd.fits(j, t) else rnd.cheapest(ok, rnd.per_step_now, j)
        if pick is not None:
            rnd.take(j, pick, "deadline")


def _dwell(rnd: Round) -> None:
    """A job that arrived less than its ``min_dwell_h`` ago stays."""
    for j in rnd.undecided():
        if rnd.state.dwell_h[j] < rnd.min_dwell_h[j]:
            rnd.settle(j)


def _net_saving(rnd: Round, j: int, c: int, e: int) -> float:
    """Forecast saving of moving job ``j`` from ``c`` to ``e``, net of the move (docstring)."""
    state, opts = rnd.state, rnd.opts
    stay = rnd.finish[c]
    go = rnd.move[e] + rnd.finish[e]
    revert = opts.revert_h[c]
    if np.isfinite(revert):
        hours = min(revert, state.remaining_steps[j] / opts.steps_per_hour[e])
        rest = state.remaining_steps[j] - hours * opts.steps_per_hour[e]
        ride = rnd.move[e] + float(forecast_usd(opts, np.array([e]), np.array([hours]))[0])
        if rest > 1e-9:
            base_c = opts.baseline_usd_per_hour[c]
            back = (state.restart_h[j] + state.save_h[j]) * base_c
            back += state.checkpoint_gb[j] * opts.transfer[opts.location[e], opts.location[c]]
            ride += back + base_c * rest / opts.steps_per_hour[c]
        go = min(go, ride)
    return float(stay - go)


def _price(rnd: Round) -> None:
    """Voluntary moves that pay for themselves, largest net saving first (module docstring)."""
    state, opts, guard = rnd.state, rnd.opts, rnd.guard
    offers: list[tuple[float, int, int]] = []
    for j in rnd.undecided():
        c = int(rnd.cur[j])
        mine = rnd.options_of(j)
        candidates = {int(rnd.target[j])}
        pool = mine[rnd.eligible[mine] & rnd.affordable[mine]]
        if len(pool):
            candidates.add(int(pool[np.argmin(rnd.per_step_now[pool])]))
        best: tuple[float, int, int] | None = None
        for t in sorted(candidates):
            if t < 0 or t == c or not rnd.eligible[t] or not rnd.affordable[t]:
                continue
            if not rnd.safe[j] and not rnd.od[t]:
                continue
            slower = opts.steps_per_hour[t] < opts.steps_per_hour[c] * (1 - 1e-9)
            if np.isfinite(state.deadline_h[j]) and slower:
                continue  # back to a slower leg: restarts and risk the deadline plan did not count
            if rnd.per_step_now[t] > rnd.per_step_now[c]:
                continue  # dearer now: a forecast drop is waited for, not bet on
            saving = _net_saving(rnd, j, c, t)
            if saving > rnd.move_margin[j] * rnd.move[t] and (best is None or saving > best[0]):
                best = (saving, j, t)
        if best is not None:
            offers.append(best)
    offers.sort(key=lambda o: (-o[0], o[1]))
    if guard.max_moves_per_tick is not None:
        offers = offers[: guard.max_moves_per_tick]
    for saving, j, e in offers:
        if rnd.fits(j, e):
            rnd.take(j, e, "price", saving)


DEADLINE_SAFETY = Rule("deadline-safety", _deadline_safety)
REPLACE = Rule("replace", _replace)
CATCH_UP = Rule("catch-up", _catch_up)
DWELL = Rule("dwell", _dwell)
PRICE = Rule("price", _price)
PRICE_RULES: tuple[Rule, ...] = (DEADLINE_SAFETY, REPLACE, CATCH_UP, DWELL, PRICE)
"""The rules that decide on price and deadlines, in their order (module docstring)."""


def apply_rules(rnd: Round, rules: Sequence[Rule]) -> list[Move]:
    """Hand the round to each rule in order; the moves they took."""
    for rule in rules:
        rule.apply(rnd)
    return rnd.moves


def plan_moves(
    state: FleetState,
    opts: Options,
    cur: Array,
    target: Array,
    guard: Guardrails,
    rules: Sequence[Rule] = PRICE_RULES,
) -> list[Move]:
    """The moves ``rules`` make on a fresh round (the price rules alone by default)."""
    return apply_rules(Round.build(state, opts, cur, target, guard), rules)
