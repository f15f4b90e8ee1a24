"""What the agent tells the daemon through the store: heartbeats and the job's completion.

A heartbeat per epoch (``<job>/heartbeats/e<epoch>.json``, overwritten in place) carries the
step, the measured steps/s, the newest verified checkpoint and the agent's state, stamped with
the agent's clock. The daemon reads it to judge liveness and to record measured throughput.
``finished.json`` marks the job complete; its checkpoint is the result.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from enum import StrEnum

from spotopt.checkpoints.location import Location

HEARTBEATS = "heartbeats"
FINISHED = "finished.json"


class AgentState(StrEnum):
    WAITING = "waiting"
    """Started before its lease (a make-before-break move): up, restoring nothing, writing nothing."""
    RUNNING = "running"
    STOPPING = "stopping"
    """A stop was requested (SIGTERM, a notice, the daemon); the agent is saving a checkpoint."""
    STOPPED = "stopped"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class Heartbeat:
    job: str
    epoch: int
    state: AgentState
    step: int
    steps_per_s: float | None
    """Over the interval since the previous heartbeat; None until one past the warm-up
    (``spotopt.agent.steady``)."""
    last_checkpoint: str | None
    last_checkpoint_step: int | None
    at: datetime
    reason: str | None = None
    """Why the agent is stopping or stopped (``SIGTERM``, ``aws notice …``, ``daemon request``)."""


def write_heartbeat(loc: Location, beat: Heartbeat) -> None:
    data = asdict(beat)
    data["at"] = beat.at.isoformat()
    loc.write_json(loc.path(beat.job, HEARTBEATS, f"e{beat.epoch}.json"), data)


def read_heartbeat(loc: Location, job: str, epoch: int) -> Heartbeat | None:
    data = loc.read_json(loc.path(job, HEARTBEATS, f"e{epoch}.json"))
    if data is None:
        return None
    data["at"] = datetime.fromisoformat(data["at"])
    data["state"] = AgentState(data["state"])
    return Heartbeat(**data)


def mark_finished(
    loc: Location, job: str, epoch: int, checkpoint: str | None, step: int, now: datetime
) -> None:
    loc.write_json(
        loc.path(job, FINISHED),
        {"job": job, "epoch": epoch, "checkpoint": checkpoint, "step": step, "finished_at": now.isoformat()},
    )


def read_finished(loc: Location, job: str) -> dict[str, object] | None:
    """``{job, epoch, checkpoint, step, finished_at}`` once the job completed, else None."""
    data = loc.read_json(loc.path(job, FINISHED))
    return data if isinstance(data, dict) else None
