"""``spotopt throughput``: the steps/s figures the planner uses (measured, imported, estimated)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spotopt.cli.common import FormatOption, state
from spotopt.history.throughput_store import import_rows, list_rows, read_file
from spotopt.render import Format, render

app = typer.Typer(no_args_is_help=True, help="Training throughputs per workload × GPU model × GPU count.")


@app.command("import")
def import_(
    ctx: typer.Context,
    file: Annotated[
        Path, typer.Argument(help="CSV or JSON: workload,gpu_model,gpu_count,steps_per_s[,source,note]")
    ],
) -> None:
    """Import throughput figures (idempotent; a bad row aborts the import and changes nothing)."""
    rows = read_file(file)
    with state(ctx).db().session() as session:
        inserted, updated = import_rows(session, rows)
    typer.echo(f"{file}: {len(rows)} rows, {inserted} new, {updated} updated")


@app.command("list")
def list_(
    ctx: typer.Context,
    workload: Annotated[str | None, typer.Option(help="Only this workload.")] = None,
    fmt: FormatOption = Format.TABLE,
) -> None:
    """List stored throughputs."""
    with state(ctx).db().session() as session:
        rows = list_rows(session, workload)
    render(rows, fmt, title="Throughputs (steps/s)")
