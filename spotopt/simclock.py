"""A simulated clock shared by the replayed daemon (in-process) and its agents (subprocesses).

The clock is one small JSON file, ``{"t": seconds since the epoch, "gen": n}``, written
atomically (``os.replace``) by the replay driver only and read by everyone else: the daemon and
the executor through ``SimClock.now`` (their injected ``clock``), an agent through
``SPOTOPT_CLOCK_FILE`` (``spotopt.agent`` reads it as its injectable clock). A file, not a
socket or shared memory, because the agents are separate processes started by a provider that
knows nothing of the replay, and a file is what every one of them can read without setup.

``gen`` counts the driver's writes. The driver bumps it whenever the daemon changed something
at the same simulated time (a lease granted, a stop requested), and a replay workload
acknowledges the generation it has fully acted on (``acknowledge``), so the driver can wait in
*lock-step*: simulated time moves on only once every live process has seen the newest state.
Real start-up and I/O latency therefore never turn into simulated hours. With its
acknowledgement a workload says when it next changes by itself (a checkpoint written, the work
done), and the driver advances straight to the earliest such time or the next planning round:
events happen at their exact simulated times, not at the next multiple of some step.

Imports only the standard library: an agent reads it inside a training process.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

CLOCK_ENV = "SPOTOPT_CLOCK_FILE"
"""The agent variable naming the clock file (unset: the agent uses the real clock)."""


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def read(path: str | Path) -> tuple[float, int]:
    """(simulated seconds since the epoch, generation) from the clock file."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return float(data["t"]), int(data["gen"])


def file_clock(path: str | Path) -> float:
    """The simulated time in the clock file (the agent's ``Clock``: seconds since the epoch)."""
    return read(path)[0]


class SimClock:
    """The driver's side of the clock file: set, advance and bump; ``now`` is the daemon's clock."""

    def __init__(self, path: str | Path, start: datetime) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        (self.path.parent / "acks").mkdir(exist_ok=True)
        self._t = start.timestamp()
        self._gen = 0
        self._save()

    @property
    def seconds(self) -> float:
        return self._t

    @property
    def gen(self) -> int:
        return self._gen

    def now(self) -> datetime:
        return datetime.fromtimestamp(self._t, UTC)

    def advance_to(self, when: datetime) -> None:
        """Move simulated time forward to ``when`` (never backwards)."""
        t = when.timestamp()
        if t < self._t:
            raise ValueError(f"the simulated clock cannot go back from {self.now()} to {when}")
        self._t = t
        self.bump()

    def bump(self) -> None:
        """A new generation at the same time: the daemon changed something the processes must see."""
        self._gen += 1
        self._save()

    def acknowledged(self, job: str, epoch: int) -> tuple[int, float | None]:
        """(newest generation the process of ``job``/``epoch`` has fully acted on, or -1; the
        simulated time of its next own event, e.g. a checkpoint written or the work done)."""
        try:
            data = json.loads((self.path.parent / "acks" / f"{job}.{epoch}").read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):
            return -1, None
        nxt = data.get("next")
        return int(data["gen"]), None if nxt is None else float(nxt)

    def _save(self) -> None:
        _write_atomic(self.path, json.dumps({"t": self._t, "gen": self._gen}))


def acknowledge(clock_path: str | Path, job: str, epoch: int, gen: int, next_event: float | None) -> None:
    """The workload's side: it has acted on everything up to generation ``gen``; ``next_event`` is
    when (simulated seconds) it next changes by itself, so the driver steps straight there."""
    text = json.dumps({"gen": gen, "next": next_event})
    _write_atomic(Path(clock_path).parent / "acks" / f"{job}.{epoch}", text)
