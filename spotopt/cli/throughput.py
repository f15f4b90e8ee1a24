"""``spotopt throughput``: the steps/s figures the planner uses (measured, imported, estimated)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spotopt.catalog import gpu_matches, gpu_models
from spotopt.cli.common import FormatOption, state
from spotopt.errors import InputError
from spotopt.history.throughput_store import import_rows, list_rows, read_file, stored_figures
from spotopt.jobspec import MAX_GPUS, gpu_key, load_jobs
from spotopt.render import Format, render
from spotopt.throughput import JobThroughput
from spotopt.throughput.scaling import default_topology

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


def _whole_numbers(option: str, text: str) -> list[int]:
    """``1,2,4,8`` as whole numbers from 1 to ``MAX_GPUS``; an ``InputError`` names the option."""
    out = []
    for part in text.split(","):
        value = part.strip()
        if not value.isdigit() or not 1 <= int(value) <= MAX_GPUS:
            raise InputError(
                f"{option}: {value!r} is not a whole number from 1 to {MAX_GPUS} (e.g. {option} 1,2,4,8)"
            )
        out.append(int(value))
    return sorted(set(out))


def _gpu_models(text: str | None) -> list[str]:
    """The exact GPU models ``--gpus`` names (a family stands for each of its models)."""
    if text is None:
        return sorted(gpu_models())
    models: list[str] = []
    for part in text.split(","):
        try:
            key = gpu_key(part.strip())
        except ValueError as exc:
            raise InputError(f"--gpus: {exc}") from None
        models += [g for g in sorted(gpu_models()) if gpu_matches(key, g) and g not in models]
    return models


@app.command("estimate")
def estimate(
    ctx: typer.Context,
    jobs_file: Annotated[Path, typer.Argument(metavar="JOBS.yaml", help="Job spec (docs/guides/plan.md).")],
    gpus: Annotated[
        str | None, typer.Option("--gpus", help="GPU models or families, comma-separated (default: all).")
    ] = None,
    counts: Annotated[str, typer.Option("--counts", help="GPU counts, comma-separated.")] = "1",
    nodes: Annotated[str, typer.Option("--nodes", help="Node counts, comma-separated.")] = "1",
    fmt: FormatOption = Format.TABLE,
) -> None:
    """Each job's steps/s per GPU model, GPU count and node count: known, or estimated with an
    80 % interval (low..high) and the reference workloads it came from."""
    spec = load_jobs(jobs_file)
    models = _gpu_models(gpus)
    gpu_counts, node_counts = _whole_numbers("--counts", counts), _whole_numbers("--nodes", nodes)
    with state(ctx).db().session() as session:
        figures = stored_figures(session)
    rows = []
    for job in spec.jobs:
        book = JobThroughput(job, figures)
        for model in models:
            per_node = default_topology(model).gpus_per_node
            for count in gpu_counts:
                for n_nodes in node_counts:
                    if n_nodes > count or -(-count // n_nodes) > per_node:
                        continue  # fewer GPUs than nodes, or more per node than one instance holds
                    fig = book.at(model, count, nodes=n_nodes)
                    if fig is None:
                        continue
                    low, high = fig.interval
                    rows.append(
                        {
                            "job": job.name,
                            "gpu_model": model,
                            "gpu_count": count,
                            "nodes": n_nodes,
                            "steps_per_s": fig.steps_per_s,
                            "low": low,
                            "high": high,
                            "source": fig.source,
                            "references": ", ".join(fig.references),
                            "note": fig.note,
                        }
                    )
    render(
        rows,
        fmt,
        title="Throughput estimates (steps/s; low..high: 80 % interval)",
        empty="no figure: the jobs have no throughput and the store no reference for these GPUs",
        wide_only=("note",),
        clip=("references",),
    )
