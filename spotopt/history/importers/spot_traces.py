"""The spot-traces JSON format: probes of one spot market, one value per probe, at a fixed gap.

``{"metadata": {"gap_seconds": G}, "data": [n, ...]}`` as the public skypilot-org/spot-traces
repository stores them (Can't Be Late, NSDI '24): ``n`` is the number of instances that were
available (availability traces) or still running (preemption traces) at the probe; 1-node traces
hold 0/1. Other keys (some preemption files carry ``"prices"``) are ignored. The files hold no
timestamps and no market: the importer's options give them (``TraceOptions``), probe ``i`` being
at ``start + i * G``.

A trace is read whole (a year of 30 s probes is about a million small integers): the format is
one JSON document with its array, and the values are checked as they are converted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from spotopt.collectors import fields
from spotopt.errors import InputError
from spotopt.files import open_binary
from spotopt.history.importers.csv_prices import Markets
from spotopt.times import LONGEST, check_time
from spotopt.types import MarketKey

MAX_INSTANCES = 100_000
"""More instances than any probe requests: a bigger count is a corrupt value."""
_SHAPE = '{"metadata": {"gap_seconds": G}, "data": [n, ...]}'


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """What a trace file does not say: when its first probe ran and which market it probed."""

    start: datetime
    market: MarketKey
    requested: int | None = None
    """Instances each probe asked for (availability traces); None: not given on the command line."""


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    gap: timedelta
    values: list[int]

    def times(self, start: datetime) -> Iterator[tuple[int, datetime, int]]:
        """``(index, time, value)`` of every probe, the first at ``start``; a probe past the
        times spotopt stores (``spotopt.times``) is an error naming it. Checked one by one, the
        first such probe is met before ``i * gap`` could overflow (the gap is at most ``LONGEST``)."""
        for i, value in enumerate(self.values):
            where = f"{self.name}: data[{i}]"
            at = check_time(start + i * self.gap, where, fix="check --start and metadata.gap_seconds")
            yield i, at, value


def is_json(path: Path) -> bool:
    """Whether ``path`` (plain or gzip) holds JSON rather than CSV: its first non-blank byte opens
    an object or an array (no CSV header starts so; an array is then refused as no trace)."""
    with open_binary(path) as stream:
        head = stream.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    return head[:1] in (b"{", b"[")


def read_trace(path: Path, on_bytes: Callable[[int], None] | None = None) -> Trace:
    """The gap and the values of a spot-traces file; ``InputError`` naming the file and field."""
    name = path.name
    with open_binary(path, on_bytes) as stream:
        try:
            document = json.load(stream)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"{name}: not valid JSON ({exc}); a spot-traces file is {_SHAPE}") from None
        except (OSError, EOFError) as exc:
            raise InputError(f"{name}: cannot read it: {exc} (a damaged or truncated file?)") from None
    if not isinstance(document, dict) or "data" not in document:
        raise InputError(f"{name}: no 'data' array; a spot-traces file is {_SHAPE}")
    metadata = document.get("metadata")
    gap = metadata.get("gap_seconds") if isinstance(metadata, dict) else None
    if isinstance(gap, bool) or not isinstance(gap, (int, float)) or not math.isfinite(gap) or gap <= 0:
        raise InputError(
            f"{name}: metadata.gap_seconds: {gap!r} is not a positive number of seconds "
            f"(a spot-traces file is {_SHAPE})"
        )
    if gap > LONGEST.total_seconds():  # 1e15 s is past what a timedelta holds
        raise InputError(
            f"{name}: metadata.gap_seconds: {gap!r} is more than 100 years between probes; "
            "give the time between two probes in seconds"
        )
    data = document["data"]
    if not isinstance(data, list):
        raise InputError(f"{name}: data: expected an array of instance counts, found {type(data).__name__}")
    values = [_count(value, f"{name}: data[{i}]") for i, value in enumerate(data)]
    return Trace(name, timedelta(seconds=gap), values)


def _count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INSTANCES:
        raise InputError(f"{where}: {value!r} is not a number of instances (a whole number >= 0)")
    return value


def option_market(cloud: str, region: str, zone: str | None, instance_type: str) -> MarketKey:
    """The spot market the command-line options name, checked like a CSV row's."""
    return Markets().get(cloud, region, zone or "", instance_type, "spot", "command line")


def check_start(text: str) -> datetime:
    """``--start``: an ISO 8601 time (``Z`` or an offset; none means UTC)."""
    return fields.timestamp(text, "command line", "--start")
