"""What each dashboard page shows, read from the history in one transaction per page.

Every number comes from the function that already owns it, so the dashboard and the terminal
agree: a job's spend, placement, progress and moves from ``spotopt.mover.status`` (``jobs show``),
its ledger from ``spotopt.mover.ledger`` (``jobs cost``), prices and availability from the
registered reports (``report run price-board`` / ``spot-discount`` / ``availability``), a job's
log from where the local provider keeps it (``jobs logs``). Nothing here writes; pages are plain
dicts for the templates (``spotopt.ui.app``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotopt.catalog import CATALOG_SOURCE
from spotopt.clouds.common.base import market_label
from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import (
    JOB_STATES,
    CapacityObservation,
    InstanceType,
    JobEvent,
    ManagedJob,
    Market,
    Placement,
    PricePoint,
    WhatifPlacement,
    WhatifResult,
    WhatifRun,
)
from spotopt.db.queries import history_span
from spotopt.errors import InputError
from spotopt.mover import ledger
from spotopt.mover import status as job_status
from spotopt.mover.jobs import job_spec
from spotopt.mover.observed import PREEMPTION_ENDS
from spotopt.mover.progress import progress_points
from spotopt.render import usd, usd_summed
from spotopt.reports.availability import heatmap
from spotopt.reports.base import ReportResult
from spotopt.reports.frames import dt_us
from spotopt.reports.registry import REPORTS
from spotopt.reports.sql import markets_stmt
from spotopt.settings import Settings

WINDOW = timedelta(days=30)
"""The markets page shows the last 30 days of prices, the availability page of observations."""
CHART_MARKETS = 12
"""At most this many series in a chart (the cheapest or least available first): legible lines."""
HEATMAP_COLUMNS = 96
"""Time columns of the availability heatmap: a quarter-hour each over a day, 7.5 h over 30 days."""
LOG_TAIL_BYTES = 64 * 1024
"""A job's page shows at most this much of the end of its log (``jobs logs`` prints it all)."""
FAILED_STATES = ("failed", "over-budget")
"""States whose reason the job's page shows first: why the job stopped."""


def _deadline(job: ManagedJob) -> datetime | None:
    """The job's deadline as a time: a relative one (``72h``) counts from submission, as the daemon
    counts it."""
    hours = job_spec(job).deadline_hours(job.created_at)
    return None if hours is None else job.created_at + timedelta(hours=hours)


def _eta(status: Mapping[str, Any], now: datetime) -> datetime | None:
    """When the job finishes at the planner's expected steps/s where it runs now (None: not
    running, or its work or rate unknown)."""
    prog = status["progress"]
    rate, work = prog["steps_per_s_expected"], prog["work_steps"]
    if not rate or work is None:
        return None
    return now + timedelta(seconds=max(work - prog["steps"], 0.0) / rate)


def fleet(db: Database, now: datetime) -> dict[str, Any]:
    """The fleet page: every job with its state, $/h now, spend against budget, ETA against
    deadline and open moves; totals and jobs by state."""
    rows = []
    with db.session() as session:
        for job in session.scalars(select(ManagedJob).order_by(ManagedJob.id)):
            status = job_status.job_status(session, job, job_spec(job), now)
            place = status["placement"]
            deadline, eta = _deadline(job), _eta(status, now)
            rows.append(
                {
                    "name": job.name,
                    "state": job.state,
                    "usd_per_hour": None if place is None else place["usd_per_hour"],
                    "market": None if place is None else place["market"],
                    "spent_usd": status["spent_usd"],
                    "budget_usd": job.budget_usd,
                    "budget_share": status["spent_usd"] / job.budget_usd if job.budget_usd else None,
                    "done_fraction": status["progress"]["done_fraction"],
                    "eta": eta,
                    "deadline": deadline,
                    "late": eta is not None and deadline is not None and eta > deadline,
                    "open_moves": sum(1 for m in status["moves"] if m["outcome"] is None),
                }
            )
    counts = Counter(r["state"] for r in rows)
    return {
        "now": now,
        "jobs": rows,
        "by_state": [(s, counts[s]) for s in JOB_STATES if counts[s]],
        "usd_per_hour": sum(r["usd_per_hour"] or 0.0 for r in rows),
        "spent_usd": sum(r["spent_usd"] for r in rows),
        "budget_usd": sum(r["budget_usd"] for r in rows),
        "open_moves": sum(r["open_moves"] for r in rows),
    }


