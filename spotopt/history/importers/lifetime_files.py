"""Recorded spot instance lifetimes: when each instance was launched, when and how it ended.

**CSV** (a header row is required; extra columns are ignored)::

    cloud,region,zone,instance_type,instance_id,launched_at,ended_at,end_reason
    aws,us-east-1,us-east-1a,p3.2xlarge,i-0abc,2024-05-01T00:00:00Z,2024-05-01T05:12:00Z,preempted
    aws,us-east-1,us-east-1a,p3.2xlarge,i-0def,2024-05-02T00:00:00Z,,

The market columns as in the price CSV (always the spot market); ``instance_id`` any id unique
within the market (at most 128 characters); ``end_reason`` ``preempted`` (the cloud took it),
``terminated`` (its owner ended it: a censored life) or empty together with ``ended_at`` (it
still runs, censored at the time a reader looks).

**spot-traces preemption JSON** (``spotopt.history.importers.spot_traces``): a 1-node probe, 1 = the
probed instance still runs, 0 = it is gone (preempted, and being relaunched). Each run of 1s is
one life: launched at its first probe, preempted at the probe that first saw it gone (the step
rule: a probe's state holds until the next probe); a run still alive at the last probe ended
with the probe (``terminated`` there, censored). Its ``instance_id`` is ``probe-<launch time>``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from spotopt.collectors import fields
from spotopt.errors import InputError
from spotopt.files import check_text, iter_csv_rows
from spotopt.history.importers.csv_prices import Markets
from spotopt.history.importers.spot_traces import TraceOptions, read_trace
from spotopt.types import LIFETIME_ENDS, LifetimeObservation

COLUMNS = (
    "cloud",
    "region",
    "zone",
    "instance_type",
    "instance_id",
    "launched_at",
    "ended_at",
    "end_reason",
)
INSTANCE_ID_CHARS = 128  # width of instance_lifetimes.instance_ref


def read_lifetimes_csv(
    path: Path, on_bytes: Callable[[int], None] | None = None
) -> Iterator[LifetimeObservation]:
    """Stream the lifetimes of a CSV file (plain or ``.gz``); errors name line and column."""
    markets = Markets()
    for line, row in iter_csv_rows(path, COLUMNS, on_bytes):
        where = f"{path.name}: line {line}"
        market = markets.of_row(row, where, "spot")
        instance_id = check_text(row["instance_id"].strip(), fields.at(where, "instance_id"))
        if not instance_id or len(instance_id) > INSTANCE_ID_CHARS:
            raise InputError(
                f"{fields.at(where, 'instance_id')}: {instance_id!r} is not an instance id "
                f"(1 to {INSTANCE_ID_CHARS} characters)"
            )
        launched_at = fields.timestamp(row["launched_at"], where, "launched_at")
        ended_text, reason = row["ended_at"].strip(), row["end_reason"].strip() or None
        ended_at = fields.timestamp(ended_text, where, "ended_at") if ended_text else None
        _check_end(launched_at, ended_at, reason, where)
        yield LifetimeObservation(market, instance_id, launched_at, ended_at, reason)


def _check_end(launched_at: datetime, ended_at: datetime | None, reason: str | None, where: str) -> None:
    if reason is not None and reason not in LIFETIME_ENDS:
        raise InputError(
            f"{fields.at(where, 'end_reason')}: {reason!r} is not an end; use preempted, terminated, "
            "or leave it and ended_at empty for an instance still running"
        )
    if (ended_at is None) != (reason is None):
        missing, given = ("end_reason", "ended_at") if reason is None else ("ended_at", "end_reason")
        raise InputError(
            f"{fields.at(where, missing)}: empty while {given} is set; give both, or neither for an "
            "instance still running"
        )
    if ended_at is not None and ended_at < launched_at:
        raise InputError(
            f"{fields.at(where, 'ended_at')}: {ended_at:%Y-%m-%d %H:%M:%S} is before launched_at "
            f"{launched_at:%Y-%m-%d %H:%M:%S}; fix either time"
        )


def read_preemption_trace(
    path: Path, options: TraceOptions, on_bytes: Callable[[int], None] | None = None
) -> Iterator[LifetimeObservation]:
    """The lives of a 1-node spot-traces preemption file (see the module docstring)."""
    trace = read_trace(path, on_bytes)
    launched: datetime | None = None
    last: datetime | None = None
    for i, at, value in trace.times(options.start):
        if value > 1:
            raise InputError(
                f"{path.name}: data[{i}]: {value}: a multi-node trace; only 1-node preemption traces "
                "(0/1 per probe) can be read as lifetimes"
            )
        if value and launched is None:
            launched = at
        elif not value and launched is not None:
            yield _life(options, launched, at, "preempted")
            launched = None
        last = at
    if launched is not None and last is not None and last > launched:
        yield _life(options, launched, last, "terminated")


def _life(options: TraceOptions, launched: datetime, ended: datetime, reason: str) -> LifetimeObservation:
    ref = f"probe-{launched:%Y-%m-%dT%H:%M:%S.%fZ}"
    return LifetimeObservation(options.market, ref, launched, ended, reason)
