"""The ``spotopt`` command: global options, error mapping and the sub-apps."""

from __future__ import annotations

import importlib.metadata
import inspect
import signal
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from spotopt import DISTRIBUTION
from spotopt.cli import (
    agent,
    catalog,
    collect,
    daemon,
    db,
    imports,
    jobs,
    plan,
    prices,
    report,
    throughput,
    ui,
    whatif,
)
from spotopt.cli.common import State
from spotopt.errors import SpotoptError
from spotopt.render import say, show_library_log


class SpotoptGroup(TyperGroup):
    """Maps every ``SpotoptError`` to one red line on stderr and its exit code (no traceback).

    Option values typer refuses keep typer's usage box, minus the "Value error, " that its
    pydantic validation puts before our own words.
    """

    def invoke(self, ctx: Any) -> Any:  # click.Context, vendored by typer
        try:
            return super().invoke(ctx)
        except typer.BadParameter as exc:
            exc.message = exc.message.removeprefix("Value error, ")
            raise
        except SpotoptError as exc:
            say(str(exc), label="error:", style="bold red", err=True)
            raise typer.Exit(exc.exit_code) from exc
        finally:
            if isinstance(ctx.obj, State):
                ctx.obj.close()


app = typer.Typer(
    cls=SpotoptGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Make GPU training cheaper on AWS, GCP and Azure without missing deadlines.",
)


def _print_version(wanted: bool) -> None:
    """``--version``: the installed distribution's name and version (what ``pip`` installed, so
    an instance's ``spotopt --version`` can be compared with the daemon's)."""
    if wanted:
        typer.echo(f"{DISTRIBUTION} {importlib.metadata.version(DISTRIBUTION)}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the installed version and exit."
        ),
    ] = False,
    db_url: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Database URL (sqlite:///PATH or postgresql://…); default $SPOTOPT_DB_URL, "
            "else a SQLite file in your data directory.",
        ),
    ] = None,
) -> None:
    show_library_log()
    ctx.obj = State(db_url)


app.add_typer(db.app, name="db")
app.add_typer(catalog.app, name="catalog")
app.add_typer(prices.app, name="prices")
app.add_typer(imports.app, name="import")
app.add_typer(report.app, name="report")
app.command("plan")(plan.plan)
app.add_typer(throughput.app, name="throughput")
app.command("collect")(collect.collect)
app.command("whatif")(whatif.whatif)
app.add_typer(agent.app, name="agent")
app.add_typer(jobs.app, name="jobs")
app.add_typer(daemon.app, name="daemon")
app.command("ui")(ui.ui)


def _unwrapped(text: str) -> str:
    """``text`` (a docstring) with each paragraph on one line, so ``--help`` wraps it to the
    terminal instead of keeping the source's line breaks; bullet lines (``-``) stay lines."""
    paragraphs = []
    for paragraph in inspect.cleandoc(text).split("\n\n"):
        lines: list[str] = []
        for line in paragraph.splitlines():
            if lines and not line.lstrip().startswith(("- ", "* ")):
                lines[-1] += " " + line.strip()
            else:
                lines.append(line.strip())
        paragraphs.append("\n".join(lines))
    return "\n\n".join(paragraphs)


def _unwrap_help(group: typer.Typer) -> None:
    """Every command's help text of ``group`` and its sub-apps, unwrapped (``_unwrapped``)."""
    for info in group.registered_commands:
        text = info.help or (info.callback.__doc__ if info.callback else None)
        if text:
            info.help = _unwrapped(text)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _unwrap_help(sub.typer_instance)


_unwrap_help(app)


def _terminated(signum: int, _frame: object) -> None:
    """SIGTERM unwinds like Ctrl-C, so an import or collector run in progress is rolled back
    and recorded as failed instead of being left ``running``."""
    raise SystemExit(128 + signum)


def main() -> None:
    signal.signal(signal.SIGTERM, _terminated)
    app()
