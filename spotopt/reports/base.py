"""What a report is: typed parameters, Core statements written once, pandas post-processing.

A report never writes to the database. ``statements`` builds the SQLAlchemy Core queries from
parsed parameters (the same objects ``spotopt report sql`` compiles for a dialect), and
``compute`` turns their results into one or more named DataFrames ("sections"). Splitting the
two keeps the SQL inspectable and lets the tests compare a report with the SQL views.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeAlias

import pandas as pd
from sqlalchemy import Select
from sqlalchemy.orm import Session

from spotopt.errors import InputError
from spotopt.registry import did_you_mean

Args = Mapping[str, Any]
AnySelect: TypeAlias = "Select[*tuple[Any, ...]]"


@dataclass(frozen=True, slots=True)
class Param:
    """One ``--param name=value``. ``parse`` raises ``InputError`` naming the parameter."""

    name: str
    help: str
    parse: Callable[[str, str, datetime], Any]
    """(parameter name, text, now) -> value; ``now`` anchors relative times like ``-7d``."""
    default: str | None = None
    """Text parsed when the parameter is not given; None means "not set" (the value is None)."""
    required: bool = False


@dataclass
class ReportResult:
    """Named tables (sections) plus what the data covers, for titles and plot captions."""

    sections: dict[str, pd.DataFrame]
    since: datetime | None
    until: datetime | None
    sources: list[str] = field(default_factory=list)
    """Distinct ``source`` values of the rows the report read (collectors, imports, catalog)."""
    title: str = ""
    notes: list[str] = field(default_factory=list)
    """What a reader should know to read the rows right (a state carried from before the
    window, say): shown on stderr beside the table, never in the data that scripts parse."""

    def describe_span(self) -> str:
        """``2024-05-01 00:00 – 2024-05-08 00:00 UTC, source aws-spot`` for titles."""

        def fmt(t: datetime | None) -> str:
            return t.strftime("%Y-%m-%d %H:%M") if t is not None else "…"

        src = ", ".join(self.sources) if self.sources else "no data"
        return f"{fmt(self.since)} – {fmt(self.until)} UTC, source {src}"


@dataclass(frozen=True, slots=True)
class Report:
    """A registered report; ``name`` is kebab-case and is the CLI name."""

    name: str
    summary: str
    params: tuple[Param, ...]
    statements: Callable[[Args], dict[str, AnySelect]]
    """Parsed parameters -> the named Core statements this report runs."""
    compute: Callable[[dict[str, pd.DataFrame], Args], ReportResult]
    """Statement results (one DataFrame per statement name) -> the report's sections."""
    plot: Callable[[ReportResult, Args, Path], None] | None = None
    resolve: Callable[[dict[str, Any]], None] | None = None
    """Checks and defaults that involve several parameters (e.g. ``since`` before ``until``)."""

    def parse(self, given: Mapping[str, str], now: datetime | None = None) -> dict[str, Any]:
        """Validate ``given`` (name -> text) against the declared parameters; fill in defaults."""
        by_name = {p.name: p for p in self.params}
        for name in given:
            if name not in by_name:
                valid = ", ".join(by_name) or "none"
                raise InputError(
                    f"report {self.name}: unknown parameter {name!r}{did_you_mean(name, by_name)}; "
                    f"valid parameters: {valid}"
                )
        now = now or datetime.now(UTC)
        args: dict[str, Any] = {"now": now}
        for p in self.params:
            text = given.get(p.name, p.default)
            if text is None:
                if p.required:
                    raise InputError(f"report {self.name}: parameter {p.name!r} is required ({p.help})")
                args[p.name] = None
            else:
                args[p.name] = p.parse(p.name, text, now)
        if self.resolve is not None:
            self.resolve(args)
        return args

    def run(self, session: Session, args: Args) -> ReportResult:
        frames = {}
        connection = session.connection()
        for name, stmt in self.statements(args).items():
            result = connection.execute(stmt)
            # The DBAPI rows as they are: report statements select only columns that need no
            # SQLAlchemy result processing (times come through ``sql.raw``), and skipping the
            # Row objects makes a 200 000-row fetch several times faster.
            rows = result.cursor.fetchall()
            frames[name] = pd.DataFrame.from_records(rows, columns=list(result.keys()), coerce_float=True)
            result.close()
        return self.compute(frames, args)


def parse_pairs(pairs: Sequence[str]) -> dict[str, str]:
    """``["gpu=V100", "bucket=day"]`` -> dict; a pair without ``=`` or given twice is an error."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError(f"--param {pair!r} is not name=value (e.g. --param gpu=V100)")
        if name in out:
            raise InputError(f"--param {name} given twice")
        out[name] = value.strip()
    return out
