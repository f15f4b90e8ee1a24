"""Times and durations as users type them: ISO 8601 (UTC unless a zone is given), ``now``, ``-7d``.

Used by the CLI and by anything else that takes times from people (report parameters, job
specs). Every time is bounded to ``EARLIEST``..``LATEST`` and every duration to ``LONGEST``:
cloud price history starts after 1970, and a time near ``datetime.max`` overflows as soon as a
deadline or a time bucket is added to it, far from where the user typed it.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from spotopt.errors import InputError

_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
LONGEST = timedelta(days=100 * 366)
_TIME_FORMS = "use ISO 8601 (2024-05-01T12:00Z), 'now' or an offset like -7d"


def parse_duration(text: str, field: str) -> timedelta:
    """``90m``, ``72h``, ``4d``, ``1w`` → timedelta; anything else names the field and the form."""
    match = _RELATIVE.match(text.strip())
    if not match or text.strip().startswith("-"):
        raise InputError(f"{field}: {text!r} is not a duration; write e.g. 90m, 72h, 4d or 1w")
    seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds > LONGEST.total_seconds():
        raise InputError(f"{field}: {text!r} is longer than 100 years; write a shorter duration")
    return timedelta(seconds=seconds)


def check_time(
    value: datetime, field: str, text: object = None, fix: str = "give a time in that range"
) -> datetime:
    """``value`` if it lies between ``EARLIEST`` and ``LATEST``, else an error naming ``field``
    and ``fix`` (for a time computed from others, what to correct instead)."""
    if not EARLIEST <= value < LATEST:
        shown = value.isoformat() if text is None else repr(text)
        raise InputError(f"{field}: {shown} is outside {EARLIEST:%Y-%m-%d}..{LATEST:%Y-%m-%d}; {fix}")
    return value


def parse_time(text: str | None, field: str, now: datetime | None = None) -> datetime | None:
    """ISO 8601 (UTC if no zone given), ``now``, or ``-7d`` style offsets from now."""
    if text is None:
        return None
    now = now or datetime.now(UTC)
    value = text.strip()
    if value.lower() == "now":
        return now
    if value.startswith("-") and _RELATIVE.match(value):
        try:
            return check_time(now - parse_duration(value[1:], field), field, text)
        except InputError:
            raise InputError(
                f"{field}: {text!r} reaches before {EARLIEST:%Y-%m-%d}; give a shorter offset or a time"
            ) from None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InputError(f"{field}: {text!r} is not a time; {_TIME_FORMS}") from exc
    try:
        parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00-05:00 is past datetime.max in UTC
        parsed = datetime.max.replace(tzinfo=UTC)
    return check_time(parsed, field, text)
