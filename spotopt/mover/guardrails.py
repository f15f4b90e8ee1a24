"""Guardrails: the limits a planner obeys, as plain data (the daemon reads them from settings).

Why each exists:
- ``move_margin``: forecasts err; without hysteresis a job chases every cent and pays a restart
  each time. A voluntary move needs a forecast saving, net of the move's own cost (restart,
  checkpoint, egress), above this multiple of that cost (``spotopt.mover.planner``).
- ``min_dwell_h``: a job that just arrived stays this long before moving voluntarily again.
- ``max_moves_per_tick``: caps voluntary moves per planning round (the biggest net savings go
  first), so one price shock cannot restart a whole fleet at once.
- ``max_usd_per_hour``: no job is placed on anything dearer per hour than this.
- ``budget_usd``: spent so far plus the expected cost to finish every job must stay within it.
- ``period_h``: how often the planner runs; deadline safety looks one period ahead.
- ``deadline_margin_h``: extra slack kept before falling back to on-demand.

A preemption notice (or an unavailable market) bypasses dwell and the saving test, never the
budget or the spend-rate cap.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotopt.errors import InputError


@dataclass(frozen=True, slots=True)
class Guardrails:
    move_margin: float = 0.5
    min_dwell_h: float = 2.0
    max_moves_per_tick: int | None = None
    max_usd_per_hour: float | None = None
    budget_usd: float | None = None
    period_h: float = 1.0
    deadline_margin_h: float = 0.0

    def __post_init__(self) -> None:
        if not self.move_margin >= 0:
            raise InputError(f"guardrails.move_margin is {self.move_margin}; it must be >= 0")
        if self.min_dwell_h < 0 or self.period_h <= 0 or self.deadline_margin_h < 0:
            raise InputError("guardrails: min_dwell_h and deadline_margin_h must be >= 0, period_h > 0")
        if self.max_moves_per_tick is not None and self.max_moves_per_tick < 0:
            raise InputError("guardrails.max_moves_per_tick must be >= 0")