def job(db: Database, name: str, now: datetime, state_dir: Path | None = None) -> dict[str, Any]:
    """The job page: ``jobs show`` and ``jobs cost`` for one job, why it failed (first), its
    timeline, its progress and its cost over time, and the tail of its log (the local provider's
    in ``state_dir``). Raises ``InputError`` (``find_job``'s) for an unknown name."""
    job_row, status, events = job_status.show(db, name, now)
    _, intervals = job_status.ledger(db, name, now)
    with db.session() as session:
        ended = session.execute(
            select(Placement.ended_at, Placement.end_reason, Placement.epoch, Placement.market_id)
            .where(Placement.job_id == job_row.id, Placement.end_reason.in_(PREEMPTION_ENDS))
            .order_by(Placement.ended_at)
        ).all()
        preempted = [
            (at, reason, epoch, market_label(ledger.market_key(session, market_id)))
            for at, reason, epoch, market_id in ended
        ]
        progress = progress_points(session, job_row)
    timeline: list[dict[str, Any]] = [
        {"at": e.at, "kind": "state", "what": f"{e.from_state or '–'} → {e.to_state}", "detail": e.reason}
        for e in events
    ]
    for m in status["moves"]:
        where = f"{m['from_market'] or '–'} → {m['to_market'] or '–'}"
        timeline.append({"at": m["created_at"], "kind": m["kind"], "what": where, "detail": m["reason"]})
        if m["finished_at"] is not None:
            ckpt = f", from checkpoint step {m['checkpoint_step']:,}" if m["checkpoint_step"] else ""
            timeline.append(
                {
                    "at": m["finished_at"],
                    "kind": f"{m['kind']} {m['outcome']}",
                    "what": where,
                    "detail": f"move {m['id']}{ckpt}",
                }
            )
    for at, reason, epoch, where in preempted:
        timeline.append({"at": at, "kind": "preemption", "what": where, "detail": f"{reason}, epoch {epoch}"})
    timeline.sort(key=lambda row: row["at"])
    return {
        "now": now,
        "job": job_row,
        "failure": _failure(job_row, events),
        "log": _log_tail(db, name, state_dir),
        "status": status,
        "throughput": None
        if status["throughput"] is None
        else job_status.throughput_words(status["throughput"]),
        "deadline": _deadline(job_row),
        "eta": _eta(status, now),
        "intervals": intervals,
        "ledger": _ledger_rows(intervals),
        "total_usd": ledger.total_usd(intervals),
        "egress_usd": ledger.egress_usd(intervals),
        "timeline": timeline,
        "cost_chart": _cost_series(intervals, now),
        "progress_chart": _progress_series(progress, status["progress"]["work_steps"]),
    }


def _ledger_rows(intervals: list[ledger.Interval]) -> dict[str, Any]:
    """The ledger's money as ``jobs cost`` shows it: each interval's cost and egress and the
    total and egress total, rounded together so that the cells shown add up to the total shown."""
    money, places = usd_summed([*(r.cost_usd for r in intervals), *(r.egress_usd for r in intervals)])
    costs, egress = money[: len(intervals)], money[len(intervals) :]
    return {
        "rows": [
            (row, usd(cost, places), usd(moved, places))
            for row, cost, moved in zip(intervals, costs, egress, strict=True)
        ],
        "total": usd(sum(money), places),
        "egress": usd(sum(egress), places),
    }


def _failure(job_row: ManagedJob, events: list[JobEvent]) -> JobEvent | None:
    """The transition into the job's failed state (its reason), None unless it failed."""
    if job_row.state not in FAILED_STATES:
        return None
    return next((e for e in reversed(events) if e.to_state == job_row.state), None)


