"""``spotopt collect``: run the live collectors of one cloud or all of them into the history."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from spotopt.catalog import check_gpu_query
from spotopt.cli.common import FormatOption, WideOption, parse_time, state
from spotopt.cloud_calls import Retry
from spotopt.clouds.common.sdk import client_factory
from spotopt.clouds.registry import MARKET_CLOUDS
from spotopt.errors import CollectorError, InputError
from spotopt.history.collect import ClientFactory, CollectRequest, ScopeResult, run_collect
from spotopt.render import Format, render, say

# The seams tests replace: how a cloud's clients are built, and how long retries sleep.
FACTORY: ClientFactory = client_factory
RETRY = Retry()

COLUMNS = [
    "cloud",
    "collector",
    "scope",
    "status",
    "records",
    "inserted",
    "duplicate",
    "unchanged",
    "rejected",
    "seconds",
    "note",
]


class _Bars:
    """One progress bar per cloud; its description names the collector and region at work."""

    def __init__(self, progress: Progress) -> None:
        self.progress = progress
        self.tasks: dict[str, TaskID] = {}

    def _task(self, cloud: str) -> TaskID:
        if cloud not in self.tasks:
            self.tasks[cloud] = self.progress.add_task(cloud, total=0, what="")
        return self.tasks[cloud]

    def planned(self, cloud: str, scopes: int) -> None:
        task = self._task(cloud)
        total = self.progress.tasks[self.tasks[cloud]].total or 0
        self.progress.update(task, total=total + scopes)

    def started(self, cloud: str, collector: str, scope: str) -> None:
        self.progress.update(self._task(cloud), what=f"{collector} {scope}")

    def finished(self, result: ScopeResult) -> None:
        task = self._task(result.cloud)
        if result.scope in ("regions", "all"):  # the collector never got as far as listing its scopes
            self.progress.update(task, total=(self.progress.tasks[task].total or 0) + 1)
        self.progress.update(task, advance=1, what=f"{result.collector} {result.scope}: {result.status}")


def _clouds(cloud: str) -> tuple[str, ...]:
    if cloud == "all":
        return MARKET_CLOUDS
    if cloud not in MARKET_CLOUDS:
        raise InputError(f"cloud {cloud!r} is not one of {', '.join(MARKET_CLOUDS)} or all")
    return (cloud,)


def _region(value: str) -> str:
    region = value.strip().lower()
    if not region or not all(ch.isalnum() or ch == "-" for ch in region):
        raise InputError(f"--region {value!r} is not a region name (e.g. us-east-1, us-central1, eastus)")
    return region


def collect(
    ctx: typer.Context,
    cloud: Annotated[str, typer.Argument(help="aws, gcp, azure or all.")] = "all",
    region: Annotated[
        list[str] | None, typer.Option("--region", help="Only this region (repeatable); default all.")
    ] = None,
    gpu: Annotated[
        list[str] | None, typer.Option("--gpu", help="Only this GPU model or family (repeatable).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Fetch history from this time (ISO 8601 or -7d) instead of the stored watermark."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Fetch and count, write nothing to the history.")
    ] = False,
    fmt: FormatOption = Format.TABLE,
    wide: WideOption = False,
) -> None:
    """Collect GPU catalogs, prices and interruption data from the clouds into the history.

    Each (collector, region) is its own transaction with its own watermark; a cloud without
    credentials is reported and skipped while the others are collected. Exit code 3 if any
    scope failed.
    """
    request = CollectRequest(
        clouds=_clouds(cloud),
        regions=tuple(dict.fromkeys(_region(r) for r in region or [])),
        gpus=tuple(dict.fromkeys(check_gpu_query(g) for g in gpu or [])),
        since=parse_time(since, "--since"),
        dry_run=dry_run,
    )
    db = state(ctx).db()
    progress = Progress(
        TextColumn("[bold]{task.description:<6}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[what]}"),
        console=Console(stderr=True),
    )
    with progress:
        results = run_collect(db, request, FACTORY, retry=RETRY, reporter=_Bars(progress))
    rows: list[dict[str, Any]] = [r.as_row() for r in results]
    title = "Collected (dry run: nothing written)" if dry_run else "Collected"
    render(
        rows,
        fmt,
        title=title,
        columns=COLUMNS,
        wide_only=("records", "duplicate", "unchanged", "seconds"),
        wide=wide,
    )
    failed = [r for r in results if r.status == "failed"]
    if failed:
        others = (
            "the others were committed (see the note column)"
            if len(failed) < len(results)
            else "nothing was written (see the note column)"
        )
        say(others, label=f"{len(failed)} of {len(results)} scopes failed;", style="bold red", err=True)
        raise typer.Exit(CollectorError.exit_code)
