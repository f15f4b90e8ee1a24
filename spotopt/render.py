"""One place that turns results into output: a rich table, CSV or JSON.

Listings are lists of flat dicts (or a pandas DataFrame). Datetimes print as ISO 8601 UTC
with a ``Z``; floats keep full precision in CSV/JSON and are rounded for the eye in tables.

Everything printed here that came from the user or the history (cells, titles, error messages)
is plain text, never rich markup: a job named ``[exp1] resnet`` or a CSV cloud ``[/x]`` prints
as written. Only the fixed labels spotopt itself writes carry styles. JSON is strict (RFC 8259):
non-finite floats become ``null``, so every ``--format json`` output parses anywhere.
"""

from __future__ import annotations

import csv
import itertools
import json
import logging
import math
import sys
import textwrap
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table
from rich.text import Text


class Format(StrEnum):
    TABLE = "table"
    CSV = "csv"
    JSON = "json"


def iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _plain(value: Any) -> Any:
    """JSON/CSV-safe value: datetimes to ISO strings, NaN and ±inf to None, numpy scalars to Python."""
    if isinstance(value, datetime):
        return iso(value)
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _cell(value: Any) -> str:
    value = _plain(value)
    if value is None:
        return "–"
    if isinstance(value, float):
        if value == 0 or abs(value) >= 1000:
            return f"{value:,.2f}"
        return f"{value:.4g}" if abs(value) < 0.01 else f"{value:.4f}".rstrip("0").rstrip(".")
    return str(value)


def to_json(data: Any) -> str:
    def default(obj: Any) -> Any:
        plain = _plain(obj)
        if plain is obj:
            raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
        return plain

    return json.dumps(_deep_plain(data), indent=2, default=default, allow_nan=False)


def _deep_plain(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {str(k): _deep_plain(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_deep_plain(v) for v in data]
    return _plain(data)


def records(data: Any) -> list[dict[str, Any]]:
    """Accept a list of dicts or a DataFrame; return a list of dicts."""
    return list(_iter_records(data))


def _iter_records(data: Any) -> Iterator[dict[str, Any]]:
    if hasattr(data, "to_dict") and hasattr(data, "columns"):
        yield from data.to_dict(orient="records")
    else:
        yield from data


def render(
    data: Any,
    fmt: Format | str = Format.TABLE,
    *,
    title: str | None = None,
    columns: Sequence[str] | None = None,
    caption: str | None = None,
    empty: str | None = None,
    out: TextIO | None = None,
) -> None:
    """Print ``data`` (rows: a list, any iterable of dicts, or a DataFrame) as ``fmt``.

    ``columns`` picks and orders the columns of table and CSV. CSV and JSON are written row by
    row as ``data`` yields them, so a generator of millions of rows streams in constant memory.
    An empty table prints ``empty`` (what the emptiness means and how to get rows) or "no rows".
    """
    out = out or sys.stdout
    fmt = Format(fmt)
    rows = _iter_records(data)
    if fmt is Format.JSON:
        _write_json_rows(rows, out)
    elif fmt is Format.CSV:
        first = next(rows, None)
        cols = list(columns) if columns else (list(first) if first else [])
        writer = csv.DictWriter(out, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in itertools.chain([first] if first else [], rows):
            writer.writerow({c: _plain(row.get(c)) for c in cols})
    else:
        listed = list(rows)
        cols = list(columns) if columns else (list(listed[0]) if listed else [])
        table = Table(title=_text(title), caption=_text(caption))
        for col in cols:
            table.add_column(col, overflow="fold")
        for row in listed:
            table.add_row(*(Text(_cell(row.get(c))) for c in cols))
        console = Console(file=out, width=max(120, Console().width))
        if listed:
            console.print(table)
        else:
            console.print(Text(f"{title + ': ' if title else ''}{empty or 'no rows'}", style="dim"))


def _write_json_rows(rows: Iterator[dict[str, Any]], out: TextIO) -> None:
    """Exactly ``to_json(list(rows))``, written one row at a time."""
    first = True
    for row in rows:
        out.write(("[\n" if first else ",\n") + textwrap.indent(to_json(row), "  "))
        first = False
    out.write("[]\n" if first else "\n]\n")


def _text(value: str | None) -> Text | None:
    return None if value is None else Text(value)


def say(message: str, *, label: str = "", style: str = "", err: bool = False) -> None:
    """Print one line of plain ``message`` (never parsed as markup) after an optional styled
    ``label`` such as ``error:`` or ``warning:``; on stderr with ``err``."""
    line = Text()
    if label:
        line.append(label, style=style or None)
        line.append(" " if message else "")
    line.append(message)
    Console(stderr=err).print(line, highlight=False, soft_wrap=True)


class SayHandler(logging.Handler):
    """Log records of the library (e.g. "another spotopt process is writing") as ``say`` lines
    on stderr, labelled with their level."""

    def emit(self, record: logging.LogRecord) -> None:
        say(record.getMessage(), label=f"{record.levelname.lower()}:", style="yellow", err=True)


def show_library_log() -> None:
    """Route the ``spotopt`` logger (warnings and above) to stderr through ``SayHandler``, once."""
    logger = logging.getLogger("spotopt")
    if not any(isinstance(h, SayHandler) for h in logger.handlers):
        logger.addHandler(SayHandler(logging.WARNING))
        logger.propagate = False
