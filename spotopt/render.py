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
import unicodedata
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


def usd_decimals(value: float) -> int:
    """The decimals ``usd`` shows ``value`` with: cents from $1 up, three significant digits
    below (at least cents), so a job that cost $0.00443 does not read as $0.00."""
    if value == 0 or abs(value) >= 1:
        return 2
    return max(2, 2 - math.floor(math.log10(abs(value))))


def usd(value: float | None, decimals: int | None = None) -> str:
    """The one money format of spotopt's tables and messages: ``$1,234.57``, ``$0.443``,
    ``$0.00443`` (``usd_decimals``, trailing zeros past the cents dropped; or exactly
    ``decimals``, so a column's amounts line up), ``–`` for none. CSV and JSON keep full precision."""
    if value is None or not math.isfinite(value):
        return "–"
    places = usd_decimals(value) if decimals is None else decimals
    text = f"{abs(value):,.{places}f}"
    if decimals is None and places > 2:
        text = text.rstrip("0").ljust(text.index(".") + 3, "0")
    return f"{'-' if value < 0 and float(text.replace(',', '')) else ''}${text}"


def usd_summed(amounts: Sequence[float]) -> tuple[list[float], int]:
    """``amounts`` rounded to one number of decimals (the most ``usd`` needs for any of them or
    their total) so that they add up: written with ``usd(x, decimals)``, the amounts shown sum
    to their sum shown, exactly, where rounding each alone made a ledger of rows at $0.00 that
    summed to $0.02. Largest remainder: each amount is rounded up or down, off by less than one
    unit of its last digit. Also the decimals."""
    total = sum(amounts, 0.0)
    places = max((usd_decimals(a) for a in [*amounts, total] if a), default=2)
    scale = 10**places
    exact = [a * scale for a in amounts]
    units = [math.floor(e) for e in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: units[i] - exact[i])
    for i in by_remainder[: max(round(total * scale) - sum(units), 0)]:
        units[i] += 1
    return [u / scale for u in units], places


_ESCAPED = frozenset({"Cc", "Cf", "Zl", "Zp", "Co", "Cn", "Cs"})


def shown(text: str) -> str:
    """User text as written but safe in one line of a terminal: control, bidirectional and
    other invisible characters escaped as ``repr`` writes them (``\\n``, ``\\u202e``), so a
    job name can neither forge an ``error:`` line nor reverse the rest of the message."""
    return "".join(
        ch.encode("unicode_escape").decode("ascii") if unicodedata.category(ch) in _ESCAPED else ch
        for ch in text
    )


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
    clip: Sequence[str] = (),
    out: TextIO | None = None,
) -> None:
    """Print ``data`` (rows: a list, any iterable of dicts, or a DataFrame) as ``fmt``.

    ``columns`` picks and orders the columns of table and CSV. CSV and JSON are written row by
    row as ``data`` yields them, so a generator of millions of rows streams in constant memory.
    An empty table prints ``empty`` (what the emptiness means and how to get rows) or "no rows".
    A table leaves out the ``wide_only`` columns unless ``wide`` (``--wide``), and says so in its
    caption; CSV and JSON always hold every column. The ``clip`` columns hold free text (a run
    command) that a table cuts with an ellipsis to fit the screen rather than wrap over lines;
    CSV, JSON and the ``wide`` table keep it whole.
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
        columns_ = [_Column(c, [row.get(c) for row in listed], clip=c in clip and not wide) for c in cols]
        if listed:
            console.print(_fitted_table(console, title, caption, columns_))
        else:
            console.print(Text(f"{title + ': ' if title else ''}{empty or 'no rows'}", style="dim"))


CLIP_MIN = 12
"""The fewest cells a clipped column keeps (its text's start and the ellipsis)."""


class _Column:
    """One table column: its name as a header, its cells formatted as a whole (``_column_cells``)
    and how they may break. A cell of times (``2024-05-01 12:00``) is one word: a date is never
    split. A clipped column's cells never wrap: cut to the width left, with an ellipsis."""

    def __init__(self, name: str, values: list[Any], *, clip: bool = False) -> None:
        self.name, self.header, self.clip = name, _header(name), clip
        self.cells, self.whole = _column_cells(values)
        texts = [self.header, *self.cells]
        self.line = max(map(_widest_line, texts))
        """The width every cell needs to stay on one line."""
        words = [w for text in texts for w in text.split()]
        if self.whole:
            words += [line for cell in self.cells for line in cell.splitlines()]
        self.word = max(map(cell_len, words or [""]))
        """The width below which a word would be cut."""
        if clip:
            self.word = max(map(cell_len, self.header.split() or [""]))
            self.word = max(self.word, min(CLIP_MIN, self.line))


def _column_cells(values: list[Any]) -> tuple[list[str], bool]:
    """Format one table column as a whole, so its cells agree with each other: a column of
    whole numbers (counts, GPUs, even when pandas made them floats) prints as integers, a column
    of times as compact UTC (``2024-05-01 12:00``, or just the date when every time is midnight).
    Also whether it is a column of times (never broken inside a cell)."""
    plain = [_scalar(v) for v in values]
    present = [v for v in plain if v is not None]
    if present and all(isinstance(v, datetime) for v in present):
        times = [v.astimezone(UTC) for v in present]
        if all(t.hour == t.minute == t.second == 0 for t in times):
            pattern = "%Y-%m-%d"
        else:
            pattern = "%Y-%m-%d %H:%M" if all(t.second == 0 for t in times) else "%Y-%m-%d %H:%M:%S"
        return ["–" if v is None else v.astimezone(UTC).strftime(pattern) for v in plain], True
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present)
    if present and numbers and all(float(v).is_integer() for v in present):
        return ["–" if v is None else f"{int(v):,}" for v in plain], False
    return ["–" if v is None else _number(v) if isinstance(v, float) else str(v) for v in plain], False


