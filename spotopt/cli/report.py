"""``spotopt report``: list the reports, run one (table/CSV/JSON, optional PNG plot), print its SQL.

Parameters are parsed and the plot path checked before the database is opened, so a bad
parameter exits non-zero having touched nothing (not even creating a default SQLite file).
"""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import pandas as pd
import typer
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Dialect, make_url
from sqlalchemy.orm import Session

from spotopt.cli.common import FormatOption, WideOption, state
from spotopt.db.engine import sqlite_path
from spotopt.db.queries import history_span
from spotopt.errors import ConfigError, InputError
from spotopt.render import Format, render, say, to_json
from spotopt.reports.base import Report, ReportResult, parse_pairs
from spotopt.reports.browse import canned_queries, serve
from spotopt.reports.registry import REPORTS
from spotopt.settings import Settings
from spotopt.webguard import is_loopback

app = typer.Typer(no_args_is_help=True, help="Reports on the price history: tables, CSV/JSON, plots, SQL.")

ParamOption = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="name=value, repeatable; `spotopt report list` shows each report's."),
]


class SqlDialect(StrEnum):
    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"


def _dialect(name: str) -> Dialect:
    # "named" paramstyle: literal SQL for psql must not double the % of LIKE patterns.
    if name == SqlDialect.POSTGRESQL:
        return postgresql.dialect(paramstyle="named")
    return sqlite.dialect()


@app.command("list")
def list_reports(fmt: FormatOption = Format.TABLE) -> None:
    """Every report with what it answers and its parameters."""
    rows = [
        {
            "report": r.name,
            "answers": r.summary,
            "parameters": "; ".join(f"{p.name}: {p.help}" for p in r.params),
            "plot": "yes" if r.plot else "no",
        }
        for r in REPORTS.values()
    ]
    render(rows, fmt, title="Reports")


def _check_plot(report: Report, plot: Path | None) -> None:
    if plot is None:
        return
    if report.plot is None:
        with_plots = ", ".join(r.name for r in REPORTS.values() if r.plot)
        raise InputError(f"--plot: report {report.name} has no plot; reports with plots: {with_plots}")
    if plot.suffix.lower() != ".png":
        raise InputError(f"--plot {plot}: write a .png file (e.g. --plot {plot.with_suffix('.png').name})")
    if not plot.parent.is_dir():
        raise InputError(f"--plot {plot}: directory {plot.parent} does not exist")


# Secondary columns a report table leaves out unless --wide (CSV and JSON keep them): counts and
# extremes that support the headline numbers rather than being them.
WIDE_ONLY = (
    "gpu_count",
    "lowest_usd_per_gpu_hour",
    "markets",
    "changes",
    "min_usd_per_hour",
    "max_usd_per_hour",
    "hours",
    "spot_markets",
    "regions",
    "min_value",
    "max_value",
    "longest_hours",
    "first_observed",
    "finished_at",
)


def _region_wide_zones_as_null(frame: pd.DataFrame) -> pd.DataFrame:
    """Reports group on ``zone == ""`` (pandas drops NaN group keys); on output a region-wide
    market's zone is null, as ``prices`` prints it."""
    zones = [c for c in frame.columns if c == "zone" or str(c).endswith("_zone")]
    if not zones:
        return frame
    out = frame.copy()
    for col in zones:
        out[col] = out[col].astype(object).where(out[col] != "", None)
    return out


def _render(result: ReportResult, fmt: Format, empty: str, wide: bool) -> None:
    sections = {name: _region_wide_zones_as_null(frame) for name, frame in result.sections.items()}
    if fmt is Format.JSON and len(sections) > 1:
        sys.stdout.write(
            to_json({name: frame.to_dict(orient="records") for name, frame in sections.items()}) + "\n"
        )
        return
    for i, (name, frame) in enumerate(sections.items()):
        if fmt is Format.CSV and len(sections) > 1:
            sys.stdout.write(("\n" if i else "") + f"# section: {name}\n")
        title = result.title if len(sections) == 1 else f"{result.title}: {name}"
        render(
            frame,
            fmt,
            title=title,
            caption=result.describe_span(),
            columns=list(frame.columns),
            empty=empty,
            wide_only=WIDE_ONLY,
            wide=wide,
        )


