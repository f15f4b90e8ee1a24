"""What every command shares: the database handle, output format and time parsing."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from spotopt.db.engine import Database
from spotopt.errors import InputError
from spotopt.render import Format
from spotopt.types import CLOUDS

FormatOption = Annotated[
    Format, typer.Option("--format", "-f", help="Output: table for people, csv or json for scripts.")
]


class State:
    """Per-invocation state kept in ``ctx.obj``: the --db URL and the opened database."""

    def __init__(self, db_url: str | None) -> None:
        self.db_url = db_url
        self._db: Database | None = None

    def db(self) -> Database:
        if self._db is None:
            from spotopt.db.setup import open_history

            self._db = open_history(self.db_url)
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.dispose()
            self._db = None


def state(ctx: typer.Context) -> State:
    root = ctx.find_root()
    if not isinstance(root.obj, State):
        root.obj = State(None)
    return root.obj


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


def check_cloud(cloud: str) -> str:
    """Refuse an unknown ``--cloud`` value, naming the valid ones."""
    if cloud not in CLOUDS:
        raise InputError(f"--cloud {cloud!r} is not a cloud; use one of {', '.join(CLOUDS)}")
    return cloud
