"""Guardrails: the limits a planner obeys, as plain data (the daemon reads them from settings).

Why each exists:
- ``move_margin``: forecasts err; without hysteresis a job chases every cent and pays a restart
  each time. A voluntary move needs a forecast saving, net of the move's own cost (restart,
  checkpoint, egress), above this multiple of that cost (``spotopt.decide.rules``).
- ``min_dwell_h``: a job that just arrived stays this long before moving voluntarily again.
- ``max_moves_per_tick``: caps voluntary moves per planning round (the biggest net savings go
  first), so one price shock cannot restart a whole fleet at once.
- ``max_usd_per_hour``: no job is placed on anything dearer per hour than this.
- ``budget_usd``: spent so far plus the expected cost to finish every job must stay within it.
- ``period_h``: how often the planner runs; deadline safety looks one period ahead.
- ``deadline_margin_h``: extra slack kept before falling back to on-demand.
- ``max_price_age_h``: a price last observed longer ago is *stale* (the history may simply have
  stopped): a job is never moved onto a stale-priced option while it has a fresh one
  (``spotopt.decide.core.fresh_first``); default: the setting ``price_max_age_days``.

A preemption notice (or an unavailable market) bypasses dwell and the saving test, never the
budget or the spend-rate cap.

``min_dwell_h``, ``move_margin`` and ``deadline_margin_h`` are per job where a job's spec says so
(its ``guardrails:`` section; ``Guardrails.with_jobs``): a short experiment may move after ten
minutes where a week-long run should not, and a job whose deadline is a demo keeps more slack.
The rules read them per job (``Guardrails.per_job``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np

from spotopt.errors import InputError
from spotopt.settings import Settings

PER_JOB = ("min_dwell_h", "move_margin", "deadline_margin_h")
"""The guardrails a job's spec may set for itself."""


class JobOverrides(Protocol):
    """A job spec's ``guardrails:`` section (``spotopt.jobspec.JobGuardrails``), in seconds."""

    @property
    def min_dwell_s(self) -> float | None: ...

    @property
    def move_margin(self) -> float | None: ...

    @property
    def deadline_margin_s(self) -> float | None: ...


class SpecJob(Protocol):
    """What ``with_jobs`` reads of a job spec."""

    @property
    def name(self) -> str: ...

    @property
    def guardrails(self) -> JobOverrides | None: ...


@dataclass(frozen=True, slots=True)
class Guardrails:
    move_margin: float = 0.5
    min_dwell_h: float = 2.0
    max_moves_per_tick: int | None = None
    max_usd_per_hour: float | None = None
    budget_usd: float | None = None
    period_h: float = 1.0
    deadline_margin_h: float = 0.0
    max_price_age_h: float = field(default_factory=lambda: Settings().price_max_age_days * 24.0)
    jobs: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Per job name, the guardrails of ``PER_JOB`` its spec sets (the others: the fleet's)."""

    def with_jobs(self, specs: Iterable[SpecJob]) -> Guardrails:
        """These guardrails with the per-job overrides the specs carry."""
        jobs: dict[str, dict[str, float]] = {}
        for spec in specs:
            own = spec.guardrails
            if own is None:
                continue
            values = {
                "min_dwell_h": _hours(own.min_dwell_s),
                "move_margin": own.move_margin,
                "deadline_margin_h": _hours(own.deadline_margin_s),
            }
            jobs[spec.name] = {k: float(v) for k, v in values.items() if v is not None}
        return replace(self, jobs=jobs)

    def per_job(self, name: str, names: Sequence[str]) -> np.ndarray[Any, Any]:
        """Guardrail ``name`` (one of ``PER_JOB``) for each job of ``names``."""
        default = float(getattr(self, name))
        return np.array([self.jobs.get(n, {}).get(name, default) for n in names], dtype=float)

    def __post_init__(self) -> None:
        if not self.move_margin >= 0:
            raise InputError(f"guardrails.move_margin is {self.move_margin}; it must be >= 0")
        if self.min_dwell_h < 0 or self.period_h <= 0 or self.deadline_margin_h < 0:
            raise InputError("guardrails: min_dwell_h and deadline_margin_h must be >= 0, period_h > 0")
        if not self.max_price_age_h > 0:
            raise InputError(f"guardrails.max_price_age_h is {self.max_price_age_h}; it must be > 0")
        if self.max_moves_per_tick is not None and self.max_moves_per_tick < 0:
            raise InputError("guardrails.max_moves_per_tick must be >= 0")
        for job, values in self.jobs.items():
            for key, value in values.items():
                if key not in PER_JOB or not value >= 0:
                    raise InputError(
                        f"guardrails of job {job!r}: {key} is {value}; it must be one of {PER_JOB}, >= 0"
                    )


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else seconds / 3600.0