def _empty_note(session: Session, result: ReportResult) -> str:
    """What an empty table means: the window asked for, the span the history holds, how to ask.
    Where another section of the report has rows, the window holds data and the empty one has
    simply none in it (no outages in a week of capacity): the history's span is not the cause."""
    asked = result.describe_span().split(" UTC")[0]
    if not all(frame.empty for frame in result.sections.values()):
        return f"none in {asked}"
    span = history_span(session)
    if span is None:
        return (
            f"no rows in {asked}: the history holds only catalog list prices; collect or import prices first"
        )
    first, last = (t.strftime("%Y-%m-%d") for t in span)
    return (
        f"no rows in {asked}; the history covers {first} – {last}: "
        f"ask for it with -p since={first} -p until={last}"
    )


@app.command()
def run(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Report name (see `spotopt report list`).")],
    param: ParamOption = None,
    fmt: FormatOption = Format.TABLE,
    plot: Annotated[Path | None, typer.Option(help="Also draw the report into this PNG file.")] = None,
    wide: WideOption = False,
) -> None:
    """Run a report on the history and print it; --plot FILE.png also draws it."""
    report = REPORTS.lookup(name)
    args = report.parse(parse_pairs(param or []))
    _check_plot(report, plot)
    with state(ctx).db().session() as session:
        result = report.run(session, args)
        empty = _empty_note(session, result) if any(f.empty for f in result.sections.values()) else ""
    _render(result, fmt, empty, wide)
    for note in result.notes:
        say(note, label="note:", style="dim", err=True)
    if plot is not None and report.plot is not None:
        report.plot(result, args, plot)
        say(f"plot written to {plot}", err=True)


@app.command()
def sql(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Report name (see `spotopt report list`).")],
    param: ParamOption = None,
    dialect: Annotated[
        SqlDialect | None,
        typer.Option(help="SQL dialect; default the one of the configured database."),
    ] = None,
) -> None:
    """Print the report's SQL with the parameters filled in, to run in psql, sqlite3 or Grafana.

    The reports post-process these results in pandas (intervals, time buckets, time-weighted
    statistics); the SQL is what they read.
    """
    report = REPORTS.lookup(name)
    args = report.parse(parse_pairs(param or []))
    if dialect is None:
        backend = make_url(Settings().resolved_db_url(state(ctx).db_url)).get_backend_name()
        dialect = SqlDialect(backend)
    compiled: list[Any] = []
    for stmt_name, stmt in report.statements(args).items():
        text = stmt.compile(dialect=_dialect(dialect), compile_kwargs={"literal_binds": True})
        compiled.append(f"-- {report.name}: {stmt_name}\n{text};\n")
    sys.stdout.write("\n".join(compiled))


@app.command()
def browse(
    ctx: typer.Context,
    param: ParamOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on (loopback only).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = 8001,
) -> None:
    """Browse the history with SQL in Datasette (SQLite only); each report's SQL is a canned query.

    --param values go to the reports that take them (price-board needs -p gpu=MODEL to be listed).
    Needs the browse extra: pip install 'spotopt-gpu[browse]'."""
    if not is_loopback(host):
        raise InputError(f"--host {host}: Datasette has no login here; serve on 127.0.0.1 (or tunnel to it)")
    canned = canned_queries(parse_pairs(param or []), datetime.now(UTC))
    url = Settings().resolved_db_url(state(ctx).db_url)
    path = sqlite_path(url)
    if path is None:
        raise InputError(
            f"--db {make_url(url).render_as_string()}: Datasette reads SQLite files only; "
            "for PostgreSQL run `spotopt report sql NAME` in psql"
        )
    if importlib.util.find_spec("datasette") is None:
        raise ConfigError("report browse needs Datasette: pip install 'spotopt-gpu[browse]'")
    state(ctx).db()  # the schema current (and the file created) before Datasette reads it
    for name, needs in canned.skipped.items():
        say(f"{name} is not listed: it needs -p {needs}=…", label="note:", style="dim", err=True)
    say(f"Datasette at http://{host}:{port}/ (Ctrl-C stops it)", label="browse:", err=True)
    serve(path, canned, host, port)
