"""Kaplan–Meier estimates for spot instance lifetimes with right-censoring.

An instance that was still running at the end of the window, or that its owner terminated, was
not preempted: its lifetime is *censored* (we only know it lasted at least that long). Dropping
those lifetimes, or counting them as preemptions, would bias the median low; Kaplan–Meier keeps
them in the risk set until their censoring time. At a tie, preemptions come before censorings
(the usual convention: an instance censored at t was at risk at t).
"""

from __future__ import annotations

import numpy as np


def curve(durations: np.ndarray, preempted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Event times (ascending) and the survival probability just after each."""
    durations = np.asarray(durations, dtype=float)
    preempted = np.asarray(preempted, dtype=bool)
    times = np.unique(durations[preempted])
    if times.size == 0:
        return times, np.ones(0)
    sorted_d = np.sort(durations)
    at_risk = len(sorted_d) - np.searchsorted(sorted_d, times, side="left")
    events = np.searchsorted(np.sort(durations[preempted]), times, side="right") - np.searchsorted(
        np.sort(durations[preempted]), times, side="left"
    )
    return times, np.cumprod(1.0 - events / at_risk)


def median(durations: np.ndarray, preempted: np.ndarray) -> float:
    """The first time at which survival drops to 0.5 or below; NaN when it never does."""
    times, surv = curve(durations, preempted)
    below = np.nonzero(surv <= 0.5)[0]
    return float(times[below[0]]) if below.size else float("nan")


def survival_at(durations: np.ndarray, preempted: np.ndarray, t: float) -> float:
    """P(lifetime > t); NaN when ``t`` lies beyond the longest lifetime and survival is not yet 0."""
    times, surv = curve(durations, preempted)
    idx = np.searchsorted(times, t, side="right")
    value = float(surv[idx - 1]) if idx else 1.0
    longest = np.asarray(durations, dtype=float).max(initial=-np.inf)
    return float("nan") if t > longest and value > 0 else value
