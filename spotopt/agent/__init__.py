"""What a training script imports to be moved safely: checkpoints, progress, notices, stop requests.

```python
from spotopt import agent
ckpt = agent.resume()                # None, or a local directory holding the newest verified checkpoint
for step in range(agent.start_step(), total_steps):
    train_one_step()
    agent.progress(step + 1)         # cheap; heartbeats and steps/s are written in the background
    if agent.should_checkpoint():    # periodic, requested by the daemon, SIGTERM, or a cloud notice
        with agent.checkpoint(step + 1) as d:   # a local directory: write files into it
            save_state(d)            # on exit: uploaded, checksummed, manifest written, verified
    if agent.should_stop():          # after a checkpoint-and-stop request or a preemption notice
        break
agent.finish()                       # marks the job complete (a final checkpoint is the result)
```

Configured only from ``SPOTOPT_*`` environment variables (``spotopt.agent.config.ENV_VARS``).
Importing this module must stay cheap (no database, solver, pandas, rich, typer or cloud SDK;
fsspec is imported on the first call): a test checks ``sys.modules`` and the import time.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import AbstractContextManager
from pathlib import Path

from spotopt.agent.config import ENV_VARS, AgentConfig
from spotopt.agent.core import EXIT_STOPPED, EXIT_SUPERSEDED, Agent, Clock
from spotopt.young_daly import young_daly_s

__all__ = [
    "ENV_VARS",
    "EXIT_STOPPED",
    "EXIT_SUPERSEDED",
    "Agent",
    "AgentConfig",
    "checkpoint",
    "current",
    "finish",
    "progress",
    "resume",
    "set_clock",
    "should_checkpoint",
    "should_stop",
    "start_step",
    "young_daly_s",
]

_agent: Agent | None = None
_clock: Clock = time.time
_lock = threading.Lock()


def set_clock(clock: Clock) -> None:
    """Make the agent read time from ``clock`` (seconds since the epoch), e.g. a simulated clock."""
    global _clock
    _clock = clock
    if _agent is not None:
        _agent.clock = clock


def current() -> Agent:
    """The process's agent, built from the environment on first use."""
    global _agent
    with _lock:
        if _agent is None:
            config = AgentConfig.from_environ(os.environ)
            clock = _clock
            if config.clock_file is not None and clock is time.time:
                from functools import partial

                from spotopt.simclock import file_clock

                clock = partial(file_clock, config.clock_file)
            _agent = Agent(config, clock=clock)
        return _agent


def resume() -> Path | None:
    """None, or a local directory holding the newest verified checkpoint (checksums re-checked)."""
    return current().resume()


def start_step() -> int:
    """The step to continue from: the restored checkpoint's step, or 0."""
    return current().start_step()


def progress(step: int) -> None:
    """Report that ``step`` steps are done (cheap; heartbeats are written in the background)."""
    current().progress(step)


def should_checkpoint() -> bool:
    """Periodic (``SPOTOPT_CHECKPOINT_EVERY`` or Young/Daly), or requested: daemon, SIGTERM, notice."""
    return current().should_checkpoint()


def checkpoint(step: int) -> AbstractContextManager[Path]:
    """``with agent.checkpoint(step) as d:`` write files into ``d``; verified in the store on exit."""
    return current().checkpoint(step)


def should_stop() -> bool:
    """True after a checkpoint-and-stop request, SIGTERM or a preemption notice, once saved."""
    return current().should_stop()


def finish() -> None:
    """Mark the job complete (its newest verified checkpoint is the result); see ``Agent.finish``."""
    current().finish()
