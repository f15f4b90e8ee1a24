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
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TextIO

from rich.cells import cell_len
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
    """JSON/CSV-safe value: datetimes to ISO strings, NaN, ±inf and NaT to None, numpy scalars to Python."""
    value = _scalar(value)
    return iso(value) if isinstance(value, datetime) else value


def _scalar(value: Any) -> Any:
    """A table value as Python: numpy scalars unwrapped, NaN/inf/NaT as None, datetimes kept."""
    if isinstance(value, datetime):
        return None if value != value else value  # NaT is a datetime unequal to itself
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _number(value: float) -> str:
    """A float for the eye: 2 decimals from 10 up, 4 below, 3 significant digits under 0.01."""
    if value == 0:
        return "0"
    if abs(value) >= 10:
        return f"{value:,.2f}"
    if abs(value) < 0.01:
        return f"{value:.3g}"
    return f"{value:.4f}".rstrip("0").rstrip(".")


def _column_cells(values: list[Any]) -> list[str]:
    """Format one table column as a whole, so its cells agree with each other: a column of
    whole numbers (counts, GPUs, even when pandas made them floats) prints as integers, a column
    of times as compact UTC (``2024-05-01 12:00``, or just the date when every time is midnight)."""
    plain = [_scalar(v) for v in values]
    present = [v for v in plain if v is not None]
    if present and all(isinstance(v, datetime) for v in present):
        times = [v.astimezone(UTC) for v in present]
        if all(t.hour == t.minute == t.second == 0 for t in times):
            pattern = "%Y-%m-%d"
        else:
            pattern = "%Y-%m-%d %H:%M" if all(t.second == 0 for t in times) else "%Y-%m-%d %H:%M:%S"
        return ["–" if v is None else v.astimezone(UTC).strftime(pattern) for v in plain]
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)
    if present and numbers and all(float(v).is_integer() for v in present):
        return ["–" if v is None else f"{int(v):,}" for v in plain]
    return ["–" if v is None else _number(v) if isinstance(v, float) else str(v) for v in plain]


def to_json(data: Any) -> str:
    def default(obj: Any) -> Any:
        plain = _plain(obj)
        if plain is obj:
            raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
        return plain

    return json.dumps(_deep_plain(data), indent=2, default=default, allow_nan=False)


# Fields stored as floats (a GPU count can be 0.25 on a shared GPU) that are whole numbers almost
# always: written as 1, not 1.0.
_WHOLE_WHEN_INTEGRAL = frozenset({"gpu_count"})


def _field(key: object, value: Any) -> Any:
    plain = _plain(value)
    if key in _WHOLE_WHEN_INTEGRAL and isinstance(plain, float) and plain.is_integer():
        return int(plain)
    return plain


def _deep_plain(data: Any) -> Any:
    if isinstance(data, Mapping):
        return {
            str(k): _deep_plain(v) if isinstance(v, (Mapping, list, tuple)) else _field(k, v)
            for k, v in data.items()
        }
    if isinstance(data, (list, tuple)):
        return [_deep_plain(v) for v in data]
    return _plain(data)


