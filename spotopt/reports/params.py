"""Parameters the reports share, each with a parser whose errors name the parameter and what is valid."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from spotopt.catalog import check_gpu_query
from spotopt.clouds.registry import MARKET_CLOUDS
from spotopt.errors import InputError
from spotopt.reports.base import Param
from spotopt.times import parse_time
from spotopt.types import MarketKind

BUCKETS = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}
DEFAULT_WINDOW = timedelta(days=7)


def choice(valid: Sequence[str]) -> Callable[[str, str, datetime], str]:
    def parse(name: str, text: str, _now: datetime) -> str:
        if text not in valid:
            raise InputError(f"parameter {name}: {text!r} is not valid; use one of {', '.join(valid)}")
        return text

    return parse


def _gpu(name: str, text: str, _now: datetime) -> str:
    try:
        return check_gpu_query(text)
    except InputError as exc:
        raise InputError(f"parameter {name}: {exc}".replace("--gpu ", "")) from exc


def time(name: str, text: str, now: datetime) -> datetime:
    parsed = parse_time(text, f"parameter {name}", now=now)
    assert parsed is not None
    return parsed


def _positive(kind: type[int] | type[float], most: float) -> Callable[[str, str, datetime], Any]:
    """A finite number in (0, ``most``]: ``nan``, ``inf`` and 1e300 break the arithmetic downstream."""

    def parse(name: str, text: str, _now: datetime) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not 0 < value <= most:
            raise InputError(f"parameter {name}: {text!r} is not a {kind.__name__} in (0, {most:g}]")
        return value

    return parse


def _region(_name: str, text: str, _now: datetime) -> str:
    """A region or zone name as given (an unknown one matches no market: an empty report)."""
    return text


KINDS = tuple(k.value for k in MarketKind)


def gpu(required: bool = False) -> Param:
    default = "required" if required else "default all"
    return Param("gpu", f"GPU model (V100-32GB) or family (V100); {default}", _gpu, required=required)


def cloud() -> Param:
    return Param("cloud", f"one cloud ({', '.join(MARKET_CLOUDS)}); default all", choice(MARKET_CLOUDS))


def region() -> Param:
    return Param("region", "one region, e.g. us-east-1; default all", _region)


def zone(help_text: str = "one zone, e.g. us-east-1a; default all") -> Param:
    return Param("zone", help_text, _region)


def _market(name: str, text: str, now: datetime) -> str | None:
    kind = choice([*KINDS, "all"])(name, text, now)
    return None if kind == "all" else kind


def market(default: str) -> Param:
    """``spot``, ``on-demand`` or ``all`` (parsed to None: no filter)."""
    return Param("market", f"market kind: {', '.join(KINDS)} or all; default {default}", _market, default)


def since() -> Param:
    return Param("since", "window start: ISO 8601, 'now' or an offset like -30d; default until - 7d", time)


def until() -> Param:
    return Param("until", "window end: ISO 8601, 'now' or an offset like -1d; default now", time, "now")


def at() -> Param:
    return Param(
        "at", "the time of the board: ISO 8601, 'now' or an offset like -1d; default now", time, "now"
    )


def bucket() -> Param:
    return Param("bucket", f"time bucket: {', '.join(BUCKETS)}; default day", choice(list(BUCKETS)), "day")


def positive_float(name: str, help_text: str, default: str, most: float) -> Param:
    return Param(name, help_text, _positive(float, most), default)


def window(args: dict[str, Any]) -> None:
    """Default ``since`` to a week before ``until``; refuse an empty or reversed window."""
    if args["since"] is None:
        args["since"] = args["until"] - DEFAULT_WINDOW
    if args["since"] >= args["until"]:
        raise InputError(
            f"parameter since ({args['since']:%Y-%m-%d %H:%M}) is not before until "
            f"({args['until']:%Y-%m-%d %H:%M}); swap them or widen the window"
        )
