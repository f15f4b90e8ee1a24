"""``spotopt whatif JOBS.yaml``: what the jobs would have cost, run each way, over the history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from spotopt.cli.common import check_cloud, parse_duration, parse_time, state
from spotopt.db.queries import MarketFilter, prices_at
from spotopt.errors import InputError
from spotopt.jobspec import JobSpec, load_jobs
from spotopt.mover.egress import transfer_matrix
from spotopt.mover.guardrails import Guardrails
from spotopt.policies.base import get_policy
from spotopt.render import Format, render, to_json
from spotopt.throughput_store import stored_figures
from spotopt.whatif.example_market import START as EXAMPLE_START
from spotopt.whatif.example_market import example_jobs, load_example
from spotopt.whatif.jobs import build_jobs
from spotopt.whatif.preemptions import PreemptionMode, preemption_table
from spotopt.whatif.run import placements, run_whatif, summarise, window_hours
from spotopt.whatif.strategies import STRATEGIES
from spotopt.whatif.timeline import load_timeline

COLUMNS = [
    "job",
    "strategy",
    "cost_usd",
    "ratio_vs_spot",
    "finish_hours",
    "deadline_met",
    "moves",
    "preemptions",
    "unfinished_starts",
]
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
]


def _strategies(text: str) -> list[str]:
    names = [s.strip() for s in text.split(",") if s.strip()]
    bad = [s for s in names if s not in STRATEGIES]
    if bad or not names:
        raise InputError(
            f"--strategies {text!r}: unknown {', '.join(bad) or '(empty)'}; valid: {', '.join(STRATEGIES)}"
        )
    return list(dict.fromkeys(names))


def _clouds(text: str | None) -> list[str] | None:
    return [check_cloud(c.strip()) for c in text.split(",") if c.strip()] if text else None


def whatif(
    ctx: typer.Context,
    jobs_file: Annotated[
        Path | None, typer.Argument(metavar="[JOBS.yaml]", help="Job spec (see README); omit with --example.")
    ] = None,
    example: Annotated[
        bool,
        typer.Option(
            "--example", help="Load the bundled SYNTHETIC example market and jobs, and replay them."
        ),
    ] = False,
    start: Annotated[
        str | None, typer.Option(help="First start (ISO 8601); default: one window before the latest price.")
    ] = None,
    starts: Annotated[
        int, typer.Option(min=1, help="Number of start times (results are means over them).")
    ] = 1,
    every: Annotated[str, typer.Option(help="Time between start times, e.g. 1d or 12h.")] = "1d",
    strategies: Annotated[str, typer.Option(help=f"Comma-separated: {', '.join(STRATEGIES)}.")] = ",".join(
        STRATEGIES
    ),
    preemptions: Annotated[
        PreemptionMode, typer.Option(help="none, model (drawn from interruption rates) or replay (recorded).")
    ] = PreemptionMode.MODEL,
    seed: Annotated[int, typer.Option(help="Seed for --preemptions model.")] = 0,
    clouds: Annotated[
        str | None, typer.Option(help="Comma-separated clouds to consider (default all).")
    ] = None,
    policy: Annotated[
        str | None,
        typer.Option(
            help="Policy of the spotopt strategy (default min-cost-slo if any deadline, else min-cost)."
        ),
    ] = None,
    tick: Annotated[str, typer.Option(help="Planning period and price sampling step.")] = "1h",
    fmt: Annotated[Format, typer.Option("--format", "-f", help="table, csv or json.")] = Format.TABLE,
    plot: Annotated[
        Path | None, typer.Option(help="Write the strategy breakdown (and timelines) as PNG.")
    ] = None,
) -> None:
    """Replay the price history through every strategy: cost, ratio to spot, finish, deadlines, moves."""
    names = _strategies(strategies)
    if policy is not None:
        get_policy(policy)
    if jobs_file is None and not example:
        raise InputError("give a JOBS.yaml job spec, or --example for the bundled synthetic example")
    tick_h = parse_duration(tick, "--tick").total_seconds() / 3600.0
    every_h = parse_duration(every, "--every").total_seconds() / 3600.0
    spec: JobSpec = load_jobs(jobs_file) if jobs_file is not None else example_jobs()
    db = state(ctx).db()
    if example:
        load_example(db)
    flt = MarketFilter(clouds=_clouds(clouds))
    with db.session() as session:
        first = parse_time(start, "--start") or (EXAMPLE_START if example and jobs_file is None else None)
        if first is None:
            first = _default_start(session, spec, starts, every_h, flt)
        hours = window_hours(spec, first, starts, every_h)
        tl = load_timeline(session, first, hours, tick_h, flt)
        figures = stored_figures(session)
        events = preemption_table(session, tl, preemptions, seed)
    sim = build_jobs(spec, tl, figures)
    transfer = transfer_matrix(tl.locations, first)
    start_ticks = [round(k * every_h / tick_h) for k in range(starts)]
    total = starts * len(set(names) | {"spot"})
    err = Console(stderr=True)
    with Progress(
        TextColumn("[bold]what-if[/bold] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        task = progress.add_task("replaying", total=total)

        def step(name: str, start_tick: int) -> None:
            progress.update(task, advance=1, description=f"{name} from {tl.time(start_tick):%Y-%m-%d %H:%M}")

        runs = run_whatif(
            tl, sim, events, transfer, names, start_ticks, Guardrails(period_h=tick_h), policy, step
        )
    rows = summarise(runs, sim, names)
    label = "SYNTHETIC example market" if tl.synthetic else "price history"
    title = (
        f"What-if over the {label}: {starts} start(s) from {first:%Y-%m-%d %H:%M} UTC every {every}, "
        f"preemptions {preemptions.value}"
        + (f" (seed {seed})" if preemptions is PreemptionMode.MODEL else "")
    )
    shown = [r for r in runs if r.strategy in names]
    where = [p for r in shown for p in placements(r, tl, sim)] if starts == 1 else []
    notes = sorted({f"{r.strategy}: {n}" for r in shown for n in r.notes})
    if tl.last_observed is not None and tl.time(tl.n_ticks) > tl.last_observed + timedelta(days=1):
        notes.append(
            f"the window ends {tl.time(tl.n_ticks):%Y-%m-%d} but the last price is from "
            f"{tl.last_observed:%Y-%m-%d}: later prices are held constant"
        )
    if plot is not None:
        from spotopt.whatif.plot import plot_whatif

        plot_whatif(plot, rows, names, shown, tl, sim, title)
    if fmt is Format.JSON:
        typer.echo(
            to_json(
                _document(
                    rows,
                    where,
                    notes,
                    tl.synthetic,
                    sorted(tl.sources),
                    first,
                    hours,
                    preemptions,
                    seed,
                    starts,
                    every_h,
                )
            )
        )
        return
    render(rows, fmt, title=title, columns=COLUMNS, caption="oracle cost_usd is a lower bound (see README)")
    if fmt is Format.TABLE:
        if where:
            render(where, fmt, title="Where each job ran (one start)", columns=PLACEMENT_COLUMNS)
        for note in notes:
            Console().print(f"[dim]note: {note}[/dim]", highlight=False)
        if tl.synthetic:
            Console().print(
                "[bold yellow]These prices are SYNTHETIC (spotopt's example generator), "
                "not measurements.[/bold yellow]"
            )


def _document(
    rows: list[dict[str, Any]],
    where: list[dict[str, Any]],
    notes: list[str],
    synthetic: bool,
    sources: list[str],
    first: datetime,
    hours: float,
    mode: PreemptionMode,
    seed: int,
    starts: int,
    every_h: float,
) -> dict[str, Any]:
    return {
        "synthetic": synthetic,
        "price_sources": sources,
        "first_start": first,
        "starts": starts,
        "every_hours": every_h,
        "window_hours": hours,
        "preemptions": mode.value,
        "seed": seed if mode is PreemptionMode.MODEL else None,
        "results": rows,
        "placements": where,
        "notes": notes,
    }


def _default_start(session: Any, spec: JobSpec, starts: int, every_h: float, flt: MarketFilter) -> datetime:
    """One window before the latest price point, so the replay ends where the history does."""
    latest = max((q.observed_at for q in prices_at(session, datetime.now(UTC), flt)), default=None)
    if latest is None:
        raise InputError(
            "the history has no prices; import or collect some, or run `spotopt whatif --example`"
        )
    return latest - timedelta(hours=window_hours(spec, latest, starts, every_h))