def _log_tail(db: Database, name: str, state_dir: Path | None) -> dict[str, Any]:
    """The end of the newest placement's log (``jobs logs``), at most ``LOG_TAIL_BYTES``:
    ``text`` (None when there is none to read here) and ``note``, what the reader should know."""
    placement = job_status.newest_placement(db, name)
    if placement is None or placement.instance_id is None:
        return {"text": None, "note": "not launched yet: no log"}
    if placement.provider != "local":
        return {
            "text": None,
            "note": f"runs on {placement.provider} ({placement.instance_id}): its output is in that "
            "instance's serial console, not on this machine",
        }
    # The provider makes its directory when missing: only one that exists is read (nothing written).
    if state_dir is None or not (state_dir / "instances").is_dir():
        return {
            "text": None,
            "note": f"no local provider directory {state_dir}: give `spotopt ui --state-dir` the one the "
            "daemon runs with",
        }
    path = LocalProvider(state_dir).log_path(placement.instance_id)
    if not path.is_file():
        return {
            "text": None,
            "note": f"no log of {placement.instance_id} in {state_dir}: give `spotopt ui --state-dir` "
            "the directory the daemon runs with",
        }
    size = path.stat().st_size
    with path.open("rb") as f:
        f.seek(max(size - LOG_TAIL_BYTES, 0))
        text = f.read().decode(errors="replace")
    cut = size > LOG_TAIL_BYTES
    if cut:
        text = text.partition("\n")[2]  # from the first whole line
    shown = f"the last {LOG_TAIL_BYTES // 1024} KiB of " if cut else ""
    return {
        "text": text,
        "note": f"{shown}{path} ({size:,} bytes); `spotopt jobs logs {name}` prints it all"
        if text
        else f"{path} is empty: the job has written nothing yet",
    }


def _progress_series(points: list[tuple[datetime, int]], work_steps: float | None) -> dict[str, Any]:
    """Steps done over time (``spotopt.mover.progress``) and, where the job says, its total work
    as a flat line to reach; seconds since the epoch on x."""
    xs = [at.timestamp() for at, _ in points]
    series: list[dict[str, Any]] = [{"label": "steps done", "y": [steps for _, steps in points]}]
    if work_steps:
        series.append({"label": "work (steps)", "y": [work_steps] * len(xs)})
    return {"x": xs, "series": series}


def _cost_series(intervals: list[ledger.Interval], now: datetime) -> dict[str, Any]:
    """Cumulative spend over time: a point where each interval starts and ends (egress billed at
    its start), for a line chart; seconds since the epoch on x."""
    xs: list[float] = []
    ys: list[float] = []
    total = 0.0
    for row in sorted(intervals, key=lambda r: r.started_at):
        total += row.egress_usd
        xs.append(row.started_at.timestamp())
        ys.append(total)
        total += row.cost_usd
        xs.append((row.ended_at or now).timestamp())
        ys.append(total)
    return {"x": xs, "series": [{"label": "spent (USD)", "y": ys}]}


def _window(span: tuple[datetime, datetime] | None) -> tuple[datetime, datetime] | None:
    """The last ``WINDOW`` of ``span`` (first, last), ``last`` included (None: no span)."""
    if span is None:
        return None
    first, last = span
    return max(first, last - WINDOW), last + timedelta(seconds=1)


def _capacity_span(session: Session) -> tuple[datetime, datetime] | None:
    """The first and last capacity observation (None: none yet)."""
    first, last = session.execute(
        select(func.min(CapacityObservation.observed_at), func.max(CapacityObservation.observed_at))
    ).one()
    return None if first is None or last is None else (first, last)


def gpu_models(db: Database) -> list[str]:
    """GPU models with a collected or imported price, for the markets page's picker."""
    with db.session() as session:
        found = session.scalars(
            select(InstanceType.gpu_model)
            .join(Market, Market.instance_type_id == InstanceType.id)
            .join(PricePoint, PricePoint.market_id == Market.id)
            .where(InstanceType.gpu_model.is_not(None), PricePoint.source != CATALOG_SOURCE)
            .distinct()
        ).all()
    return sorted(g for g in found if g is not None)


