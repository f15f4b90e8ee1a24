"""Stored what-if replays (``spotopt whatif --save NAME``), read back by the dashboard."""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import select

from spotopt.db.engine import Database
from spotopt.db.models import WhatifPlacement, WhatifResult, WhatifRun
from spotopt.errors import InputError
from spotopt.whatif.preemptions import PreemptionMode
from spotopt.whatif.replay import ReplayResult

NAME_LIMIT = 200


def check_name(db: Database, name: str) -> None:
    """Refuse a blank, too long or taken name before the replay runs (it may take minutes)."""
    if not name.strip() or len(name) > NAME_LIMIT:
        raise InputError(f"--save {name!r}: give a name of 1 to {NAME_LIMIT} characters")
    with db.session() as session:
        if session.scalar(select(WhatifRun.id).where(WhatifRun.name == name)) is not None:
            raise InputError(f"--save {name!r}: a replay of that name is stored; choose another name")


def save(db: Database, name: str, result: ReplayResult, saved_at: datetime) -> int:
    """Store ``result`` under ``name`` in one transaction; returns the run's id. The name's
    uniqueness is checked again by the database (two saves racing: one fails, nothing is half-written)."""
    check_name(db, name)
    req = result.request
    with db.session() as session:
        run = WhatifRun(
            name=name,
            saved_at=saved_at,
            synthetic=result.synthetic,
            first_start=result.first_start,
            starts=req.starts,
            every_hours=req.every_h,
            window_hours=result.window_hours,
            preemptions=req.preemptions.value,
            seed=req.seed if req.preemptions is PreemptionMode.MODEL else None,
            billing=req.billing,
            notes=json.dumps(result.notes),
        )
        session.add(run)
        session.flush()
        session.add_all(
            WhatifResult(
                run_id=run.id,
                job=row["job"],
                strategy=row["strategy"],
                cost_usd=row["cost_usd"],
                bound_usd=row.get("bound_usd"),
                ratio_vs_spot=row["ratio_vs_spot"],
                finish_hours=row["finish_hours"],
                deadline_met=None if row["deadline_met"] is None else float(row["deadline_met"]),
                moves=row["moves"],
                preemptions=row["preemptions"],
                unfinished_starts=row["unfinished_starts"],
            )
            for row in result.rows
        )
        session.add_all(
            WhatifPlacement(
                run_id=run.id,
                job=p["job"],
                strategy=p["strategy"],
                from_at=p["from"],
                to_at=p["to"],
                cloud=p["cloud"],
                region=p["region"],
                zone=p["zone"] or None,
                instance_type=p["instance_type"],
                market=p["market"],
                gpu=p["gpu"],
                gpus=p["gpus"],
            )
            for p in result.placements()
        )
        return run.id
