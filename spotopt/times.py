"""Times and durations as users type them: ISO 8601 (UTC unless a zone is given), ``now``, ``-7d``.

Used by the CLI and by anything else that takes times from people (report parameters).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from spotopt.errors import InputError

_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, field: str) -> timedelta:
    """``90m``, ``72h``, ``4d``, ``1w`` → timedelta; anything else names the field and the form."""
    match = _RELATIVE.match(text.strip())
    if not match or text.strip().startswith("-"):
        raise InputError(f"{field}: {text!r} is not a duration; write e.g. 90m, 72h, 4d or 1w")
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


def parse_time(text: str | None, field: str, now: datetime | None = None) -> datetime | None:
    """ISO 8601 (UTC if no zone given), ``now``, or ``-7d`` style offsets from now."""
    if text is None:
        return None
    now = now or datetime.now(UTC)
    value = text.strip()
    if value.lower() == "now":
        return now
    if value.startswith("-") and _RELATIVE.match(value):
        return now - parse_duration(value[1:], field)
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InputError(
            f"{field}: {text!r} is not a time; use ISO 8601 (2024-05-01T12:00Z), 'now' or an offset like -7d"
        ) from exc
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
