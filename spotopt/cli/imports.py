"""``spotopt import``: load price dumps, availability probes and instance lifetimes into the
history, one transaction per command.

All files of one command are one run: either every record of every file is in the history
afterwards, or (on the first malformed record) none is, and the run is recorded as failed with
the error. Re-importing the same files inserts nothing (price points and capacity observations
are unique per market, time and source; lifetimes per market, instance and source).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from spotopt.cli.common import FormatOption, state
from spotopt.db.queries import unknown_gpu_types
from spotopt.errors import InputError
from spotopt.files import file_size
from spotopt.history.importers.availability_files import read_availability_csv, read_availability_trace
from spotopt.history.importers.cloud_dumps import read_retail_pages, read_spot_history
from spotopt.history.importers.csv_prices import read_price_csv
from spotopt.history.importers.lifetime_files import read_lifetimes_csv, read_preemption_trace
from spotopt.history.importers.spot_traces import (
    MAX_INSTANCES,
    TraceOptions,
    check_start,
    is_json,
    option_market,
)
from spotopt.history.ingest import RunSummary, run_ingest
from spotopt.render import Format, render, say, to_json
from spotopt.types import MarketRecord, Record

app = typer.Typer(
    no_args_is_help=True,
    help="Import price dumps (AWS, Azure, CSV), spot availability probes and instance lifetimes.",
)

Reader = Callable[[Path, Callable[[int], None] | None], Iterator[Record]]
FilesArgument = Annotated[list[Path], typer.Argument(help="Dump files (plain or .gz).", show_default=False)]
SCOPE_CHARS = 255  # width of runs.scope
AVAILABILITY_SOURCE = "import-availability"
"""``capacity_observations.source`` (and the run's) of ``spotopt import availability``."""
LIFETIMES_SOURCE = "import-lifetimes"
"""``instance_lifetimes.source`` (and the run's) of ``spotopt import lifetimes``."""
_TRACE_EXAMPLE = (
    "--start 2022-10-26T22:05:04Z --cloud aws --region us-west-2 --zone us-west-2a --instance-type p3.2xlarge"
)
StartOption = Annotated[
    str | None,
    typer.Option(help="spot-traces JSON: time of the first probe (ISO 8601, e.g. 2022-10-26T22:05:04Z)."),
]
CloudOption = Annotated[str | None, typer.Option(help="spot-traces JSON: the probed market's cloud.")]
RegionOption = Annotated[str | None, typer.Option(help="spot-traces JSON: its region.")]
ZoneOption = Annotated[str | None, typer.Option(help="spot-traces JSON: its zone (omit: region-wide).")]
InstanceTypeOption = Annotated[str | None, typer.Option(help="spot-traces JSON: its instance type.")]


@app.command("aws-spot-history")
def aws_spot_history(ctx: typer.Context, files: FilesArgument, fmt: FormatOption = Format.TABLE) -> None:
    """Output of `aws ec2 describe-spot-price-history` (JSON, or JSON Lines of its items).

    Linux/UNIX prices only; Windows, SUSE and RHEL items are counted as rejected.
    """
    _import(ctx, "aws-spot-history", files, read_spot_history, fmt)


@app.command("azure-retail")
def azure_retail(ctx: typer.Context, files: FilesArgument, fmt: FormatOption = Format.TABLE) -> None:
    """Pages of the Azure Retail Prices API ({"Items": [...], "NextPageLink": ...}), one per file or
    as JSON Lines.

    Spot (skuName ends in " Spot") and pay-as-you-go Linux VM prices; Windows, Low Priority,
    reservation, dev/test and non-VM items are counted as rejected.
    """
    _import(ctx, "azure-retail", files, read_retail_pages, fmt)


@app.command("csv")
def csv_(ctx: typer.Context, files: FilesArgument, fmt: FormatOption = Format.TABLE) -> None:
    """CSV with the header timestamp,cloud,region,zone,instance_type,market,usd_per_hour."""
    _import(ctx, "csv", files, read_price_csv, fmt)


@app.command("availability")
def availability(
    ctx: typer.Context,
    files: FilesArgument,
    start: StartOption = None,
    cloud: CloudOption = None,
    region: RegionOption = None,
    zone: ZoneOption = None,
    instance_type: InstanceTypeOption = None,
    requested: Annotated[
        int | None,
        typer.Option(
            help="spot-traces JSON: instances each probe asked for (default 1; 16-node traces: 16)."
        ),
    ] = None,
    fmt: FormatOption = Format.TABLE,
) -> None:
    """Spot capacity observations, from CSV files or one spot-traces JSON file.

    CSV header: timestamp,cloud,region,zone,instance_type,available (optional columns
    launched,requested). A spot-traces JSON file (metadata.gap_seconds and a data array of
    instance counts) needs --start, --cloud, --region, --zone, --instance-type and, for
    multi-node traces, --requested.
    """
    if requested is not None and not 1 <= requested <= MAX_INSTANCES:
        raise InputError(
            f"--requested {requested}: a probe asks for 1 to {MAX_INSTANCES:,} instances "
            "(the bound of a CSV file's requested column)"
        )
    given = (start, cloud, region, zone, instance_type, requested)
    _import_csv_or_trace(
        ctx, AVAILABILITY_SOURCE, files, fmt, given, read_availability_csv, read_availability_trace
    )


@app.command("lifetimes")
def lifetimes(
    ctx: typer.Context,
    files: FilesArgument,
    start: StartOption = None,
    cloud: CloudOption = None,
    region: RegionOption = None,
    zone: ZoneOption = None,
    instance_type: InstanceTypeOption = None,
    fmt: FormatOption = Format.TABLE,
) -> None:
    """Spot instance lifetimes, from CSV files or one spot-traces preemption JSON file.

    CSV header: cloud,region,zone,instance_type,instance_id,launched_at,ended_at,end_reason
    (end_reason preempted, terminated, or empty with ended_at while it runs). A 1-node
    spot-traces preemption file needs --start, --cloud, --region, --zone, --instance-type.
    """
    given = (start, cloud, region, zone, instance_type, None)
    _import_csv_or_trace(ctx, LIFETIMES_SOURCE, files, fmt, given, read_lifetimes_csv, read_preemption_trace)


TraceArgs = tuple[str | None, str | None, str | None, str | None, str | None, int | None]
"""--start, --cloud, --region, --zone, --instance-type, --requested as given (None: not given)."""
ProgressCallback = Callable[[int], None] | None


def _import_csv_or_trace(
    ctx: typer.Context,
    source: str,
    files: list[Path],
    fmt: Format,
    given: TraceArgs,
    read_csv: Callable[[Path, ProgressCallback], Iterator[Record]],
    read_trace: Callable[[Path, TraceOptions, ProgressCallback], Iterator[Record]],
) -> None:
    """Import CSV files and at most one spot-traces JSON file (told apart by content), the
    trace's times and market taken from the options."""
    total = sum(file_size(path) for path in files)
    options = _trace_options(files, *given)

    def read(path: Path, on_bytes: ProgressCallback) -> Iterator[Record]:
        if options is not None and is_json(path):
            return read_trace(path, options, on_bytes)
        return read_csv(path, on_bytes)

    _import(ctx, source, files, read, fmt, total)


def _trace_options(
    files: list[Path],
    start: str | None,
    cloud: str | None,
    region: str | None,
    zone: str | None,
    instance_type: str | None,
    requested: int | None,
) -> TraceOptions | None:
    """The market and start of the one spot-traces JSON file among ``files`` (None: all are CSV).

    A JSON file holds neither, so the options are required with one and refused without: a CSV
    names its markets and times in its columns, and options that silently did nothing would
    hide a mistake.
    """
    given = [
        name
        for name, value in (
            ("--start", start),
            ("--cloud", cloud),
            ("--region", region),
            ("--zone", zone),
            ("--instance-type", instance_type),
            ("--requested", requested),
        )
        if value is not None
    ]
    traces = [path for path in files if is_json(path)]
    if not traces:
        if given:
            raise InputError(
                f"{', '.join(given)}: only for a spot-traces JSON file; {files[0].name} is CSV, whose "
                "columns give the times and markets (drop the options)"
            )
        return None
    if len(traces) > 1:
        raise InputError(
            f"{traces[1].name}: one spot-traces JSON file per command (the options name one market "
            f"and start); import {traces[0].name} and {traces[1].name} separately"
        )
    if start is None or cloud is None or region is None or instance_type is None:
        missing = [n for n in ("--start", "--cloud", "--region", "--instance-type") if n not in given]
        raise InputError(
            f"{traces[0].name}: a spot-traces file holds no times and no market; give "
            f"{', '.join(missing)} (e.g. {_TRACE_EXAMPLE})"
        )
    return TraceOptions(check_start(start), option_market(cloud, region, zone, instance_type), requested)


def _import(
    ctx: typer.Context, source: str, files: list[Path], reader: Reader, fmt: Format, total: int | None = None
) -> None:
    # Sizes first: a missing file fails before a run is recorded or anything is read.
    if total is None:
        total = sum(file_size(path) for path in files)
    db = state(ctx).db()
    seen: set[tuple[str, str]] = set()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with progress:
        task = progress.add_task("reading", total=total)

        def advance(count: int) -> None:
            progress.advance(task, count)

        def records() -> Iterator[Record]:
            for path in files:
                progress.update(task, description=path.name)
                for record in reader(path, advance):
                    if isinstance(record, MarketRecord):
                        seen.add((record.market.cloud, record.market.instance_type))
                    yield record

        scope = ",".join(path.name for path in files)[:SCOPE_CHARS]
        summary = run_ingest(db, source, scope, records())
    with db.session() as session:
        unknown = sorted(unknown_gpu_types(session) & seen)
    # Named by the command the user typed: the source (``import-availability``) is the history's.
    _report(ctx.info_name or source, summary, [str(path) for path in files], unknown, fmt)


def _report(
    command: str, summary: RunSummary, files: list[str], unknown: list[tuple[str, str]], fmt: Format
) -> None:
    """One summary: counts, rejection reasons with examples, and instance types of unknown GPU."""
    stats = summary.stats
    unknown_names = [f"{cloud}:{name}" for cloud, name in unknown]
    if fmt is Format.JSON:
        result: dict[str, Any] = {
            "run_id": summary.run_id,
            "source": summary.source,
            "files": files,
            "inserted": stats.inserted,
            "duplicate": stats.duplicate,
            "conflicting": stats.conflicting,
            "rejected": stats.rejected,
            "rejections": dict(stats.rejections.most_common()),
            "rejection_examples": stats.examples,
            "unknown_instance_types": unknown_names,
        }
        typer.echo(to_json(result))
        return
    rows: list[dict[str, Any]] = [
        {"outcome": "inserted", "detail": "", "count": stats.inserted},
        {"outcome": "duplicate", "detail": "already in the history", "count": stats.duplicate},
        {
            "outcome": "conflicting",
            "detail": "key already stored with another value: first kept",
            "count": stats.conflicting,
        },
        {"outcome": "rejected", "detail": "total", "count": stats.rejected},
    ]
    rows += [
        {"outcome": "rejected", "detail": reason, "count": count}
        for reason, count in stats.rejections.most_common()
    ]
    rows += [{"outcome": "unknown GPU", "detail": name, "count": None} for name in unknown_names]
    title = f"Import {command} (run {summary.run_id}): {len(files)} file(s)"
    render(rows, fmt, title=title, columns=["outcome", "detail", "count"])
    if fmt is Format.TABLE:
        if stats.examples:
            say("", label="Rejected, for example:", style="bold")
            for example in stats.examples[:5]:
                say(f"  {example}")
        if unknown_names:
            say(
                f"{len(unknown_names)} instance type(s) are missing from the catalog; they were imported "
                "with an unknown GPU (see `spotopt catalog list`) and are left out of GPU rankings."
            )