def _fitted_table(console: Console, title: str | None, caption: str | None, columns: list[_Column]) -> Table:
    """The rows as a table that fits the console without cutting a word (a name, a date):
    a table wider than the screen wraps into garbage, and a name folded mid-word
    (``transfor / mer``) reads as two. Too wide, the columns with one value in every row (the
    cloud, the region, the market of a one-market report; never a clipped one) move into the
    caption, once each;
    still too wide, each row is shown as a block of fields and values, rows apart."""
    if _fits(console, columns):
        return _unfolded(console, title, caption, columns)
    rows = len(columns[0].cells)
    same = [c for c in columns if len(set(c.cells)) == 1 and not c.clip] if rows > 1 else []
    if same and len(same) < len(columns):
        common = " · ".join(f"{c.header} {c.cells[0]}" for c in same)
        caption = f"{common}; {caption}" if caption else common
        columns = [c for c in columns if c not in same]
        if _fits(console, columns):
            return _unfolded(console, title, caption, columns)
    table = Table(title=_text(title), caption=_text(caption), show_header=rows == 1)
    table.add_column("field", no_wrap=True)
    table.add_column("value", overflow="fold")
    for i in range(rows):
        for n, column in enumerate(columns):
            table.add_row(Text(column.header), Text(column.cells[i]), end_section=n == len(columns) - 1)
    return table


def _room(console: Console, columns: list[_Column]) -> int:
    """The cells' share of the screen: a space either side of a cell and a rule between."""
    return console.width - (3 * len(columns) + 1)


def _fits(console: Console, columns: list[_Column]) -> bool:
    return sum(c.word for c in columns) <= _room(console, columns)


def _unfolded(console: Console, title: str | None, caption: str | None, columns: list[_Column]) -> Table:
    """The table, with column widths that fold as few words as the screen allows (its longest
    words fit: ``_fits``).

    Rich shrinks a table wider than the screen by narrowing its widest columns first, below
    their longest word: at 80 columns ``whatif --example`` folded every strategy
    ("uniform-p / rogress") while a column of ``–`` kept room to spare. Here each column gets
    its longest word, then what its cells need to stay on one line (a row of one line reads
    best), then a share of the room left in proportion to what its header needs; headers wrap
    between words. Where not every cell fits on one line, the narrow columns keep theirs and the
    widest give way, down to their longest word (a clipped column: down to ``CLIP_MIN``)."""
    table = _table(title, caption, columns)
    room = _room(console, columns)
    line = [c.line for c in columns]
    if sum(line) <= room:
        return table  # rich's own widths fold nothing
    word = [c.word for c in columns]
    one_line = [max([c.word, *map(_widest_line, c.cells)]) for c in columns]
    if sum(one_line) > room:
        widths = _levelled(one_line, word, room)
    else:
        want = [g - f for f, g in zip(one_line, line, strict=True)]
        spare = room - sum(one_line)
        widths = [f + spare * w // max(sum(want), 1) for f, w in zip(one_line, want, strict=True)]
        short = sorted(range(len(columns)), key=lambda i: widths[i] - line[i])  # what rounding left
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


def _header(col: str) -> str:
    """A column's name as people read it: ``usd_per_gpu_hour`` is ``usd per gpu hour``."""
    return col.replace("_", " ")


def _table(title: str | None, caption: str | None, columns: list[_Column]) -> Table:
    table = Table(title=_text(title), caption=_text(caption))
    for column in columns:
        # Headers wrap between words (usd per gpu hour), never inside one.
        table.add_column(
            column.header,
            overflow="ellipsis" if column.clip else "fold",
            no_wrap=column.clip or column.whole,
            min_width=max(map(len, column.header.split())),
        )
    for line in zip(*(c.cells for c in columns), strict=True):
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
    ``label`` such as ``error:`` or ``warning:``; on stderr with ``err``. Invisible characters
    are escaped (``shown``); the message's own line breaks stay, so the user text in it must
    come through ``shown`` where it is put in (a name with a line break in it)."""
    line = Text()
    if label:
        line.append(label, style=style or None)
        line.append(" " if message else "")
    line.append("\n".join(map(shown, message.split("\n"))))
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
