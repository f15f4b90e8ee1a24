"""One log line per decision and per side effect, readable by a person and parsed by a machine.

The format is logfmt (``key=value`` pairs, values with spaces or quotes in double quotes), the
format Heroku, Grafana Loki and most log shippers parse without configuration, and one a person
reads as a sentence: ``event=launch job=resnet move=12 market=aws/us-east-1/… usd_per_hour=0.91``.
``parse`` reads a line back (the tests and ``daemon status`` use it).
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any

log = logging.getLogger("spotopt.mover")

_BARE = re.compile(r"^[A-Za-z0-9_.:/@+\-]+$")
_PAIR = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)=("(?:[^"\\]|\\.)*"|\S*)')


def _value(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.6g}" if math.isfinite(value) else str(value)
    else:
        text = str(value)
    if _BARE.match(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def format_event(event: str, **fields: Any) -> str:
    """``event=<event>`` followed by every field that is not None, in the order given."""
    parts = [f"event={_value(event)}"]
    parts += [f"{k}={_value(v)}" for k, v in fields.items() if v is not None]
    return " ".join(parts)


def log_event(event: str, **fields: Any) -> str:
    """Log one event line at INFO (``spotopt.mover``) and return it."""
    line = format_event(event, **fields)
    log.info(line)
    return line


def parse(line: str) -> dict[str, str]:
    """The fields of a ``format_event`` line (values unquoted)."""
    out = {}
    for key, raw in _PAIR.findall(line):
        if raw.startswith('"'):
            raw = re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), raw[1:-1])
        out[key] = raw
    return out