def _iter_records(data: Any) -> Iterator[dict[str, Any]]:
    """Rows of a list or iterable of dicts, or of a DataFrame, one at a time."""
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
    wide_only: Sequence[str] = (),
    wide: bool = False,
    out: TextIO | None = None,
) -> None:
    """Print ``data`` (rows: a list, any iterable of dicts, or a DataFrame) as ``fmt``.

    ``columns`` picks and orders the columns of table and CSV. CSV and JSON are written row by
    row as ``data`` yields them, so a generator of millions of rows streams in constant memory.
    An empty table prints ``empty`` (what the emptiness means and how to get rows) or "no rows".
    A table leaves out the ``wide_only`` columns unless ``wide`` (``--wide``), and says so in its
    caption; CSV and JSON always hold every column.
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
            writer.writerow({c: _field(c, row.get(c)) for c in cols})
    else:
        listed = list(rows)
        cols = list(columns) if columns else (list(listed[0]) if listed else [])
        hidden = [c for c in cols if c in wide_only and not wide]
        if hidden:
            cols = [c for c in cols if c not in hidden]
            more = f"--wide adds {', '.join(hidden)}"
            caption = f"{caption}; {more}" if caption else more
        console = _console(out)
        cells = [_column_cells([row.get(c) for row in listed]) for c in cols]
        if listed:
            console.print(_fitted_table(console, title, caption, cols, cells))
        else:
            console.print(Text(f"{title + ': ' if title else ''}{empty or 'no rows'}", style="dim"))


def _fitted_table(
    console: Console, title: str | None, caption: str | None, cols: list[str], cells: list[list[str]]
) -> Table:
    """The rows as a table that fits the console where it can: a table wider than the screen
    wraps into garbage. Too wide, the columns with one value in every row (the cloud, the
    region, the market of a one-market report) move into the caption, once each; a single row
    too wide is shown as a column of fields and values."""
    table = _table(title, caption, cols, cells)
    if _min_width(console, table) <= console.width:
        return _unfolded(console, table, cols, cells)
    if len(cells[0]) == 1:
        fields = [[_header(c) for c in cols], [column[0] for column in cells]]
        return _unfolded(
            console, _table(title, caption, ["field", "value"], fields), ["field", "value"], fields
        )
    same = [i for i, column in enumerate(cells) if len(set(column)) == 1]
    if not same or len(same) == len(cols):
        return _unfolded(console, table, cols, cells)
    common = " · ".join(f"{_header(cols[i])} {cells[i][0]}" for i in same)
    keep = [i for i in range(len(cols)) if i not in same]
    caption = f"{common}; {caption}" if caption else common
    cols, cells = [cols[i] for i in keep], [cells[i] for i in keep]
    return _unfolded(console, _table(title, caption, cols, cells), cols, cells)


def _unfolded(console: Console, table: Table, cols: list[str], cells: list[list[str]]) -> Table:
    """``table`` with column widths that fold as few words as the screen allows.

    Rich shrinks a table wider than the screen by narrowing its widest columns first, below
    their longest word: at 80 columns ``whatif --example`` folded every strategy
    ("uniform-p / rogress") while a column of ``–`` kept room to spare. Here each column gets
    its longest word, then what its cells need to stay on one line (a row of one line reads
    best), then a share of the room left in proportion to what its header needs; headers wrap
    between words. Where not every cell fits on one line, the narrow columns keep theirs and the
    widest give way, down to their longest word; where not even the longest words all fit, only
    the longest are cut, to one width."""
    heads = [_header(col) for col in cols]
    word = [
        max(cell_len(w) for text in [head, *column] for w in text.split() or [""])
        for head, column in zip(heads, cells, strict=True)
    ]
    room = console.width - (3 * len(cols) + 1)  # a space either side of a cell and a rule between
    line = [max(map(_widest_line, [head, *column])) for head, column in zip(heads, cells, strict=True)]
    if sum(line) <= room or room < len(cols):
        return table  # rich's own widths fold nothing, or no widths can help
    one_line = [max([w, *map(_widest_line, column)]) for w, column in zip(word, cells, strict=True)]
    if sum(word) > room:
        widths = _levelled(word, [1] * len(cols), room)
    elif sum(one_line) > room:
        widths = _levelled(one_line, word, room)
    else:
        want = [g - f for f, g in zip(one_line, line, strict=True)]
        spare = room - sum(one_line)
        widths = [f + spare * w // max(sum(want), 1) for f, w in zip(one_line, want, strict=True)]
        short = sorted(range(len(cols)), key=lambda i: widths[i] - line[i])  # what rounding left
        for i in short[: room - sum(widths)]:
            widths[i] += 1
    for column, width in zip(table.columns, widths, strict=True):
        column.width = width
    return table


def _widest_line(text: str) -> int:
    """The width of a cell's widest line (a cell may hold several: ``jobs show``'s moves)."""
    return max((cell_len(part) for part in text.splitlines()), default=0)


def _levelled(need: list[int], floor: list[int], room: int) -> list[int]:
    """Widths that sum to at most ``room`` (less than ``sum(need)``, at least ``sum(floor)``):
    each column its ``need`` up to a common cap, never below its ``floor``, the cap as high as
    the room allows; what is left goes one by one to the capped columns. The narrow columns
    stay whole and the wide ones give way, as rich narrows them, but never below a floor."""

    def fitted(cap: int) -> list[int]:
        return [max(f, min(n, cap)) for n, f in zip(need, floor, strict=True)]

    cap = max(c for c in range(max(need) + 1) if sum(fitted(c)) <= room)
    widths = fitted(cap)
    capped = [i for i, n in enumerate(need) if n > widths[i]]
    for i in capped[: room - sum(widths)]:
        widths[i] += 1
    return widths


def _min_width(console: Console, table: Table) -> int:
    """The width ``table`` needs without folding a word (rich's measure clamps to the console)."""
    return console.measure(table, options=console.options.update_width(1 << 16)).minimum


def _header(col: str) -> str:
    """A column's name as people read it: ``usd_per_gpu_hour`` is ``usd per gpu hour``."""
    return col.replace("_", " ")


def _table(title: str | None, caption: str | None, cols: list[str], cells: list[list[str]]) -> Table:
    table = Table(title=_text(title), caption=_text(caption))
    for col in cols:
        # Headers wrap between words (usd per gpu hour), never inside one.
        header = _header(col)
        table.add_column(header, overflow="fold", min_width=max(map(len, header.split())))
    for line in zip(*cells, strict=True):
        table.add_row(*map(Text, line))
    return table


def _write_json_rows(rows: Iterator[dict[str, Any]], out: TextIO) -> None:
    """Exactly ``to_json(list(rows))``, written one row at a time."""
    first = True
    for row in rows:
        out.write(("[\n" if first else ",\n") + textwrap.indent(to_json(row), "  "))
        first = False
    out.write("[]\n" if first else "\n]\n")


def _console(out: TextIO) -> Console:
    """A terminal's own width (a table wider than the screen wraps into garbage); when output
    goes to a file or a pipe, at least 120 columns."""
    console = Console(file=out)
    return console if console.is_terminal else Console(file=out, width=max(120, console.width))


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
