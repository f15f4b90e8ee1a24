"""Reading dump files in constant memory: plain or gzip, JSON documents or JSON Lines, CSV.

Cloud dumps can be gigabytes, so nothing here reads a whole file: JSON documents are parsed as an
event stream (``ijson``), JSON Lines and CSV line by line. Every item comes with its location
(``Items[17]``, ``line 18``, ``page 2: Items[3]``) so errors can point at it, and every read
reports the number of *file* bytes consumed (compressed bytes for ``.gz``) to drive a progress bar.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import zlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import ijson

from spotopt.errors import InputError

ProgressCallback = Callable[[int], None]
log = logging.getLogger("spotopt")

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"
# A first line up to this size that is a complete JSON value marks the file as JSON Lines.
_PEEK_BYTES = 1 << 20
# A JSON Lines line is parsed whole, so its size is bounded; documents have no bound.
_MAX_LINE_BYTES = 64 << 20
# An object that lacks the expected array is read whole as one item; items are small.
_MAX_ITEM_EVENTS = 100_000
# Errors a damaged file raises while being read or decompressed.
_READ_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError)


class _CountingReader(io.RawIOBase):
    """Passes reads through and reports how many bytes of the underlying file were consumed."""

    def __init__(self, raw: BinaryIO, on_bytes: ProgressCallback | None) -> None:
        self._raw = raw
        self._on_bytes = on_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        if self._on_bytes is not None and data:
            self._on_bytes(len(data))
        return len(data)


def file_size(path: Path) -> int:
    """Bytes on disk (the progress bar's total); raises ``InputError`` for a missing file."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read it ({exc.strerror})") from None


@contextmanager
def open_binary(path: Path, on_bytes: ProgressCallback | None = None) -> Iterator[BinaryIO]:
    """Open ``path`` for reading, transparently decompressing gzip (recognised by its magic bytes)."""
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a dump file")
    try:
        raw = path.open("rb")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot open it ({exc.strerror})") from None
    with raw:
        gzipped = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
        counted = io.BufferedReader(_CountingReader(raw, on_bytes), buffer_size=1 << 16)
        if gzipped:
            with gzip.GzipFile(fileobj=counted, mode="rb") as unpacked:
                yield unpacked  # type: ignore[misc]
        else:
            yield counted


class _Prefixed:
    """A stream that first returns ``head`` (bytes already peeked at), then the rest of ``tail``."""

    def __init__(self, head: bytes, tail: BinaryIO) -> None:
        self._head = head
        self._tail = tail

    def read(self, size: int = -1) -> bytes:
        if self._head:
            if size < 0 or size >= len(self._head):
                head, self._head = self._head, b""
                return head + (self._tail.read(size - len(head)) if size > 0 else b"")
            head, self._head = self._head[:size], self._head[size:]
            return head
        return self._tail.read(size)


@dataclass(frozen=True)
class DumpFormat:
    """A JSON dump format: where its items are, which fields mark an item, and which field of a
    page says that more pages follow (the dump then holds only part of the answer)."""

    command: str
    what: str
    array_key: str
    item_keys: frozenset[str]
    more_key: str
    value_label: str = "document"


AWS_SPOT_HISTORY = DumpFormat(
    "aws-spot-history",
    "an AWS describe-spot-price-history answer",
    "SpotPriceHistory",
    frozenset({"SpotPrice", "InstanceType", "AvailabilityZone", "ProductDescription", "Timestamp"}),
    "NextToken",
)
AZURE_RETAIL = DumpFormat(
    "azure-retail",
    "an Azure Retail Prices API page",
    "Items",
    frozenset({"retailPrice", "unitPrice", "armSkuName", "skuName", "serviceName", "meterName"}),
    "NextPageLink",
    value_label="page",
)
FORMATS = (AWS_SPOT_HISTORY, AZURE_RETAIL)


def describe(value: Any) -> str:
    """What a JSON value looks like to a person: a known dump or item, else its keys or type."""
    if isinstance(value, Mapping):
        for fmt in FORMATS:
            if fmt.array_key in value:
                return f"{fmt.what} (import it with `spotopt import {fmt.command}`)"
            if fmt.item_keys & value.keys():
                return f"an item of {fmt.what} (import it with `spotopt import {fmt.command}`)"
        keys = ", ".join(sorted(map(str, value))[:6]) or "none"
        return f"an object with the keys {keys}"
    return f"a JSON {type(value).__name__}"


@dataclass
class _PageEnd:
    """Marker the parsers yield after each document: its fields other than the item array."""

    fields: Mapping[str, Any]


def iter_json_items(
    path: Path, fmt: DumpFormat, on_bytes: ProgressCallback | None = None
) -> Iterator[tuple[str, Any]]:
    """Yield ``(where, item)`` for every item of a JSON dump, in file order, in constant memory.

    Accepted shapes, each plain or gzip: a document ``{array_key: [items], ...}`` (as the cloud
    APIs return a page), several such documents concatenated, a bare array of items, JSON Lines
    whose lines are items, documents or arrays. ``where`` is prefixed with the file name. A file
    that is not JSON raises ``InputError`` naming the file and the line or the last good item; a
    file of another format (an object with none of ``fmt.item_keys``) raises one saying what it
    looks like. When the last page says more pages follow (``fmt.more_key``), a warning says
    that the dump holds only part of the answer.
    """
    name = path.name
    more: Any = None
    with open_binary(path, on_bytes) as stream:
        try:
            head, first = _first_line(stream)
            if first is not None:
                found = _json_lines(name, head, first, stream, fmt.array_key)
            else:
                found = _json_stream(name, _Prefixed(head, stream), fmt.array_key, fmt.value_label)
            for where, item in found:
                if isinstance(item, _PageEnd):
                    more = item.fields.get(fmt.more_key)
                    continue
                if isinstance(item, Mapping) and not fmt.item_keys & item.keys():
                    raise InputError(
                        f"{where}: not an item of {fmt.what} (none of {', '.join(sorted(fmt.item_keys))}); "
                        f"this looks like {describe(item)}"
                    )
                yield where, item
        except _READ_ERRORS as exc:
            raise InputError(f"{name}: cannot read it: {exc} (a damaged or truncated file?)") from None
    if more:
        log.warning(
            "%s: %s is set in the last %s: this dump is one page of a longer answer and the rest "
            "is not in it (dump every page, e.g. without --max-items)",
            name,
            fmt.more_key,
            fmt.value_label,
        )


def _first_line(stream: BinaryIO) -> tuple[bytes, tuple[int, Any] | None]:
    """Peek at the first non-blank line: its bytes, and (line number, value) if it is a whole JSON value."""
    line_no = 0
    consumed = b""
    while True:
        line = stream.readline(_PEEK_BYTES)
        line_no += 1
        if line_no == 1 and line.startswith(_BOM):
            line = line[len(_BOM) :]
        consumed += line
        if not line or line.strip():
            break
    complete = line.endswith(b"\n") or len(line) < _PEEK_BYTES
    if not line.strip() or not complete:
        return consumed, None
    try:
        return consumed, (line_no, json.loads(line))
    except (ValueError, RecursionError):
        return consumed, None


def _json_lines(
    name: str, head: bytes, first: tuple[int, Any], stream: BinaryIO, array_key: str
) -> Iterator[tuple[str, Any]]:
    line_no, value = first
    yield from _items_of_value(f"{name}: line {line_no}", value, array_key)
    while True:
        line = stream.readline(_MAX_LINE_BYTES)
        if not line:
            return
        line_no += 1
        if not line.strip():
            continue
        if len(line) >= _MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise InputError(f"{name}: line {line_no}: longer than {_MAX_LINE_BYTES >> 20} MiB")
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{name}: line {line_no}: not valid JSON ({exc})") from None
        yield from _items_of_value(f"{name}: line {line_no}", value, array_key)


def _items_of_value(where: str, value: Any, array_key: str) -> Iterator[tuple[str, Any]]:
    """Items held by one JSON value: itself (an item), its array (a document), or its elements."""
    if isinstance(value, list):
        for i, item in enumerate(value):
            yield f"{where}: [{i}]", item
    elif isinstance(value, dict) and array_key in value:
        items = value[array_key]
        if not isinstance(items, list):
            raise InputError(f"{where}: {array_key}: expected an array, found {type(items).__name__}")
        for i, item in enumerate(items):
            yield f"{where}: {array_key}[{i}]", item
        yield where, _PageEnd(value)
    else:
        yield where, value


def _json_stream(name: str, stream: Any, array_key: str, value_label: str) -> Iterator[tuple[str, Any]]:
    """Stream items out of one or more JSON documents with ijson's event parser."""
    events = _Events(name, stream)
    for number, (event, value) in enumerate(events, start=1):
        where = name if number == 1 else f"{name}: {value_label} {number}"
        if event == "start_map":
            yield from _document(where, events, array_key)
        elif event == "start_array":
            yield from _array(f"{where}: ", events)
        else:
            raise InputError(f"{where}: expected a JSON object or array, found {value!r}")


class _Events:
    """ijson events with parse errors turned into ``InputError``s that name the last good item
    and the field being read (``integer overflow`` in ``SpotPrice``, not just "invalid JSON"): the
    path of keys inside the item, e.g. ``SpotPrice.x`` for a value nested in it."""

    def __init__(self, name: str, stream: Any) -> None:
        self._name = name
        self._parser = ijson.basic_parse(stream, multiple_values=True, use_float=True)
        self.last_item = ""
        self._keys: list[str | None] = []  # the key being read in each open object

    def __iter__(self) -> _Events:
        return self

    def __next__(self) -> tuple[str, Any]:
        try:
            event = next(self._parser)
        except ijson.JSONError as exc:
            after = f" after {self.last_item}" if self.last_item else " before the first complete item"
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if "premature EOF" in detail:
                raise InputError(f"{self._name}: the JSON ends early{after} (truncated?)") from None
            path = ".".join(k for k in self._keys[1:] if k is not None) or next(
                (k for k in self._keys if k is not None), ""
            )
            field = f" in field {path!r}" if self._keys and path else ""
            raise InputError(f"{self._name}: not valid JSON{field}{after} ({detail})") from None
        kind = event[0]
        if kind == "start_map":
            self._keys.append(None)
        elif kind == "end_map" and self._keys:
            self._keys.pop()
        elif kind == "map_key" and self._keys:
            self._keys[-1] = event[1]
        return event


def _document(where: str, events: _Events, array_key: str) -> Iterator[tuple[str, Any]]:
    """A top-level object: stream ``array_key``'s elements; with no such key, the object is an item."""
    others: dict[str, Any] = {}
    found = False
    prefix = f"{where}: "
    for event, key in events:
        if event == "end_map":
            break
        event, value = next(events)
        other = next((f for f in FORMATS if f.array_key == key != array_key), None)
        if other is not None:  # decided before reading what may be a million items
            raise InputError(f"{where}: this looks like {describe({key: []})}")
        if key == array_key:
            if event != "start_array":
                raise InputError(f"{prefix}{array_key}: expected an array, found {event.split('_')[-1]}")
            found = True
            yield from _array(f"{prefix}{array_key}", events)
        else:
            others[key] = _build(event, value, events, f"{prefix}{key}")
    yield where, _PageEnd(others) if found else others


def _array(prefix: str, events: _Events) -> Iterator[tuple[str, Any]]:
    for i, (event, value) in enumerate(events):
        if event == "end_array":
            return
        where = f"{prefix}[{i}]"
        item = _build(event, value, events, where)
        events.last_item = where
        yield where, item


def _build(event: str, value: Any, events: _Events, where: str) -> Any:
    """Assemble one complete JSON value whose first event was (``event``, ``value``)."""
    builder = ijson.ObjectBuilder()
    builder.event(event, value)
    if event not in ("start_map", "start_array"):
        return builder.value
    depth = 1
    for count, (event, value) in enumerate(events):
        if count > _MAX_ITEM_EVENTS:
            raise InputError(f"{where}: too large for one item; is this the right kind of dump?")
        builder.event(event, value)
        if event in ("start_map", "start_array"):
            depth += 1
        elif event in ("end_map", "end_array"):
            depth -= 1
            if depth == 0:
                return builder.value
    raise InputError(f"{where}: the file ends inside this value (truncated?)")


def read_text(path: Path, what: str) -> str:
    """The whole of a small UTF-8 text file (a job spec, a throughput list), BOM tolerated.

    A missing, unreadable or non-UTF-8 file raises ``InputError`` naming it and, for bad
    encoding, the byte offset, so the user knows to re-save it as UTF-8.
    """
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not {what}")
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}); "
            f"save {what} as UTF-8"
        ) from None