def _report(db: Database, name: str, given: dict[str, str], now: datetime) -> ReportResult:
    report = REPORTS.lookup(name)
    args = report.parse(given, now)
    with db.session() as session:
        return report.run(session, args)


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows for a template: NaN as None, region-wide zones (``''``) as None."""
    records = frame.astype(object).where(frame.notna(), None).to_dict(orient="records")
    out = [{str(k): v for k, v in row.items()} for row in records]
    for row in out:
        if row.get("zone") == "":
            row["zone"] = None
    return out


def markets(db: Database, gpu: str | None, now: datetime) -> dict[str, Any]:
    """The markets page for one GPU model: every market's price now with its age (cheapest first,
    the stale after the fresh), the spot discount over the window, and each market's $/GPU-hour
    over the window as a chart whose time axis is the window."""
    models = gpu_models(db)
    with db.session() as session:
        window = _window(history_span(session))
    if gpu is not None and gpu not in models:
        raise InputError(f"gpu {gpu!r}: no collected price; pick one of {', '.join(models) or 'none'}")
    gpu = gpu or (models[0] if models else None)
    page: dict[str, Any] = {
        "gpu": gpu,
        "gpus": models,
        "window": window,
        "board": [],
        "discount": [],
        "now": now,
        "max_age_days": Settings().price_max_age_days,
    }
    if gpu is None or window is None:
        return page | {"chart": None}
    since, until = window
    at = {"gpu": gpu, "at": now.isoformat()}  # "cheapest now": each price's age is its age now
    span = {"gpu": gpu, "since": since.isoformat(), "until": until.isoformat()}
    board = _report(db, "price-board", at, now).sections["price-board"]
    discount = _report(db, "spot-discount", span, now).sections["spot-discount"]
    page["board"] = _records(board)
    page["discount"] = _records(discount)
    with db.session() as session:
        found = session.execute(markets_stmt({"gpu": gpu})).mappings()
        ids = {tuple(row[c] for c in _MARKET_KEY): int(row["market_id"]) for row in found}
    cheapest = board.head(CHART_MARKETS).itertuples(index=False)
    chart_ids = [ids[tuple(getattr(row, c) for c in _MARKET_KEY)] for row in cheapest]
    page["chart"] = _price_series(db, chart_ids, since, until)
    return page


_MARKET_KEY = ("cloud", "region", "zone", "instance_type", "market")
"""The columns that name a market in a report's rows (the reports leave out its id)."""


def _price_series(db: Database, market_ids: list[int], since: datetime, until: datetime) -> dict[str, Any]:
    """Each market with a collected price in the window: its $/GPU-hour as a step series on one
    time axis from ``since`` to ``until`` (a price holds until the next point: the one in effect
    at ``since`` starts the line, the last one holds to ``until``), None before a market's first
    price; ``range`` is the window, the axis drawn whatever the points (one point alone would
    make the chart's own scale span years)."""
    with db.session() as session:
        rows = session.execute(
            select(
                PricePoint.market_id, PricePoint.observed_at, PricePoint.usd_per_hour, InstanceType.gpu_count
            )
            .join(Market, Market.id == PricePoint.market_id)
            .join(InstanceType, InstanceType.id == Market.instance_type_id)
            .where(
                PricePoint.market_id.in_(market_ids),
                PricePoint.observed_at >= since,
                PricePoint.observed_at < until,
                PricePoint.source != CATALOG_SOURCE,
            )
            .order_by(PricePoint.observed_at, PricePoint.source)
        ).all()
        drawn = list(dict.fromkeys(m for m in market_ids if any(r[0] == m for r in rows)))
        before = {m: _price_before(session, m, since) for m in drawn}
        labels = {m: market_label(ledger.market_key(session, m)) for m in drawn}
    times = sorted({since.timestamp(), until.timestamp()} | {at.timestamp() for _, at, _, _ in rows})
    index = {t: i for i, t in enumerate(times)}
    series: dict[int, list[float | None]] = {m: [None] * len(times) for m in drawn}
    for m in drawn:
        series[m][0] = before[m]
    for market_id, at, per_hour, gpus in rows:
        series[market_id][index[at.timestamp()]] = per_hour / (gpus or 1)
    for values in series.values():  # carry each price forward: a point holds until the next
        for i in range(1, len(values)):
            if values[i] is None:
                values[i] = values[i - 1]
    return {
        "x": times,
        "range": [since.timestamp(), until.timestamp()],
        "series": [{"label": labels[m], "y": series[m]} for m in drawn],
    }


