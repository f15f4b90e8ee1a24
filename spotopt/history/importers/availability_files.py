"""Spot availability files: whether a spot market could launch an instance, over time.

**CSV** (a header row is required; extra columns are ignored)::

    timestamp,cloud,region,zone,instance_type,available,launched,requested
    2022-10-26T22:05:04Z,aws,us-west-2,us-west-2a,p3.2xlarge,1,1,1

``timestamp``, ``cloud``, ``region``, ``zone`` and ``instance_type`` as in the price CSV
(``spotopt.history.importers.csv_prices``); ``available`` is ``1``/``0`` or ``true``/``false``;
``launched`` and ``requested`` (optional columns, a cell may be empty: unknown) say how many
instances of how many asked for the probe got. An optional ``market`` column must say ``spot``:
only spot markets have capacity observations.

**spot-traces JSON** (``spotopt.history.importers.spot_traces``): probe ``i`` at ``start + i * gap``
got ``n`` instances of ``requested`` (``--requested``, default 1).

The rule for ``available`` (the same for both): one more instance of the market could be
launched, i.e. ``launched >= 1``. A job that needs k instances at once needs ``launched >= k``,
which a consumer reads from ``launched``/``requested``; ``available`` answers what the daemon and
a one-instance-per-job replay ask: may a launch there succeed now. A probe that got 3 of 16 is
available (3 could be had), and says nothing about a fourth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from spotopt.collectors import fields
from spotopt.errors import InputError
from spotopt.files import iter_csv_rows
from spotopt.history.importers.csv_prices import Markets
from spotopt.history.importers.spot_traces import MAX_INSTANCES, TraceOptions, read_trace
from spotopt.types import AvailabilityObservation

COLUMNS = ("timestamp", "cloud", "region", "zone", "instance_type", "available")
OPTIONAL_COLUMNS = ("launched", "requested", "market")
_TRUE, _FALSE = frozenset({"1", "true"}), frozenset({"0", "false"})


def read_availability_csv(
    path: Path, on_bytes: Callable[[int], None] | None = None
) -> Iterator[AvailabilityObservation]:
    """Stream the observations of an availability CSV (plain or ``.gz``); errors name line and column."""
    markets = Markets()
    for line, row in iter_csv_rows(path, COLUMNS, on_bytes, OPTIONAL_COLUMNS):
        where = f"{path.name}: line {line}"
        kind = (row.get("market") or "spot").strip()
        if kind != "spot":
            raise InputError(
                f"{fields.at(where, 'market')}: {kind!r}: availability is recorded for spot markets "
                "only; drop the row (or the column)"
            )
        market = markets.of_row(row, where, "spot")
        observed_at = fields.timestamp(row["timestamp"], where, "timestamp")
        available = _flag(row["available"], where)
        launched = _optional_count(row.get("launched"), where, "launched")
        requested = _optional_count(row.get("requested"), where, "requested")
        check_counts(available, launched, requested, where)
        yield AvailabilityObservation(market, observed_at, available, launched, requested)


def read_availability_trace(
    path: Path, options: TraceOptions, on_bytes: Callable[[int], None] | None = None
) -> Iterator[AvailabilityObservation]:
    """One observation per probe of a spot-traces availability file: ``n`` launched of
    ``options.requested`` (1 if not given), available when ``n >= 1``."""
    trace = read_trace(path, on_bytes)
    requested = options.requested or 1
    for i, at, launched in trace.times(options.start):
        if launched > requested:
            raise InputError(
                f"{path.name}: data[{i}]: {launched} instances, more than the {requested} requested; "
                "pass --requested N (the number each probe asked for, e.g. 16 for a 16-node trace)"
            )
        yield AvailabilityObservation(options.market, at, launched >= 1, launched, requested)


def _flag(text: str, where: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise InputError(f"{fields.at(where, 'available')}: {text!r} is not 1/0 or true/false")


def _optional_count(text: str | None, where: str, field: str) -> int | None:
    """An instance count, or None for a missing column or an empty cell (unknown)."""
    if text is None or not text.strip():
        return None
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_INSTANCES:
        raise InputError(
            f"{fields.at(where, field)}: {text!r} is not a number of instances "
            f"(a whole number from 0 to {MAX_INSTANCES:,}, or empty for unknown)"
        )
    return value


def check_counts(available: bool, launched: int | None, requested: int | None, where: str) -> None:
    """``launched`` of ``requested`` must be possible and agree with ``available`` (``launched >= 1``)."""
    if requested == 0:
        raise InputError(f"{fields.at(where, 'requested')}: 0; a probe asks for at least 1 instance")
    if launched is not None and requested is not None and launched > requested:
        raise InputError(
            f"{fields.at(where, 'launched')}: {launched} is more than the {requested} requested; "
            "fix either count"
        )
    if launched is not None and available != (launched >= 1):
        raise InputError(
            f"{fields.at(where, 'available')}: {int(available)} with {launched} launched; available "
            "means at least one instance launched: make them agree (or leave launched empty)"
        )
