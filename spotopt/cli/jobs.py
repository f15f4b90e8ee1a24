"""``spotopt jobs``: submit, list, show and cancel the jobs the mover manages."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from spotopt.cli.common import FormatOption, state
from spotopt.db.models import JobEvent, ManagedJob
from spotopt.mover import jobs
from spotopt.render import Format, iso, render, say, to_json

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


def _event(event: JobEvent) -> dict[str, Any]:
    return {
        "at": event.at,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "reason": event.reason,
    }


def _details(job: ManagedJob, history: list[JobEvent]) -> dict[str, Any]:
    """What ``jobs show --format json`` prints. Spend, moves and preemptions stay at their
    initial values until the executor records placements (issue 11, sections 2 and 3)."""
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
        "spent_usd": 0.0,
        "moves": [],
        "preemptions": 0,
        "events": [_event(e) for e in history],
    }


def _cell(value: Any) -> Any:
    """One value of the key/value table: nested fields as one line of JSON, times in ISO 8601."""
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(", ", ": "))
    return iso(value) if isinstance(value, datetime) else value


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
    job = jobs.submit(state(ctx).db(), file, dry_run=dry_run)
    if dry_run:
        say(f"{job.name}: valid; would be stored as {job.state} (dry run, nothing stored)")
    else:
        say(f"{job.name}: {job.state} (submitted {iso(job.created_at)}, spec sha256 {job.spec_sha256[:12]})")


@app.command("list")
def list_(
    ctx: typer.Context,
    states: Annotated[
        list[str] | None, typer.Option("--state", help="Only jobs in this state (repeatable).")
    ] = None,
    fmt: FormatOption = Format.TABLE,
) -> None:
    """Managed jobs, oldest first."""
    found = jobs.list_jobs(state(ctx).db(), tuple(states or ()))
    render(
        [_row(j) for j in found],
        fmt,
        title="Managed jobs",
        columns=LIST_COLUMNS,
        empty="none submitted; `spotopt jobs submit JOB.yaml` adds one",
    )


@app.command("show")
def show(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The job's name.")],
    fmt: FormatOption = Format.TABLE,
) -> None:
    """A job's state, the essentials of its spec and every state transition so far (CSV: the
    transitions, one row each)."""
    db = state(ctx).db()
    job = jobs.get_job(db, name)
    details = _details(job, jobs.events(db, name))
    if fmt is Format.JSON:
        sys.stdout.write(to_json(details) + "\n")
    elif fmt is Format.CSV:
        render([{"job": job.name, **e} for e in details["events"]], fmt, columns=("job", *_EVENT_COLUMNS))
    else:
        render(
            [{"field": k, "value": _cell(v)} for k, v in details.items() if k != "events"],
            fmt,
            title=f"Job {job.name}",
        )
        render(details["events"], fmt, title="State transitions", columns=_EVENT_COLUMNS)


@app.command("cancel")
def cancel(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The job's name.")],
    reason: Annotated[
        str, typer.Option("--reason", help="Why (recorded with the transition).")
    ] = "cancelled by the user",
) -> None:
    """Cancel a job (recorded with its time and reason); a finished or cancelled job is an error."""
    job = jobs.cancel(state(ctx).db(), name, reason)
    say(f"{job.name}: cancelled ({reason})")
