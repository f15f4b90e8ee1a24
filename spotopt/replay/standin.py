"""The stand-in workload: a real process that trains like a job, on the replay's simulated clock.

``python -m spotopt.replay.standin RATES.json`` is the ``run`` of a replayed job that has none
(any what-if job file). It is a real managed job for the agent: it waits for the lease, restores
the newest verified checkpoint, writes real checkpoints (a small file holding the step) through
``agent.checkpoint``, answers the daemon's checkpoint-and-stop requests, heartbeats and finishes.
Only its *speed* is simulated, in the time of ``SPOTOPT_CLOCK_FILE``:

- entering a placement costs ``restart_s`` (provisioning and restore): no progress;
- then it trains at the job's throughput on its market's GPUs (``SPOTOPT_MARKET`` and
  ``SPOTOPT_GPUS`` pick the figure from RATES), ``tau_s - checkpoint_s`` of training then a
  ``checkpoint_s`` periodic write, over and over (``tau_s``: the interval the what-if engine
  simulates for this option);
- a checkpoint the daemon asks for starts when the request is seen and takes ``checkpoint_s``;
- the work is done at the exact simulated time ``step`` reaches ``work_steps``.

RATES (written by ``spotopt.replay.harness``) is ``{"work_steps", "restart_s", "checkpoint_s",
"options": {"MARKET LABEL|GPUS": {"steps_per_s", "tau_s"}}}``. After each round the process
acknowledges the clock generation it acted on with the time of its next own event
(``spotopt.simclock``), which is what keeps the replay in lock-step.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from spotopt.agent import Agent, AgentConfig
from spotopt.simclock import CLOCK_ENV, acknowledge, file_clock, read

EPS_S = 1e-6
"""Simulated seconds within which two times are the same (float sums of hours of seconds)."""


@dataclass(frozen=True)
class Rates:
    """The RATES file: the job's work and overheads, and its speed per option."""

    work_steps: float
    restart_s: float
    checkpoint_s: float
    options: dict[str, dict[str, float]]
    """``"MARKET LABEL|GPUS"`` → ``{"steps_per_s", "tau_s"}``."""

    @classmethod
    def load(cls, path: Path) -> Rates:
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(
            float(data["work_steps"]), float(data["restart_s"]), float(data["checkpoint_s"]), data["options"]
        )

    def dump(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")


@dataclass
class Workload:
    """The simulated progress of one placement from the time it got the lease."""

    step: float
    work: float
    steps_per_s: float
    tau_s: float
    checkpoint_s: float
    cursor: float
    """Simulated seconds up to which the workload has run."""
    mode: str = "restart"
    """``restart`` until ``until``; ``train`` until ``until`` (a periodic checkpoint starts);
    ``checkpoint`` until ``until`` (the write of step ``saving`` completes); ``done``."""
    until: float = 0.0
    saving: float = 0.0
    entered: float = 0.0
    """The step restored when the placement got the lease."""

    @classmethod
    def entering(cls, t0: float, step: float, rates: Rates, option: str) -> Workload:
        """A placement on ``option`` that got the lease at ``t0`` with ``step`` steps restored."""
        if option not in rates.options:
            raise SystemExit(f"spotopt standin: the rates file has no throughput for {option}")
        figures = rates.options[option]
        tau = float(figures["tau_s"])
        return cls(
            step=step,
            work=rates.work_steps,
            steps_per_s=float(figures["steps_per_s"]),
            tau_s=tau,
            checkpoint_s=min(rates.checkpoint_s, tau),
            cursor=t0,
            until=t0 + rates.restart_s,
            entered=step,
        )

    def next_event(self) -> float | None:
        """When this workload next changes in a way the daemon must see at that very time (None:
        done already): the end of a checkpoint write (the daemon may wait for it), its first
        whole step on this placement (a start or a move is confirmed by progress), else the
        exact time the work is done. Periodic writes concern only the workload: they are made,
        in order and with their simulated cost, whenever the clock passes them."""
        if self.mode == "done":
            return None
        if self.mode == "checkpoint":
            return self.until
        done = self._reaches(self.work)
        if math.floor(self.step) <= math.floor(self.entered):
            return min(done, self._reaches(math.floor(self.entered) + 1.0))
        return done

    def _reaches(self, steps: float) -> float:
        """The simulated time at which ``steps`` steps are done (pauses included)."""
        ahead = replace(self, work=min(self.work, steps))
        ahead.advance(math.inf)
        return ahead.cursor

    def advance(self, t: float) -> list[float]:
        """Run to simulated time ``t``; the steps of the checkpoints completed on the way."""
        written: list[float] = []
        while self.mode != "done":
            if self.mode in ("restart", "checkpoint"):
                if self.until > t + EPS_S:
                    self.cursor = max(self.cursor, t)
                    break
                if self.mode == "checkpoint":
                    written.append(self.saving)
                self.cursor, self.mode = self.until, "train"
                self.until = self.cursor + self.tau_s - self.checkpoint_s
                continue
            finish = self.cursor + (self.work - self.step) / self.steps_per_s
            end = max(self.cursor, min(t, self.until, finish))
            self.step = min(self.work, self.step + self.steps_per_s * (end - self.cursor))
            self.cursor = end
            if finish <= end + EPS_S:
                self.step, self.mode = self.work, "done"
            elif self.until <= end + EPS_S:
                self.begin_checkpoint(end)
            else:
                break
        return written

    def begin_checkpoint(self, t: float) -> None:
        """Start writing the current step at ``t`` (periodic, or asked for by the daemon)."""
        self.cursor, self.mode = t, "checkpoint"
        self.until, self.saving = t + self.checkpoint_s, self.step


def run(agent: Agent, clock_file: str, rates: Rates, option: str, poll_s: float) -> None:
    """The training loop (see the module docstring); returns when the work is done."""
    start = agent.start_step()  # waits for the lease (make-before-break), then restores
    load = Workload.entering(file_clock(clock_file), float(start), rates, option)
    job, epoch = agent.config.job, agent.config.epoch
    while True:
        t, gen = read(clock_file)
        for step in load.advance(t):
            _save(agent, int(step))
        agent.progress(int(load.step))
        if load.mode == "done":
            _save(agent, int(load.step))
            agent.finish()  # the finished mark first: the round that follows must see it
            acknowledge(clock_file, job, epoch, gen, None)
            return
        agent.poll_once()
        if agent.should_checkpoint() and load.mode == "train":
            load.begin_checkpoint(t)
            for step in load.advance(t):
                _save(agent, int(step))
        if agent.should_stop():
            # Exits the process (status 0; the checkpoint holds all progress) without an
            # acknowledgement: the driver waits until the process is gone, so the round that
            # follows sees the instance ended at this simulated time.
            agent.finish()
        acknowledge(clock_file, job, epoch, gen, load.next_event())
        time.sleep(poll_s)


def _save(agent: Agent, step: int) -> None:
    agent.progress(step)  # the checkpoint's heartbeat reports this step, not an older one
    with agent.checkpoint(step) as directory:
        (directory / "step.json").write_text(json.dumps({"step": step}), encoding="utf-8")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m spotopt.replay.standin RATES.json")
    clock_file = os.environ.get(CLOCK_ENV)
    if not clock_file:
        raise SystemExit(
            f"spotopt standin: {CLOCK_ENV} is not set; it runs only under `spotopt daemon replay`"
        )
    rates = Rates.load(Path(args[0]))
    # Periodic checkpoints follow the simulated schedule above; the agent's own period must never
    # fire, so should_checkpoint() means "the daemon, a notice or SIGTERM asked".
    config = replace(AgentConfig.from_environ(os.environ), checkpoint_every_s=float("inf"))
    agent = Agent(config, clock=partial(file_clock, clock_file), background=False)
    option = f"{os.environ.get('SPOTOPT_MARKET', '')}|{os.environ.get('SPOTOPT_GPUS', '')}"
    run(agent, clock_file, rates, option, config.poll_s)


if __name__ == "__main__":
    main()
