"""Checked conversion of one field of one source record, shared by importers and live collectors.

Every failure is an ``InputError`` whose message starts with the record's location and names the
field (``prices.json: SpotPriceHistory[17].SpotPrice: 'abc' is not a number``), so a user can go
straight to the bad value. Names are checked against the column widths of the schema here, because
PostgreSQL would refuse an over-long value only at insert time, with a message naming no record.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from spotopt.errors import InputError
from spotopt.times import check_time

# Instance type names of all three clouds: p3.2xlarge, a2-highgpu-1g, Standard_NC6s_v3, u-6tb1.metal,
# and the catalog's GCP machine types with attached GPUs, n1-standard-8+1xnvidia-tesla-v100 (the
# names ``plan`` prints, so an importer must take them back).
_INSTANCE_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
# Regions and zones: us-east-1, us-west-2-lax-1a, us-central1-a, eastus. Column width is 32.
_PLACE = re.compile(r"[a-z0-9][a-z0-9-]{0,31}")


def at(where: str, field: str) -> str:
    """``where`` + ``field`` as a user reads it: ``f.json: Items[3].retailPrice``, ``f.csv: line 4: zone``."""
    return f"{where}.{field}" if where.endswith("]") else f"{where}: {field}"


def required(item: Mapping[str, Any], field: str, where: str) -> Any:
    """The value of ``field``; a missing field or JSON null is an error naming it."""
    value = item.get(field)
    if value is None:
        raise InputError(f"{at(where, field)}: missing (every record needs it)")
    return value


def text(item: Mapping[str, Any], field: str, where: str) -> str:
    """A required string field."""
    value = required(item, field, where)
    if not isinstance(value, str):
        raise InputError(f"{at(where, field)}: {value!r} is not a string")
    return value


def optional_text(item: Mapping[str, Any], field: str, where: str) -> str:
    """A string field that may be missing or null ("" then)."""
    value = item.get(field)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise InputError(f"{at(where, field)}: {value!r} is not a string")
    return value


def instance_type(value: str, where: str, field: str) -> str:
    if not _INSTANCE_TYPE.fullmatch(value):
        raise InputError(
            f"{at(where, field)}: {value!r} is not an instance type name "
            "(letters, digits, '.', '_', '-', '+'; at most 64 characters)"
        )
    return value


def place(value: str, where: str, field: str) -> str:
    """A region or zone name: lower-case letters, digits and '-', at most 32 characters."""
    if not _PLACE.fullmatch(value):
        raise InputError(
            f"{at(where, field)}: {value!r} is not a region or zone name "
            "(lower-case letters, digits and '-', at most 32 characters)"
        )
    return value


def timestamp(value: Any, where: str, field: str) -> datetime:
    """An ISO 8601 string (``Z`` or an offset; none means UTC) or a datetime (as boto3 returns) → UTC."""
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            raise InputError(
                f"{at(where, field)}: {value!r} is not an ISO 8601 time (e.g. 2024-05-01T12:00:00Z)"
            ) from None
    else:
        raise InputError(f"{at(where, field)}: {value!r} is not a time (ISO 8601 string expected)")
    if parsed.tzinfo is None:
        return check_time(parsed.replace(tzinfo=UTC), at(where, field), value)
    try:
        return check_time(parsed.astimezone(UTC), at(where, field), value)
    except OverflowError:
        raise InputError(f"{at(where, field)}: {value!r} is out of range in UTC") from None


MAX_USD_PER_HOUR = 10_000
"""No instance costs more per hour; a larger number is a unit mix-up (per month, per 1000 hours)
or a corrupt value, and 1e308 would overflow every sum over the history."""


def price(value: Any, where: str, field: str) -> float:
    """A finite, non-negative USD amount given as a JSON number or a decimal string (AWS prints strings)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"{at(where, field)}: {value!r} is not a number")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise InputError(f"{at(where, field)}: {value!r} is not a number") from None
    if not math.isfinite(number):
        raise InputError(f"{at(where, field)}: {value!r} is not a finite number")
    if number < 0:
        raise InputError(f"{at(where, field)}: {value!r} is negative (prices are USD per hour, >= 0)")
    if number > MAX_USD_PER_HOUR:
        raise InputError(
            f"{at(where, field)}: {value!r} is above {MAX_USD_PER_HOUR:,} USD per hour; prices are "
            "per instance-hour (the dearest GPU instances list for about 100)"
        )
    return number
