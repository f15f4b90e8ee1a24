"""The ``spotopt`` command: global options, error mapping and the sub-apps."""

from __future__ import annotations

import importlib.metadata
import inspect
import math
import signal
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from typer._click.exceptions import NoArgsIsHelpError, UsageError  # typer vendors click
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
    notify,
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

    Arguments and option values typer refuses are one such line too, ``error: --period: ...``
    naming the option, exit 2 (typer drew a five-line box around them).
    """

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        """The root's own options (``--db``); each command's are parsed in ``invoke``."""
        try:
            return super().parse_args(ctx, args)
        except NoArgsIsHelpError:
            raise  # the help itself
        except UsageError as exc:
            say(_usage_line(exc), label="error:", style="bold red", err=True)
            raise typer.Exit(exc.exit_code) from exc

    def invoke(self, ctx: Any) -> Any:  # click.Context, vendored by typer
        try:
            return super().invoke(ctx)
        except NoArgsIsHelpError:
            raise  # the help itself
        except UsageError as exc:
            say(_usage_line(exc), label="error:", style="bold red", err=True)
            raise typer.Exit(exc.exit_code) from exc
        except SpotoptError as exc:
            say(str(exc), label="error:", style="bold red", err=True)
            raise typer.Exit(exc.exit_code) from exc
        finally:
            if isinstance(ctx.obj, State):
                ctx.obj.close()


def _usage_line(exc: UsageError) -> str:
    """A refused argument or option as one line: the option, what is wrong (without the
    "Value error, " that typer's pydantic validation puts before our own words) and where help
    is. A NaN is "not a number": the range check failed on it, and the bound it named (``less
    than or equal to 100``) had nothing to do with it."""
    param = getattr(exc, "param", None)
    message = exc.message.removeprefix("Value error, ") or "missing"
    cause = exc.__cause__
    if isinstance(cause, ValidationError) and _is_nan(cause.errors()[0].get("input")):
        message = f"{cause.errors()[0]['input']!r} is not a number; give a number"
    name = None
    if param is not None and param.param_type_name == "option" and param.opts:
        name = param.opts[0]
    elif param is not None:
        name = (param.metavar or param.name).upper()
    command = f"; see `{exc.ctx.command_path} --help`" if exc.ctx is not None else ""
    return f"{name + ': ' if name else ''}{message.rstrip('.')}{command}"


def _is_nan(value: object) -> bool:
    try:
        return math.isnan(float(value))  # type: ignore[arg-type]  # anything typer was given
    except (TypeError, ValueError):
        return False


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
app.add_typer(notify.app, name="notify")
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
