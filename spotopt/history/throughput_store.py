"""The ``throughputs`` table: measured, imported and estimated steps/s per workload × GPU model × count.

Import files are CSV (header ``workload,gpu_model,gpu_count,steps_per_s[,source][,note]``) or JSON
(a list of objects with the same keys). ``source`` defaults to ``imported``. Re-importing the
same file changes nothing; a new value for an existing (workload, GPU, count, source) replaces
the old one. A bad row aborts the whole import with its line (or item) and field.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from spotopt.db.models import Throughput
from spotopt.errors import InputError
from spotopt.files import check_text, iter_csv_rows, read_text
from spotopt.jobspec import MAX_STEPS_PER_S, MIN_STEPS_PER_S, gpu_key
from spotopt.throughput import StoredFigure

log = logging.getLogger("spotopt")

SOURCES = ("measured", "imported", "estimated")
REQUIRED = ("workload", "gpu_model", "gpu_count", "steps_per_s")


def read_file(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a CSV or JSON throughput file, validated; errors name the row and the field.

    Rows are located as ``spotopt import`` locates them: ``line N`` of a CSV file (the header
    is line 1), ``[i]`` of a JSON list.
    """
    path = Path(path)
    if path.suffix.lower() != ".json":
        return [validate_row(f"{path}: line {line}", r) for line, r in iter_csv_rows(path, REQUIRED)]
    try:
        raw = json.loads(read_text(path, "the throughput file"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise InputError(f"{path}: expected a JSON list of objects with keys {', '.join(REQUIRED)}")
    return [validate_row(f"{path}: [{i}]", r) for i, r in enumerate(raw)]


def validate_row(where: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """One throughput figure checked and canonicalised (GPU model spelling, whole GPU count,
    finite steps/s > 0); an ``InputError`` names ``where`` and the field."""
    for key in REQUIRED:
        if raw.get(key) in (None, ""):
            raise InputError(f"{where}: {key} is required (columns: {', '.join(REQUIRED)}[, source, note])")
    try:
        gpu = gpu_key(str(raw["gpu_model"]).strip())
    except ValueError as exc:
        raise InputError(f"{where}: gpu_model: {exc}") from None
    count = _gpu_count(raw["gpu_count"], where)
    tput = _steps_per_s(raw["steps_per_s"], where)
    source = str(raw.get("source") or "imported").strip()
    if source not in SOURCES:
        raise InputError(f"{where}: source {source!r} is not one of {', '.join(SOURCES)}")
    note = raw.get("note")
    return {
        "workload": check_text(str(raw["workload"]).strip(), f"{where}: workload"),
        "gpu_model": gpu,
        "gpu_count": count,
        "steps_per_s": tput,
        "source": source,
        "note": check_text(str(note), f"{where}: note") if note not in (None, "") else None,
    }


def _number(value: Any) -> float | None:
    """``value`` as a float if it is a number or a numeric string (a JSON ``true`` is not)."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _gpu_count(value: Any, where: str) -> int:
    """A whole number of GPUs >= 1; ``1.5`` is refused rather than truncated to 1."""
    number = _number(value)
    if number is None or not math.isfinite(number) or not number.is_integer() or number < 1:
        raise InputError(
            f"{where}: gpu_count {value!r} is not a whole number >= 1 (GPUs per instance, e.g. 8)"
        )
    return int(number)


def _steps_per_s(value: Any, where: str) -> float:
    """A throughput within the job spec's bounds: ``inf``, ``nan`` or 1e308 would make every
    placement look free, 1e-300 would make its cost overflow, and either kind of figure stopped
    every job's decision, not only this workload's."""
    number = _number(value)
    if number is None or not math.isfinite(number) or not MIN_STEPS_PER_S <= number <= MAX_STEPS_PER_S:
        raise InputError(
            f"{where}: steps_per_s {value!r} is not a number from {MIN_STEPS_PER_S:g} to "
            f"{MAX_STEPS_PER_S:g} (training steps per second)"
        )
    return number


def import_rows(session: Session, rows: list[dict[str, Any]], now: datetime | None = None) -> tuple[int, int]:
    """Upsert rows inside the caller's transaction; returns (inserted, updated)."""
    now = now or datetime.now(UTC)
    existing = {
        (t.workload, t.gpu_model, t.gpu_count, t.source): t for t in session.scalars(select(Throughput))
    }
    inserted = updated = 0
    for row in rows:
        key = (row["workload"], row["gpu_model"], row["gpu_count"], row["source"])
        found = existing.get(key)
        if found is None:
            found = Throughput(**row, recorded_at=now)
            session.add(found)
            existing[key] = found
            inserted += 1
        elif found.steps_per_s != row["steps_per_s"] or found.note != row["note"]:
            found.steps_per_s, found.note, found.recorded_at = row["steps_per_s"], row["note"], now
            updated += 1
    session.flush()
    return inserted, updated


def list_rows(session: Session, workload: str | None = None) -> list[dict[str, Any]]:
    stmt = select(Throughput).order_by(Throughput.workload, Throughput.gpu_model, Throughput.gpu_count)
    if workload:
        stmt = stmt.where(Throughput.workload == workload)
    return [
        {
            "workload": t.workload,
            "gpu_model": t.gpu_model,
            "gpu_count": t.gpu_count,
            "steps_per_s": t.steps_per_s,
            "source": t.source,
            "recorded_at": t.recorded_at,
            "note": t.note,
        }
        for t in session.scalars(stmt)
    ]


def stored_figures(session: Session) -> list[StoredFigure]:
    """Every stored figure within the import's bounds, for ``JobThroughput`` (the reference
    workloads are all of them). A figure stored before the import refused such values (1e308,
    1e-300) is left out with a warning naming it: as a reference it would overflow the estimates
    of every job, not only its own workload's."""
    figures = []
    for t in session.scalars(select(Throughput)):
        if not MIN_STEPS_PER_S <= t.steps_per_s <= MAX_STEPS_PER_S:
            log.warning(
                "throughput %s on %d x %s (%s): steps_per_s %r is outside %g..%g and is ignored; "
                "import a corrected figure with `spotopt throughput import`",
                t.workload,
                t.gpu_count,
                t.gpu_model,
                t.source,
                t.steps_per_s,
                MIN_STEPS_PER_S,
                MAX_STEPS_PER_S,
            )
            continue
        figures.append(StoredFigure(t.workload, t.gpu_model, t.gpu_count, t.steps_per_s, t.source))
    return figures
