"""What every command shares: the database handle, output format and time parsing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from spotopt.clouds.registry import MARKET_CLOUDS
from spotopt.db.engine import Database, sqlite_path
from spotopt.errors import InputError
from spotopt.render import Format, say
from spotopt.times import parse_duration, parse_time

__all__ = [
    "MAX_ROWS",
    "FormatOption",
    "State",
    "WideOption",
    "check_cloud",
    "directory",
    "parse_duration",
    "parse_time",
    "state",
]

MAX_ROWS = 1_000_000_000
"""The largest ``--limit``: above it a number no longer fits a database integer (SQLite: 2^63)."""

WideOption = Annotated[
    bool, typer.Option("--wide", help="Tables show every column (CSV and JSON always do).")
]
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
            from spotopt.history.setup import open_history

            self._db = open_history(self.db_url)
            path = sqlite_path(str(self._db.engine.url))
            if self._db.created and path is not None:
                say(f"created a new, empty history database at {path}", label="note:", style="dim", err=True)
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


def check_cloud(cloud: str) -> str:
    """Refuse an unknown ``--cloud`` value, naming the valid ones."""
    if cloud not in MARKET_CLOUDS:
        raise InputError(f"--cloud {cloud!r} is not a cloud; use one of {', '.join(MARKET_CLOUDS)}")
    return cloud


def directory(path: Path, option: str, *, new: bool = False) -> Path:
    """``path`` as a directory a command may use, made if missing; an ``InputError`` naming
    ``option`` otherwise. Only the last part is made: a mistyped ``/nonexistent/x/y`` is
    refused rather than created silently. ``new``: it must not exist yet."""
    if path.exists():
        if new:
            raise InputError(f"{option} {path}: already exists; name a new directory")
        if not path.is_dir():
            raise InputError(f"{option} {path}: is a file, not a directory; name a directory")
        return path
    if not path.parent.is_dir():
        raise InputError(
            f"{option} {path}: {path.parent} does not exist (a typo?); create it first or fix the path"
        )
    try:
        path.mkdir()
    except OSError as exc:
        raise InputError(
            f"{option} {path}: cannot be made ({exc.strerror}); name a directory you may write"
        ) from None
    return path
