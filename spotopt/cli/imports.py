"""``spotopt import``: load price dumps into the history, one transaction per command.

All files of one command are one run: either every record of every file is in the history
afterwards, or (on the first malformed record) none is, and the run is recorded as failed with
the error. Re-importing the same files inserts nothing (price points are unique per market,
time and source).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from spotopt.cli.common import FormatOption, state
from spotopt.collectors.aws_spot_history import read_spot_history
from spotopt.collectors.azure_retail import read_retail_pages
from spotopt.collectors.csv_prices import read_price_csv
from spotopt.collectors.dump_files import file_size
from spotopt.db.queries import unknown_gpu_types
from spotopt.ingest import RunSummary, run_ingest
from spotopt.render import Format, render, say, to_json
from spotopt.types import PriceObservation, Record, Rejection

app = typer.Typer(no_args_is_help=True, help="Import price dumps (AWS, Azure, CSV) into the history.")

Reader = Callable[[Path, Callable[[int], None] | None], Iterator[PriceObservation | Rejection]]
FilesArgument = Annotated[list[Path], typer.Argument(help="Dump files (plain or .gz).", show_default=False)]
SCOPE_CHARS = 255  # width of runs.scope


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


def _import(ctx: typer.Context, source: str, files: list[Path], reader: Reader, fmt: Format) -> None:
    # Sizes first: a missing file fails before a run is recorded or anything is read.
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
                    if isinstance(record, PriceObservation):
                        seen.add((record.market.cloud, record.market.instance_type))
                    yield record

        scope = ",".join(path.name for path in files)[:SCOPE_CHARS]
        summary = run_ingest(db, source, scope, records())
    with db.session() as session:
        unknown = sorted(unknown_gpu_types(session) & seen)
    _report(summary, [str(path) for path in files], unknown, fmt)


def _report(summary: RunSummary, files: list[str], unknown: list[tuple[str, str]], fmt: Format) -> None:
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
            "detail": "key already stored with another price: first kept",
            "count": stats.conflicting,
        },
        {"outcome": "rejected", "detail": "total", "count": stats.rejected},
    ]
    rows += [
        {"outcome": "rejected", "detail": reason, "count": count}
        for reason, count in stats.rejections.most_common()
    ]
    rows += [{"outcome": "unknown GPU", "detail": name, "count": None} for name in unknown_names]
    title = f"Import {summary.source} (run {summary.run_id}): {len(files)} file(s)"
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