@contextmanager
def open_text(path: Path, on_bytes: ProgressCallback | None = None) -> Iterator[io.TextIOWrapper]:
    """A UTF-8 text stream (BOM tolerated) of a plain or gzip file, with newlines left for ``csv``."""
    with open_binary(path, on_bytes) as stream:
        yield io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")


def iter_csv_rows(
    path: Path,
    columns: tuple[str, ...],
    on_bytes: ProgressCallback | None = None,
    optional: tuple[str, ...] = (),
) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield ``(first line of the record, row)`` of a CSV file whose header has ``columns``.

    Extra columns are ignored; blank lines are skipped. A row must have a cell (maybe empty) for
    each of ``columns`` and of the ``optional`` columns its header has: a row cut short, whose
    last values would otherwise read as "unknown", is an error naming the columns it lacks. A
    header lacking a column, or a damaged file, raises ``InputError`` naming the file and line.
    """
    name = path.name
    with open_text(path, on_bytes) as stream:
        reader = csv.reader(stream)
        try:
            header = next(reader, [])
            missing = [c for c in columns if c not in header]
            if missing:
                raise InputError(
                    f"{name}: line 1: the header lacks {', '.join(missing)}; "
                    f"expected the columns {','.join(columns)}"
                )
            read = [c for c in (*columns, *optional) if c in header]
            needed = max(header.index(c) for c in read) + 1
            last = reader.line_num
            for cells in reader:
                first, last = last + 1, reader.line_num
                if not cells:
                    continue
                if len(cells) < needed:
                    lacking = ", ".join(c for c in read if header.index(c) >= len(cells))
                    raise InputError(f"{name}: line {first}: too few fields (no {lacking})")
                yield first, dict(zip(header, cells, strict=False))
        except csv.Error as exc:
            raise InputError(f"{name}: line {reader.line_num}: not valid CSV ({exc})") from None
        except _READ_ERRORS as exc:
            raise InputError(f"{name}: cannot read it: {exc} (a damaged file, or not UTF-8 text?)") from None


def check_text(value: str, field: str) -> str:
    """``value``, a text a user gave (an instance id, a command, a workload name), once it holds
    no NUL character: PostgreSQL cannot store one in a text column (SQLite can, so the two
    backends would differ), and no name or command needs one. ``field`` names where it was."""
    if "\x00" in value:
        raise InputError(f"{field}: {value!r} contains a NUL character (\\x00); remove it")
    return value