def _price_before(session: Session, market_id: int, since: datetime) -> float | None:
    """The market's collected $/GPU-hour in effect just before ``since`` (None: none yet)."""
    found = session.execute(
        select(PricePoint.usd_per_hour, InstanceType.gpu_count)
        .join(Market, Market.id == PricePoint.market_id)
        .join(InstanceType, InstanceType.id == Market.instance_type_id)
        .where(
            PricePoint.market_id == market_id,
            PricePoint.observed_at < since,
            PricePoint.source != CATALOG_SOURCE,
        )
        .order_by(PricePoint.observed_at.desc(), PricePoint.source)
        .limit(1)
    ).first()
    return None if found is None else found[0] / (found[1] or 1)


def availability(db: Database, now: datetime) -> dict[str, Any]:
    """The availability page: the ``availability`` report over the window (share of time each
    spot market had capacity, its outages) and its heatmap over time, over the last 30 days of
    observations, with the report's notes (a market not observed in the window shows the state
    it was last seen in, however old: the page says so, as the report does on stderr)."""
    with db.session() as session:
        window = _window(_capacity_span(session))
    if window is None:
        return {"window": None, "markets": [], "outages": [], "heatmap": None, "notes": []}
    since, until = window
    result = _report(db, "availability", {"since": since.isoformat(), "until": until.isoformat()}, now)
    return {
        "window": window,
        "markets": _records(result.sections["markets"]),
        "outages": _records(result.sections["outages"]),
        "heatmap": _availability_heatmap(result.sections, since, until),
        "notes": result.notes,
    }


def _availability_heatmap(
    sections: Mapping[str, pd.DataFrame], since: datetime, until: datetime
) -> dict[str, Any]:
    """The least available markets' share of each time column available (the report's
    ``--plot`` heatmap, ``HEATMAP_COLUMNS`` wide): rows of a label and per column a share, None
    before the market's first observation."""
    labels, shares = heatmap(sections, dt_us(since), dt_us(until), CHART_MARKETS, HEATMAP_COLUMNS)
    step = (until - since) / HEATMAP_COLUMNS
    return {
        "columns": [(since + i * step, since + (i + 1) * step) for i in range(HEATMAP_COLUMNS)],
        "rows": [
            {"label": label, "cells": [None if math.isnan(v) else float(v) for v in row]}
            for label, row in zip(labels, shares, strict=True)
        ],
    }


def whatif_runs(db: Database) -> list[WhatifRun]:
    """The stored replays, newest first."""
    with db.session() as session:
        found = session.scalars(select(WhatifRun).order_by(WhatifRun.saved_at.desc(), WhatifRun.id.desc()))
        return list(found)


def whatif(db: Database, name: str) -> dict[str, Any]:
    """One stored replay: its strategies side by side per job, and where each job ran."""
    with db.session() as session:
        run = session.scalar(select(WhatifRun).where(WhatifRun.name == name))
        if run is None:
            raise InputError(f"what-if {name!r}: no stored replay of that name; `spotopt whatif --save NAME`")
        results = session.scalars(
            select(WhatifResult).where(WhatifResult.run_id == run.id).order_by(WhatifResult.id)
        ).all()
        placed = session.scalars(
            select(WhatifPlacement)
            .where(WhatifPlacement.run_id == run.id)
            .order_by(WhatifPlacement.job, WhatifPlacement.strategy, WhatifPlacement.from_at)
        ).all()
    strategies = list(dict.fromkeys(r.strategy for r in results))
    by_job: dict[str, dict[str, WhatifResult]] = {}
    for r in results:
        by_job.setdefault(r.job, {})[r.strategy] = r
    return {
        "run": run,
        "run_notes": json.loads(run.notes),
        "strategies": strategies,
        "jobs": by_job,
        "placements": placed,
    }
