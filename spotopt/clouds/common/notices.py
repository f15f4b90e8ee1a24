"""What a preemption notice is and how a notice poller asks a metadata service, shared by every
cloud's poller (``spotopt/clouds/<cloud>/notices.py``) and the agent that runs them
(``spotopt.agent.notices``, whose docstring says what each cloud's service answers). stdlib
``urllib`` only: the agent imports this on the instance, with no cloud SDK installed.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

TIMEOUT_S = 2.0


class NoticeKind(StrEnum):
    PREEMPT = "preempt"
    """The instance will be taken away: checkpoint and stop."""
    REBALANCE = "rebalance"
    """Elevated risk (AWS rebalance recommendation): checkpoint now, keep running."""


@dataclass(frozen=True, slots=True)
class Notice:
    cloud: str
    kind: NoticeKind
    detail: str


class MetadataError(OSError):
    """The metadata service answered what its document does not give for "nothing pending"."""


class NoticePoller(Protocol):
    def poll(self) -> Notice | None:
        """One look at the metadata service: the current notice, or None. Network errors propagate."""
        ...


def request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, timeout_s: float = TIMEOUT_S
) -> tuple[int, bytes]:
    """(status, body); HTTP error statuses are returned, not raised (404 is the normal 'no notice').
    No answer within ``timeout_s`` (connecting, or between bytes) raises ``TimeoutError``."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def expect(cloud: str, what: str, status: int, body: bytes, allowed: tuple[int, ...]) -> None:
    """``MetadataError`` naming the endpoint and status unless ``status`` is one of ``allowed``."""
    if status not in allowed:
        text = body[:200].decode("utf-8", "replace").strip()
        raise MetadataError(f"{cloud} metadata {what} answered HTTP {status}" + (f": {text}" if text else ""))
