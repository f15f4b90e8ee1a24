"""Control requests from the daemon to a job's agent, as objects in the store (no open port needed).

The daemon writes ``<job>/control/<id>.json``; the agent of the named epoch polls for it, acts,
and writes ``<job>/control/<id>.ack.json`` naming the verified checkpoint that answered it. A
request for another epoch is ignored by everyone else, so a request cannot leak to the next
placement. Kinds: ``checkpoint`` (save now, keep training) and ``checkpoint-and-stop``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from spotopt.checkpoints.location import Location

CONTROL = "control"
ACK_SUFFIX = ".ack.json"


class RequestKind(StrEnum):
    CHECKPOINT = "checkpoint"
    CHECKPOINT_AND_STOP = "checkpoint-and-stop"


@dataclass(frozen=True, slots=True)
class ControlRequest:
    id: str
    job: str
    epoch: int
    kind: RequestKind
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Acknowledgement:
    request_id: str
    checkpoint: str | None
    """Name of the verified checkpoint written for the request (None: none could be written)."""
    step: int | None
    acknowledged_at: datetime


def send_request(
    loc: Location, job: str, epoch: int, kind: RequestKind, now: datetime, request_id: str | None = None
) -> ControlRequest:
    """Ask the agent of ``epoch`` to checkpoint (and stop). Returns the request to wait on.

    ``request_id`` (letters, digits, ``-``, ``_``) makes the request idempotent: the executor
    derives it from its journal key, so re-sending after a crash rewrites the same request.
    """
    rid = request_id or f"{now:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
    request = ControlRequest(rid, job, epoch, kind, now)
    loc.write_json(
        loc.path(job, CONTROL, f"{request.id}.json"),
        {"id": request.id, "job": job, "epoch": epoch, "kind": str(kind), "created_at": now.isoformat()},
    )
    return request


def _request(data: Any) -> ControlRequest:
    return ControlRequest(
        str(data["id"]),
        str(data["job"]),
        int(data["epoch"]),
        RequestKind(data["kind"]),
        datetime.fromisoformat(data["created_at"]),
    )


def pending_requests(loc: Location, job: str, epoch: int) -> list[ControlRequest]:
    """Requests addressed to ``epoch`` that nobody acknowledged yet, oldest first."""
    names = loc.names(loc.path(job, CONTROL))
    acked = {n.removesuffix(ACK_SUFFIX) for n in names if n.endswith(ACK_SUFFIX)}
    found = []
    for name in names:
        if name.endswith(ACK_SUFFIX) or not name.endswith(".json") or name.removesuffix(".json") in acked:
            continue
        data = loc.read_json(loc.path(job, CONTROL, name))
        if data is not None and int(data["epoch"]) == epoch:
            found.append(_request(data))
    return sorted(found, key=lambda r: r.created_at)


def acknowledge(
    loc: Location, request: ControlRequest, checkpoint: str | None, step: int | None, now: datetime
) -> None:
    loc.write_json(
        loc.path(request.job, CONTROL, f"{request.id}{ACK_SUFFIX}"),
        {
            "request_id": request.id,
            "checkpoint": checkpoint,
            "step": step,
            "acknowledged_at": now.isoformat(),
        },
    )


def read_acknowledgement(loc: Location, job: str, request_id: str) -> Acknowledgement | None:
    """The agent's answer to a request, or None while it is still pending."""
    data = loc.read_json(loc.path(job, CONTROL, f"{request_id}{ACK_SUFFIX}"))
    if data is None:
        return None
    return Acknowledgement(
        str(data["request_id"]),
        data["checkpoint"],
        data["step"],
        datetime.fromisoformat(data["acknowledged_at"]),
    )
