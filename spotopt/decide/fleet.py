"""What the decision core reads and returns: the fleet's state, the options now, the moves.

These are plain arrays with a documented meaning so that ``spotopt plan`` (one snapshot, no job
placed yet), the what-if engine (a simulated clock) and the daemon (the journal and the
providers) can each build them from their own world and hand them to the one ``decide``
(``spotopt.decide.core``). ``FleetState`` round-trips through ``to_dict``/``from_dict`` (JSON-ready
lists), so a restarted daemon hands the core exactly what it saw before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

Array = np.ndarray[Any, Any]

_INT_FIELDS = ("option", "location", "dataset_location")
_BOOL_FIELDS = ("notice", "lost")


@dataclass
class FleetState:
    """Where every job stands now; arrays of length ``J`` (one entry per job, ``names`` order).

    - ``option``: key of the option (see ``Options.key``) its instance runs on, -1 for none.
    - ``location``: index into ``locations`` of its newest checkpoint, -1 for none yet.
    - ``remaining_steps``: work left (<= 0: finished; finished jobs are ignored).
    - ``dwell_h``: hours on the current option; ``since_checkpoint_h``: hours of work since the
      newest checkpoint (what a lost instance loses).
    - ``deadline_h``: hours left until the deadline (``inf``: none).
    - ``notice``: the instance got a preemption notice and is still up (it can checkpoint);
      ``lost``: the instance is gone (preempted, or vanished) and the work since the last
      checkpoint with it. Either forces a placement now.
    - ``spent_usd``: dollars spent on the job so far.
    - per-job constants: ``restart_h`` (provision + load), ``save_h`` (write a checkpoint),
      ``checkpoint_gb``, ``dataset_gb`` and ``dataset_location`` (-1: no dataset to move).
    - ``clock_h``: the decision's time in hours on the caller's clock (only differences matter).
    """

    names: tuple[str, ...]
    locations: tuple[tuple[str, str], ...]
    option: Array
    location: Array
    remaining_steps: Array
    dwell_h: Array
    since_checkpoint_h: Array
    deadline_h: Array
    notice: Array
    lost: Array
    spent_usd: Array
    restart_h: Array
    save_h: Array
    checkpoint_gb: Array
    dataset_gb: Array
    dataset_location: Array
    clock_h: float = 0.0

    @property
    def n_jobs(self) -> int:
        return len(self.names)

    @property
    def active(self) -> Array:
        return np.asarray(self.remaining_steps > 0)

    @property
    def forced(self) -> Array:
        """Jobs that must be placed now: no instance, a notice, or a lost instance."""
        return np.asarray((self.option < 0) | self.notice | self.lost)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: lists of numbers (``inf`` stays a float; the caller's encoder decides)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = value.tolist() if isinstance(value, np.ndarray) else value
        out["names"] = list(self.names)
        out["locations"] = [list(loc) for loc in self.locations]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FleetState:
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            value = data[f.name]
            if f.name == "names":
                kwargs[f.name] = tuple(value)
            elif f.name == "locations":
                kwargs[f.name] = tuple(tuple(loc) for loc in value)
            elif f.name == "clock_h":
                kwargs[f.name] = float(value)
            elif f.name in _INT_FIELDS:
                kwargs[f.name] = np.asarray(value, dtype=np.int64)
            elif f.name in _BOOL_FIELDS:
                kwargs[f.name] = np.asarray(value, dtype=bool)
            else:
                kwargs[f.name] = np.asarray(value, dtype=float)
        return cls(**kwargs)


@dataclass(frozen=True)
class Availability:
    """What a decider knows of spot capacity now, per market (length ``M``).

    - ``observed``: the market's capacity is learnt from observations (probe traces, the
      daemon's own launches); a market without is taken as always available.
    - ``history``: ``(M, H)``, the state seen at each of the last ``H`` steps of ``step_h``
      hours, oldest first, the last one now: 1 available, 0 not, NaN nothing seen.
    - ``refused``: a launch there was refused for capacity just now.
    """

    observed: Array
    history: Array
    step_h: float
    refused: Array

    @classmethod
    def known(
        cls, observed: Array, seen: Array, step_h: float, refused: Array, running: Array
    ) -> Availability:
        """What a decider knows now: ``seen`` (``(M, H)``, what was recorded before each step,
        the last step now) corrected by its own launches: a market ``refused`` just now is out,
        one it has an instance ``running`` on is available. The what-if's ``spotopt`` strategy
        and the daemon both build their ``Availability`` here."""
        history = np.array(seen, dtype=float, copy=True)
        if history.shape[1]:
            history[refused, -1] = 0.0
            history[running, -1] = 1.0
        return cls(np.asarray(observed, dtype=bool), history, step_h, np.asarray(refused, dtype=bool))


@dataclass(frozen=True)
class Options:
    """Every (job, market, GPUs per job) a job may use now; arrays of length ``E``, ``key`` sorted.

    - ``key``: a stable id of the option across decisions (the fleet state names options by it).
    - ``job``: index into the fleet's jobs; ``market``: index of the market (capacity is per
      market, ``capacity[market]`` instances at once, ``inf``: unlimited).
    - ``location``: index into the fleet's ``locations`` (egress is priced between them).
    - ``steps_per_hour``: expected effective throughput (discounted for preemption loss and
      checkpoint writes at the planning period); costs are priced with it.
    - ``steps_per_hour_low``: the same at the pessimistic end of the figure's interval (an
      estimate's ``low``; ``None``: every figure exact, the expected one): deadline rules plan
      with it (``low``), so an estimate that may be slow is not trusted to make a deadline.
    - ``usd_per_hour``: what one job slot costs now (NaN: the market is unavailable), the
      market's price by ``spotopt.price.per_slot``. An array, not ``SlotPrice`` objects: a round
      prices every option at once (millions in a large fleet) with one NumPy operation; the
      daemon makes the ``SlotPrice`` a move records from the chosen option's entry.
    - ``instances_per_hour``: instance-hours per job-hour (``spotopt.price.instances_per_slot``).
    - ``baseline_usd_per_hour`` and ``revert_h``: the forecast (``spotopt.decide.forecast``): the
      price is expected to stay at ``usd_per_hour`` for ``revert_h`` hours, then return to the
      baseline (``inf``: it holds). With no history, baseline = price and ``revert_h`` = ``inf``.
    - ``preemptions_per_hour``: the market's expected preemption rate (0 for on-demand).
    - ``transfer``: USD per GB between locations, ``(L + 1, L)``, last row "nowhere"
      (``spotopt.decide.egress.transfer_matrix``).
    - ``availability``: the markets' spot capacity as known now (``None``: nothing known, every
      priced market is taken as available); it decides when a job waits for spot
      (``spotopt.decide.capacity_rule``).
    - ``price_age_h``: hours since the option's market's newest price point, at the decision's
      time (``None``: every price taken as fresh); a job's stale ones give way to its fresh ones
      (``spotopt.decide.core.fresh_first``).
    """

    key: Array
    job: Array
    market: Array
    location: Array
    steps_per_hour: Array
    usd_per_hour: Array
    instances_per_hour: Array
    on_demand: Array
    baseline_usd_per_hour: Array
    revert_h: Array
    preemptions_per_hour: Array
    transfer: Array
    capacity: Array
    availability: Availability | None = None
    price_age_h: Array | None = None
    steps_per_hour_low: Array | None = None

    @property
    def low(self) -> Array:
        """Steps/hour at the pessimistic end (``steps_per_hour_low``, else the expected)."""
        return self.steps_per_hour if self.steps_per_hour_low is None else self.steps_per_hour_low

    @property
    def n_options(self) -> int:
        return len(self.key)

    def position(self, keys: Array) -> Array:
        """Where each of ``keys`` sits in this option set (-1: not in it, or -1 given)."""
        if self.n_options == 0:
            return np.full(len(keys), -1, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self.key, np.maximum(keys, 0)), self.n_options - 1)
        return np.where((keys >= 0) & (self.key[pos] == keys), pos, -1).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Move:
    """Put job ``job`` on the option with key ``to`` (``from_option`` -1: it had none).

    ``reason`` is one of ``REASONS``; dollars are expectations at decision time: ``cost_usd``
    the move's own cost (restart, redo or checkpoint write, egress), ``saving_usd`` the
    forecast saving net of it (0 for forced moves).
    """

    job: int
    from_option: int
    to: int
    reason: str
    saving_usd: float
    cost_usd: float


REASONS = ("start", "preempted", "unavailable", "deadline", "price")
