"""``spotopt throughput``: the steps/s figures the planner uses (measured, imported, estimated)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from spotopt.agent.steady import WARMUP_STEPS
from spotopt.catalog import gpu_matches, gpu_models
from spotopt.cli.common import FormatOption, state
from spotopt.cli.daemon import StateDirOption, _clouds, _provider
from spotopt.clouds.common.base import Provider, market_label
from spotopt.clouds.registry import PROVIDERS
from spotopt.decide.options import memory_shortfall
from spotopt.errors import InputError
from spotopt.history.throughput_store import import_rows, list_rows, read_file, stored_figures
from spotopt.jobspec import MAX_GPUS, gpu_key, load_jobs
from spotopt.mover import profile as profiling
from spotopt.render import Format, render, say
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
    80 % interval (low..high) and the reference workloads it came from; the memory column says why a
    row is never offered (the job's memory does not fit those GPUs)."""
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
                            "memory": memory_shortfall(job, model, count),
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


@app.command("profile")
def profile(
    ctx: typer.Context,
    jobs_file: Annotated[Path, typer.Argument(metavar="JOBS.yaml", help="Job spec (docs/guides/plan.md).")],
    gpu: Annotated[str, typer.Option("--gpu", help="The exact GPU model the runs use (e.g. L4, A100-80GB).")],
    counts: Annotated[str, typer.Option("--counts", help="GPU counts, comma-separated; one run each.")] = "1",
    budget_usd: Annotated[
        float | None,
        typer.Option("--budget-usd", min=0, help="Refuse runs that would cost more, all together."),
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps", min=1, help=f"Steps measured after the warm-up (default {profiling.DEFAULT_STEPS})."
        ),
    ] = None,
    seconds: Annotated[
        float | None,
        typer.Option("--seconds", min=1, help="Seconds measured after the warm-up (instead of --steps)."),
    ] = None,
    warmup_steps: Annotated[
        int,
        typer.Option(
            "--warmup-steps",
            min=0,
            help="Steps left out at the start (compilation, autotuning, data loader).",
        ),
    ] = WARMUP_STEPS,
    provider: Annotated[
        str, typer.Option("--provider", help="Where the runs go: local (this machine) or a cloud provider.")
    ] = "local",
    state_dir: StateDirOption = None,
    fmt: FormatOption = Format.TABLE,
) -> None:
    """Run each job briefly on --gpu (once per --counts), store the steps/s its agent measured as
    the job's measured figure, and show them beside what the model estimated before."""
    if steps is not None and seconds is not None:
        raise InputError("--steps/--seconds: give one of them, not both")
    spec = load_jobs(jobs_file)
    models = _gpu_models(gpu)
    if len(models) != 1:
        raise InputError(f"--gpu: {gpu!r} stands for {', '.join(models) or 'no model'}; name one GPU model")
    gpu_counts = _whole_numbers("--counts", counts)
    db = state(ctx).db()
    now = datetime.now(UTC)
    placements: Provider
    clouds: tuple[str, ...] | None
    if provider in PROVIDERS and provider != "local":  # only its clouds' markets can be launched
        placements, clouds = _clouds(db, provider)
    else:
        placements, clouds = _provider(provider, state_dir), None
    with db.session() as session:
        runs = profiling.plan_runs(
            session,
            spec.jobs,
            jobs_file.resolve().parent,
            models[0],
            gpu_counts,
            steps=steps,
            seconds=seconds,
            warmup_steps=warmup_steps,
            budget_usd=budget_usd,
            now=now,
            clouds=clouds,
        )
    spent, rows = 0.0, []
    for i, run in enumerate(runs):
        limit_s = profiling.LONGEST_S
        if budget_usd is not None:  # this run may spend what the runs after it do not expect to
            left = budget_usd - spent - sum(r.expected_usd for r in runs[i + 1 :])
            if left < run.expected_usd:
                say(f"{run.job.name} on {run.gpu_count}x {run.gpu_model}: not run, the budget is spent",
                    label="warning:", err=True)  # fmt: skip
                continue
            if run.quote.usd_per_hour > 0:
                limit_s = min(limit_s, left / run.quote.usd_per_hour * 3600.0)
        say(f"profiling {run.job.name} on {run.gpu_count}x {run.gpu_model} ({provider}) ...", err=True)
        result = profiling.profile(
            placements, run, steps=steps, seconds=seconds, warmup_steps=warmup_steps, limit_s=limit_s
        )
        spent += result.cost_usd
        with db.session() as session:
            profiling.store_result(session, result, warmup_steps, datetime.now(UTC))
        if result.rate is None:
            why = (
                f"fewer than two heartbeats past {warmup_steps} warm-up steps"
                if result.heartbeats
                else f"no heartbeat arrived from the job's agent on {market_label(run.market)}"
            )
            say(
                f"{run.job.name} on {run.gpu_count}x {run.gpu_model}: nothing measured ({result.ended} "
                f"after {result.ran_s:.0f} s: {why}); nothing stored",
                label="warning:",
                err=True,
            )
        elif run.before is not None and run.before.source == "spec":
            say(
                f"{run.job.name}: its spec's throughput for {run.gpu_model} wins over the measured figure; "
                "remove it from the spec to plan with the measurement",
                label="note:",
                err=True,
            )
        rows.append(result.row(warmup_steps))
    render(
        rows,
        fmt,
        title=f"Profiled (steps/s; error: estimate / measured - 1; first {warmup_steps} steps left out)",
        wide_only=("low", "high", "market", "ended"),
    )
    if any(row["steps_per_s"] is None for row in rows) or len(rows) < len(runs):
        raise typer.Exit(1)
