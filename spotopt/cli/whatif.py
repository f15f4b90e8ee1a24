"""``spotopt whatif JOBS.yaml``: what the jobs would have cost, run each way, over the history."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from spotopt.cli.common import WideOption, check_cloud, parse_duration, parse_time, state
from spotopt.db.engine import Database
from spotopt.decide.options import BILLING
from spotopt.errors import InputError
from spotopt.jobspec import load_jobs
from spotopt.render import Format, render, say, to_json, usd
from spotopt.whatif.example_market import START as EXAMPLE_START
from spotopt.whatif.example_market import example_jobs
from spotopt.whatif.preemptions import PreemptionMode
from spotopt.whatif.replay import ReplayRequest, ReplayResult, example_history, replay, total_runs
from spotopt.whatif.run import STRATEGIES
from spotopt.whatif.saved import check_name
from spotopt.whatif.saved import save as saved_run

COLUMNS = [
    "job",
    "strategy",
    "cost_usd",
    "bound_usd",
    "ratio_vs_spot",
    "finish_hours",
    "deadline_met",
    "moves",
    "preemptions",
    "unfinished_starts",
    "throughput_source",
]
SYNTHETIC = "these prices come from spotopt's example generator, not measurements"
PLACEMENT_COLUMNS = [
    "job",
    "strategy",
    "from",
    "to",
    "cloud",
    "zone",
    "region",
    "instance_type",
    "market",
    "gpu",
    "gpus",
    "throughput_source",
]


def _strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise InputError(f"--strategies {text!r}: give at least one of {', '.join(STRATEGIES)}")
    for name in names:
        try:
            STRATEGIES.lookup(name)
        except InputError as exc:
            raise InputError(f"--strategies {text!r}: {exc}") from exc
    return list(dict.fromkeys(names))


def _clouds(text: str | None) -> tuple[str, ...] | None:
    return tuple(check_cloud(c.strip()) for c in text.split(",") if c.strip()) if text else None


def whatif(
    ctx: typer.Context,
    jobs_file: Annotated[
        Path | None,
        typer.Argument(metavar="[JOBS.yaml]", help="Job spec (docs/guides/plan.md); no file with --example."),
    ] = None,
    example: Annotated[
        bool,
        typer.Option(
            "--example",
            help="Replay over the bundled SYNTHETIC example market (a throwaway database; your history "
            "is not touched), with its example jobs unless JOBS.yaml is given.",
        ),
    ] = False,
    start: Annotated[
        str | None, typer.Option(help="First start (ISO 8601); default: one window before the latest price.")
    ] = None,
    starts: Annotated[
        int, typer.Option(min=1, help="Number of start times (results are means over them).")
    ] = 1,
    every: Annotated[
        str, typer.Option(help="Time between start times, e.g. 1d or 25h (varies the hour of day).")
    ] = "1d",
    strategies: Annotated[str, typer.Option(help=f"Comma-separated: {', '.join(STRATEGIES)}.")] = ",".join(
        STRATEGIES
    ),
    preemptions: Annotated[
        PreemptionMode, typer.Option(help="none, model (drawn from interruption rates) or replay (recorded).")
    ] = PreemptionMode.MODEL,
    seed: Annotated[int, typer.Option(min=0, help="Seed for --preemptions model.")] = 0,
    clouds: Annotated[
        str | None, typer.Option(help="Comma-separated clouds to consider (default all).")
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            help="Policy of the spotopt strategy (default min-cost-slo if any deadline, else min-cost)."
        ),
    ] = None,
    billing: Annotated[
        str,
        typer.Option(
            help="instance: a job pays for every GPU of the instances it rents (what the daemon does); "
            "gpu: k of n GPUs pay k/n (the thesis' packed accounting)."
        ),
    ] = "instance",
    tick: Annotated[str, typer.Option(help="Planning period and price sampling step.")] = "1h",
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table, csv or json.")] = Format.TABLE,
    plot: Annotated[
        Path | None, typer.Option(help="Write the strategy breakdown (and timelines) as PNG.")
    ] = None,
    details: Annotated[
        bool, typer.Option("--details", help="Also show where each job ran (one start only).")
    ] = False,
    wide: WideOption = False,
    save: Annotated[
        str | None,
        typer.Option(
            "--save", metavar="NAME", help="Store the replay under NAME for the dashboard (`spotopt ui`)."
        ),
    ] = None,
) -> None:
    """Replay the price history through every strategy: cost, ratio to spot, finish, deadlines, moves.

    --save NAME stores the results (and, for one start, where each job ran) in the history
    database, shown on the dashboard's what-if page."""
    if jobs_file is None and not example:
        raise InputError("give a JOBS.yaml job spec, or --example for the bundled synthetic example")
    if plot is not None and (plot.suffix.lower() != ".png" or not plot.parent.is_dir()):
        raise InputError(f"--plot {plot}: give a .png file in an existing directory")
    if billing not in BILLING:
        raise InputError(f"--billing {billing!r}: must be one of {', '.join(BILLING)}")
    request = ReplayRequest(
        spec=load_jobs(jobs_file) if jobs_file is not None else example_jobs(),
        start=parse_time(start, "--start") or (EXAMPLE_START if example and jobs_file is None else None),
        starts=starts,
        every_h=parse_duration(every, "--every").total_seconds() / 3600.0,
        strategies=tuple(_strategies(strategies)),
        preemptions=preemptions,
        seed=seed,
        clouds=_clouds(clouds),
        policy=policy,
        tick_h=parse_duration(tick, "--tick").total_seconds() / 3600.0,
        billing=billing,
    )
    if save is not None:
        check_name(state(ctx).db(), save)
    history: AbstractContextManager[Database] = example_history() if example else nullcontext(state(ctx).db())
    err = Console(stderr=True)
    with (
        history as db,
        Progress(
            TextColumn("[bold]what-if[/bold] {task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total}"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=err,
            transient=True,
            disable=not err.is_terminal,
        ) as progress,
    ):
        task = progress.add_task("replaying", total=total_runs(request))

        def step(name: str, at: datetime) -> None:
            progress.update(task, advance=1, description=f"{name} from {at:%Y-%m-%d %H:%M}")

        result = replay(db, request, step)
    if save is not None:
        saved_run(state(ctx).db(), save, result, datetime.now(UTC))
        say(f"stored as {save!r}: `spotopt ui` shows it under What-if", err=True)
    _show(result, fmt, every, plot, details, wide)


def _table_columns(rows: list[dict[str, Any]]) -> list[str]:
    """The table leaves out columns that say nothing for these rows (CSV keeps them all); the
    figures' source is shown where some job ran on an estimate."""
    empty = {c for c in ("bound_usd", "deadline_met") if all(r.get(c) is None for r in rows)}
    if not any("estimated" in (r["throughput_source"] or "") for r in rows):
        empty.add("throughput_source")
    if all(r["unfinished_starts"] == 0 for r in rows):
        empty.add("unfinished_starts")
    return [c for c in COLUMNS if c not in empty]


def _show(
    result: ReplayResult, fmt: Format, every: str, plot: Path | None, details: bool, wide: bool
) -> None:
    req = result.request
    label = "SYNTHETIC example market" if result.synthetic else "price history"
    title = (
        f"What-if over the {label}: {req.starts} start(s) from {result.first_start:%Y-%m-%d %H:%M} UTC "
        f"every {every}, preemptions {req.preemptions.value}"
        + (f" (seed {req.seed})" if req.preemptions is PreemptionMode.MODEL else "")
        + f", billing {req.billing}"
    )
    if plot is not None:
        from spotopt.whatif.plot import plot_whatif

        shown = [r for r in result.runs if r.strategy in req.strategies]
        plot_whatif(plot, result.rows, list(req.strategies), shown, result.timeline, result.jobs, title)
    if fmt is not Format.TABLE and result.synthetic:  # the data says so too: a key, a column
        say(SYNTHETIC, label="SYNTHETIC:", style="bold yellow", err=True)
    if fmt is Format.JSON:
        typer.echo(to_json(result.document()))
        return
    caption = "oracle: cost_usd is its hindsight schedule, bound_usd a proven lower bound (see docs)"
    table = fmt is Format.TABLE
    render(
        # Every CSV row says whether its prices are the synthetic example's (as JSON's key does);
        # the table shows money in the one money format (``usd``), CSV at full precision.
        [
            row
            | ({"cost_usd": usd(row["cost_usd"]), "bound_usd": usd(row.get("bound_usd"))} if table else {})
            | {"synthetic": result.synthetic}
            for row in result.rows
        ],
        fmt,
        title=title,
        columns=_table_columns(result.rows) if table else [*COLUMNS, "synthetic"],
        caption=caption if "oracle" in req.strategies else None,
        wide_only=("finish_hours", "preemptions", "unfinished_starts"),
        wide=wide,
    )
    if fmt is Format.TABLE:
        where = result.placements()
        if where and details:
            render(
                where,
                fmt,
                title="Where each job ran (one start)",
                columns=PLACEMENT_COLUMNS,
                wide_only=("zone", "gpu", "gpus", "throughput_source"),
                wide=wide,
            )
        elif where:
            say("--details shows where each job ran; --plot FILE.png draws it; --format json has everything")
        if details and result.policy_solves is not None:
            say(f"the spotopt strategy's policy solved {result.policy_solves} times", label="detail:")
        for note in result.notes:
            say(note, label="note:", style="dim")
        if result.synthetic:
            say(SYNTHETIC, label="SYNTHETIC:", style="bold yellow")
