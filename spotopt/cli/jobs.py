"""``spotopt jobs``: submit, list, show, cost, budget and cancel the jobs the mover manages."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from spotopt.cli.common import FormatOption, WideOption, state
from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import JobEvent, ManagedJob, Placement
from spotopt.errors import InputError
from spotopt.jobspec import load_jobs
from spotopt.mover import jobs, ledger
from spotopt.mover import status as job_status
from spotopt.mover.ledger import Interval
from spotopt.render import Format, iso, render, say, to_json, usd, usd_summed

app = typer.Typer(no_args_is_help=True, help="Jobs the mover runs, moves and stops within budget.")

LIST_COLUMNS = (
    "name",
    "state",
    "budget_usd",
    "max_usd_per_hour",
    "checkpoint_uri",
    "run_command",
    "created_at",
    "updated_at",
)

_EVENT_COLUMNS = ("at", "from_state", "to_state", "reason")


def _row(job: ManagedJob) -> dict[str, Any]:
    return {column: getattr(job, column) for column in LIST_COLUMNS}


def _list_cells(row: dict[str, Any]) -> dict[str, Any]:
    """A job for the ``jobs list`` table: money as money, times to the minute (the run command
    is cut to the screen's width; CSV, JSON and ``jobs show`` keep it whole)."""
    cap = row["max_usd_per_hour"]
    return row | {
        "budget_usd": usd(row["budget_usd"]),
        "max_usd_per_hour": None if cap is None else f"{usd(cap)}/h",
        "created_at": _minute(row["created_at"]),
        "updated_at": _minute(row["updated_at"]),
    }


def _event(event: JobEvent) -> dict[str, Any]:
    return {
        "at": event.at,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
    }


def _details(job: ManagedJob, status: dict[str, Any], history: list[JobEvent]) -> dict[str, Any]:
    """What ``jobs show --format json`` prints: the spec's essentials, the job's live status
    (``spotopt.mover.status.job_status``) and every transition."""
    spec = jobs.job_spec(job)
    low, high = spec.gpu_range
    return {
        "name": job.name,
        "state": job.state,
        "run": job.run_command,
        "workdir": job.workdir,
        "checkpoint": spec.checkpoint.model_dump(mode="json") if spec.checkpoint else None,
        "budget_usd": job.budget_usd,
        "max_usd_per_hour": job.max_usd_per_hour,
        "gpus": {"min": low, "max": high},
        "work": spec.work.model_dump(mode="json", exclude_none=True),
        "deadline": spec.model_dump(mode="json")["deadline"],
        "allow": spec.allow.model_dump(mode="json"),
        "spec_sha256": job.spec_sha256,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        **status,
        "events": [_event(e) for e in history],
    }


def _cell(value: Any) -> Any:
    """One value of the key/value table: nested fields as one line of JSON (empty: None)."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(", ", ": ")) if value else None
    return iso(value) if isinstance(value, datetime) else value


def _summary(d: dict[str, Any]) -> list[dict[str, Any]]:
    """The key/value rows of the ``jobs show`` table: a sentence per concern, not raw JSON."""
    place, prog, ckpt = d["placement"], d["progress"], d["checkpoint_verified"]
    if place is None:
        where, instance = "not placed", "–"
    else:
        where = f"{_where(place['market'])} ({place['gpus']} GPU{'s' if place['gpus'] != 1 else ''})"
        started = f"{place['started_at']:%Y-%m-%d %H:%M}" if place["started_at"] else "not started"
        instance = (
            f"{place['provider']} {place['instance_id'] or '(no id yet)'}, epoch {place['epoch']}, "
            f"{place['state']} since {started}, {usd(place['usd_per_hour'])}/h"
        )
    work = prog["work_steps"]
    done = f"{prog['steps']:,} of {work:,.0f} steps" if work else f"{prog['steps']:,} steps (work unknown)"
    if prog["done_fraction"] is not None:
        done += f" ({prog['done_fraction']:.0%})"
    measured, expected = prog["steps_per_s_measured"], "– expected"
    if d["throughput"] is not None:  # an estimate marked as such (issue 37)
        number, source = job_status.throughput_words(d["throughput"])
        expected = f"{number} expected ({source})"
    rate = f"{'–' if measured is None else f'{measured:.3g}'} measured, {expected}"
    cap = f", at most {usd(d['max_usd_per_hour'])}/h" if d["max_usd_per_hour"] is not None else ""
    outcomes = Counter(m["outcome"] or "open" for m in d["moves"])
    rows = {
        "state": d["state"],
        "where": where,
        "instance": instance,
        "progress": done,
        "steps/s": rate,
        "last verified checkpoint": "none yet" if ckpt is None else f"{ckpt['name']} (step {ckpt['step']:,})",
        "spent": f"{usd(d['spent_usd'])} of {usd(d['budget_usd'])} budget{cap}",
        "expected cost to finish": usd(d["expected_cost_to_finish_usd"]),
        "moves": f"{len(d['moves'])}"
        + (f" ({', '.join(f'{n} {o}' for o, n in sorted(outcomes.items()))})" if outcomes else ""),
        "preemptions": str(d["preemptions"]),
        "run": d["run"],
        "workdir": d["workdir"] or "–",
        "checkpoint": _cell(d["checkpoint"]),
        "gpus": _cell(d["gpus"]),
        "work": _cell(d["work"]),
        "deadline": d["deadline"] or "–",
        "allow": _cell({k: v for k, v in d["allow"].items() if v}) or "anywhere",
        "spec sha256": d["spec_sha256"][:16],
        "submitted": f"{d['created_at']:%Y-%m-%d %H:%M:%S} UTC",
        "updated": f"{d['updated_at']:%Y-%m-%d %H:%M:%S} UTC",
    }
    return [{"field": k, "value": v} for k, v in rows.items()]


def _where(label: str | None) -> str | None:
    """A market for a table cell: ``aws us-east-1a p3.2xlarge spot`` (the zone, or the region
    where there is none), spaced so a narrow table wraps between its parts, not inside them."""
    if label is None:
        return None
    cloud, region, zone, instance_type, kind = label.split("/")
    return f"{cloud} {region if zone == '-' else zone} {instance_type} {kind}"


def _minute(value: datetime | None) -> datetime | None:
    """A time for a table cell, to the minute (JSON and CSV keep full precision)."""
    return None if value is None else value.replace(second=0, microsecond=0)


def _move_row(move: dict[str, Any]) -> dict[str, str]:
    """A move as two table cells (when and what | where, money and why): readable at 80 columns
    however long the market names and reasons are."""
    when = f"{move['created_at']:%Y-%m-%d %H:%M}"
    outcome = move["outcome"] or f"open, at {move['step']}"
    target = f"{_where(move['from_market']) or '–'} → {_where(move['to_market']) or '–'}"
    money = f"expected cost {usd(move['cost_usd'])}, saving {usd(move['saving_usd'])}"
    return {
        "move": f"{when}\n{move['kind']}: {outcome}",
        "where, cost and why": f"{target}\n{money}\n{move['reason']}",
    }


@app.command("submit")
def submit(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="Job spec (YAML) with one job: run, checkpoint, budget_usd.")],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Validate and check the name; store nothing.")
    ] = False,
) -> None:
    """Submit one job to the mover (pending until the daemon launches it). Re-submitting an
    identical spec is a no-op; another spec under the same name is refused."""
    load_jobs(file)  # a missing or invalid file is refused before a database is opened (or made)
    job = jobs.submit(state(ctx).db(), file, dry_run=dry_run)
    if job.state in ("failed", "cancelled"):
        say(f"{job.name}: {job.state} (already submitted); `spotopt jobs retry {job.name}` resumes it")
    elif dry_run:
        say(f"{job.name}: valid; would be stored as {job.state} (dry run, nothing stored)")
    else:
        say(
            f"{job.name}: {job.state} (submitted {iso(job.created_at)}, spec sha256 {job.spec_sha256[:12]}, "
            f"budget {usd(job.budget_usd)})"
        )


@app.command("list")
def list_(
    ctx: typer.Context,
    states: Annotated[
        list[str] | None, typer.Option("--state", help="Only jobs in this state (repeatable).")
    ] = None,
    fmt: FormatOption = Format.TABLE,
    wide: WideOption = False,
) -> None:
    """Managed jobs, oldest first."""
    found = jobs.list_jobs(state(ctx).db(), tuple(states or ()))
    table = fmt is Format.TABLE
    render(
        [_list_cells(_row(j)) if table else _row(j) for j in found],
        fmt,
        title="Managed jobs",
        columns=LIST_COLUMNS,
        empty="none submitted; `spotopt jobs submit JOB.yaml` adds one",
        wide_only=("max_usd_per_hour", "checkpoint_uri", "created_at"),
        wide=wide,
        clip=("run_command",),
    )


@app.command("show")
def show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The job's name.")],
    fmt: FormatOption = Format.TABLE,
) -> None:
    """Where a job stands: state, placement, progress, moves, spend, cost to finish.

    Also its last verified checkpoint, preemptions and every state transition (CSV: the
    transitions, one row each)."""
    job, status, history = job_status.show(state(ctx).db(), name, datetime.now(UTC))
    details = _details(job, status, history)
    if fmt is Format.JSON:
        sys.stdout.write(to_json(details) + "\n")
    elif fmt is Format.CSV:
        render([{"job": job.name, **e} for e in details["events"]], fmt, columns=("job", *_EVENT_COLUMNS))
    else:
        render(_summary(details), fmt, title=f"Job {job.name}")
        if details["moves"]:
            render([_move_row(m) for m in details["moves"]], fmt, title="Moves")
        render(details["events"], fmt, title="State transitions", columns=_EVENT_COLUMNS)


COST_COLUMNS = (
    "placement_id",
    "epoch",
    "provider",
    "instance_id",
    "market",
    "started_at",
    "ended_at",
    "end_reason",
    "usd_per_hour",
    "billed_s",
    "cost_usd",
    "egress_from",
    "egress_to",
    "egress_gb",
    "egress_usd",
)
_COST_TABLE = (
    "#",
    "epoch",
    "provider",
    "instance_id",
    "market",
    "started",
    "ended",
    "end",
    "$/h",
    "billed_s",
    "$",
    "egress_gb",
    "egress $",
)


def _interval_row(row: Interval) -> dict[str, Any]:
    """One ledger row; ``end_reason`` says ``running`` while the instance runs (``ended_at`` empty)."""
    fields = {column: getattr(row, column) for column in COST_COLUMNS}
    return fields | {"end_reason": row.end_reason or ("running" if row.ended_at is None else None)}


def _interval_cells(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], str, str]:
    """The ledger rows for the table (short headers, short market, times to the minute: fits 80
    columns; CSV and JSON keep every field at full precision), with the total and the egress
    total as shown: the money cells, instance time and egress, add up to the total exactly
    (``usd_summed``)."""
    money, places = usd_summed([r["cost_usd"] for r in rows] + [r["egress_usd"] for r in rows])
    costs, egress = money[: len(rows)], money[len(rows) :]
    cells = [
        row
        | {
            "#": row["placement_id"],
            "market": _where(row["market"]),
            "started": _minute(row["started_at"]),
            "ended": _minute(row["ended_at"]),
            "end": row["end_reason"],
            "$/h": usd(row["usd_per_hour"]),
            "$": usd(cost, places),
            "egress $": usd(moved, places),
        }
        for row, cost, moved in zip(rows, costs, egress, strict=True)
    ]
    return cells, usd(sum(money), places), usd(sum(egress), places)


@app.command("cost")
def cost(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The job's name.")],
    fmt: FormatOption = Format.TABLE,
    wide: WideOption = False,
) -> None:
    """The ledger: every instance interval the job used and the total across moves.

    Per interval: its market, the price in effect, the seconds its cloud bills and the cost,
    and the data egress entering it caused (checkpoint and dataset moved between regions or
    clouds). Running instances are billed up to now."""
    now = datetime.now(UTC)
    job, rows = job_status.ledger(state(ctx).db(), name, now)
    total, egress = ledger.total_usd(rows), ledger.egress_usd(rows)
    listed = [_interval_row(r) for r in rows]
    if fmt is Format.JSON:
        doc = {
            "job": job.name,
            "at": now,
            "total_usd": total,
            "egress_usd": egress,
            "budget_usd": job.budget_usd,
        }
        doc["intervals"] = listed
        sys.stdout.write(to_json(doc) + "\n")
        return
    table = fmt is Format.TABLE
    cells, shown_total, shown_egress = _interval_cells(listed)
    render(
        cells if table else listed,
        fmt,
        title=f"Job {job.name}: {shown_total} over {len(rows)} instance interval(s) (egress {shown_egress})",
        columns=_COST_TABLE if table else COST_COLUMNS,
        caption=f"budget {usd(job.budget_usd)}; running instances billed up to {now:%Y-%m-%d %H:%M:%S} UTC",
        empty="no instance has run yet (nothing billed)",
        wide_only=("epoch", "provider", "instance_id", "egress_gb"),
        wide=wide,
    )


@app.command("budget")
def budget(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The job's name.")],
    new_usd: Annotated[
        float,
        typer.Argument(metavar="usd", help="The job's new total budget in USD (above its spend so far)."),
    ],
    max_usd_per_hour: Annotated[
        float | None, typer.Option("--max-usd-per-hour", help="Also set the spend-rate cap ($/h).")
    ] = None,
) -> None:
    """Raise (or set) a job's budget; an over-budget job goes back to pending.

    The daemon may then run it again. A budget at or below what the job has spent is refused
    (exit 2)."""
    change = jobs.set_budget(state(ctx).db(), name, new_usd, max_usd_per_hour)
    job = change.job
    cap = f", at most {usd(job.max_usd_per_hour)}/h" if job.max_usd_per_hour is not None else ""
    moved = f"; {change.from_state} -> {job.state}" if change.from_state != job.state else ""
    say(f"{job.name}: budget {usd(job.budget_usd)}{cap} ({usd(change.spent_usd)} spent){moved}")


@app.command("cancel")
def cancel(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The job's name.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why (recorded with the transition).")
    ] = "cancelled by the user",
    now: Annotated[
        bool,
        typer.Option(
            "--now", help="Terminate its instance at the daemon's next round without a checkpoint first."
        ),
    ] = False,
) -> None:
    """Cancel a job (recorded with its time and reason); a finished or cancelled job is an error.
    The daemon checkpoints and stops a running placement, or with --now terminates it at once;
    --now also halts a cancelled job whose checkpoint-and-stop is still under way."""
    job = jobs.cancel(state(ctx).db(), name, reason, at_once=now)
    say(f"{job.name}: cancelled ({jobs.AT_ONCE + reason if now else reason})")


@app.command("retry")
def retry(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The job's name.")],
) -> None:
    """Resume a failed or cancelled job from its newest verified checkpoint (pending until the
    daemon places it); its automatic retries count from zero again."""
    job = jobs.resume(state(ctx).db(), name)
    say(f"{job.name}: pending (resumes from {_resumes_from(job)})")


def _resumes_from(job: ManagedJob) -> str:
    checkpoint = job_status.resume_checkpoint(job)
    if checkpoint is None:
        return "the start: no verified checkpoint yet"
    return f"checkpoint {checkpoint.name}, step {checkpoint.step:,}"


@app.command("logs")
def logs(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The job's name.")],
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing what it writes until its placement ends.")
    ] = False,
    state_dir: Annotated[
        Path | None,
        typer.Option("--state-dir", help="The local provider's directory, as given to `spotopt daemon run`."),
    ] = None,
) -> None:
    """The output (stdout and stderr) of the job's newest placement, as the local provider keeps
    it; a cloud instance's output stays on the cloud (its serial console)."""
    from spotopt.cli.daemon import DEFAULT_STATE_DIR

    db = state(ctx).db()
    placement = job_status.newest_placement(db, name)
    if placement is None or placement.instance_id is None:
        raise InputError(f"NAME: job {name!r} has not been launched yet; no log")
    if placement.provider != "local":
        raise InputError(
            f"NAME: job {name!r} runs on {placement.provider} ({placement.instance_id}); its output is "
            "in that instance's serial console, not on this machine"
        )
    path = LocalProvider(state_dir or DEFAULT_STATE_DIR).log_path(placement.instance_id)
    if not path.exists():
        raise InputError(
            f"--state-dir: no log of {placement.instance_id} in {path.parent.parent.parent}; give the "
            "--state-dir the daemon runs with"
        )
    offset = _print_from(path, 0)
    if offset == 0:
        more = "; following it until its placement ends" if follow else ""
        say(f"{name}: the log of {placement.instance_id} is empty so far{more}", label="note:", err=True)
    while follow and _running(db, placement.id):
        time.sleep(FOLLOW_S)
        offset = _print_from(path, offset)
    if follow:
        _print_from(path, offset)


FOLLOW_S = 0.5


def _running(db: Database, placement_id: int) -> bool:
    with db.session() as session:
        found = session.get(Placement, placement_id)
        return found is not None and found.state in ("launching", "running")


def _print_from(path: Path, offset: int) -> int:
    """Copy ``path`` from byte ``offset`` to stdout; the new offset."""
    with path.open("rb") as f:
        f.seek(offset)
        chunk = f.read()
    sys.stdout.write(chunk.decode(errors="replace"))
    sys.stdout.flush()
    return offset + len(chunk)
