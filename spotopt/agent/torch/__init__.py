"""The agent for PyTorch loops, one process or DistributedDataParallel (extra ``spotopt-gpu[torch]``).

```python
from spotopt.agent import torch as agent
step = agent.resume(model=model, optimizer=opt, scheduler=sched)  # 0, or the restored step
while step < total_steps:
    train_one_step()
    step += 1
    if agent.step(step, model=model, optimizer=opt, scheduler=sched):  # checkpoints when due
        break                                                           # stop asked: state is saved
agent.finish(model=model, optimizer=opt, scheduler=sched)  # the final state, then job complete
```

On top of ``spotopt.agent`` (its manifest, fencing, store and notices unchanged): a checkpoint
is one file (``state.STATE_FILE``) holding the model, optimizer, scheduler, grad scaler, the
user's ``extra`` and every RNG of every rank. Under ``torch.distributed`` every rank makes the
same calls; rank 0 alone runs the agent and writes, the others follow its decisions through
collectives (``ranks``), so all resume from, checkpoint at and stop at the same step.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from typing import Any

import torch

from spotopt import agent as _agent
from spotopt.agent.torch.data import ResumableSampler
from spotopt.agent.torch.ranks import LocalStop, Ranks
from spotopt.agent.torch.state import (
    STATE_FILE,
    Parts,
    apply,
    capture,
    from_bytes,
    rng_kept,
    rng_state,
    to_bytes,
)

__all__ = ["STATE_FILE", "ResumableSampler", "finish", "resume", "should_checkpoint", "step"]

_local_stop = LocalStop()
_reported_step = 0
"""The last step handed to ``step``: what ``finish`` checkpoints if it is newer than the store's."""


def _warn(message: str) -> None:
    print(f"spotopt agent: {message}", file=sys.stderr, flush=True)


def resume(
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
    extra: MutableMapping[str, Any] | None = None,
) -> int:
    """Restore everything from the newest verified checkpoint; the step to continue from (0: fresh).

    Every rank calls it with its own objects (the model may be wrapped in DDP or compiled; the
    checkpoint holds the bare module's state). Rank 0 restores from the store and hands the file
    to the other ranks, so nodes need no shared disk.
    """
    global _reported_step
    ranks = Ranks.current()
    _local_stop.install(ranks, os.environ)

    def restore() -> tuple[int, bytes | None]:
        directory = _agent.resume()
        return _agent.start_step(), (directory / STATE_FILE).read_bytes() if directory else None

    with rng_kept():
        start, data = ranks.from_zero(restore)
    if data is not None:
        apply(from_bytes(data), Parts(model, optimizer, scheduler, scaler, extra), ranks.rank, _warn)
    _reported_step = start
    return start


def should_checkpoint() -> bool:
    """Whether any rank's agent wants a checkpoint now (periodic, daemon, SIGTERM, notice), the
    same answer on every rank. ``step`` asks this itself; call it only to checkpoint on your own."""
    return any(_agreement()[:2])


def _agreement() -> list[int]:
    """[checkpoint due, a rank other than 0 saw a stop of its own, rank 0 may stop now]."""
    ranks = Ranks.current()
    if ranks.rank == 0:
        current = _agent.current()
        mine = [int(current.should_checkpoint()), 0, int(current.should_stop())]
    else:
        mine = [0, int(_local_stop.reason is not None), 0]
    return ranks.agree(mine)


def step(
    n: int,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any = None,
    scaler: Any = None,
    extra: MutableMapping[str, Any] | None = None,
) -> bool:
    """Call after step ``n`` on every rank: report progress, checkpoint when due or asked, and
    return True when the loop must stop (the state of step ``n`` is then in a verified checkpoint)."""
    global _reported_step
    _reported_step = n
    ranks = Ranks.current()
    if ranks.rank == 0:
        with rng_kept():
            _agent.progress(n)
    due, stopper, stop_now = _agreement()
    if not due and not stopper:
        return bool(stop_now)
    return _write(ranks, n, Parts(model, optimizer, scheduler, scaler, extra))


def _write(ranks: Ranks, n: int, parts: Parts) -> bool:
    """Checkpoint step ``n`` (rank 0 writes every rank's RNG state); whether to stop, on every rank.

    A rank's own stop reason travels with its RNG state; rank 0's agent then stops as well.
    """
    gathered = ranks.gather((rng_state(), _local_stop.reason))

    def save() -> bool:
        current = _agent.current()
        for why in {why for _, why in gathered if why is not None}:
            if current.stop_reason is None:
                current.request_stop(why)
        last = current.last_checkpoint
        if last is None or last.step < n:
            payload = capture(n, parts, [rng for rng, _ in gathered])
            with current.checkpoint(n) as directory:
                (directory / STATE_FILE).write_bytes(to_bytes(payload))
        return current.should_stop()

    with rng_kept():
        return bool(ranks.from_zero(save))


def finish(
    *,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
    scaler: Any = None,
    extra: MutableMapping[str, Any] | None = None,
) -> None:
    """Mark the job complete, as ``spotopt.agent.finish``; with ``model`` and ``optimizer``, first
    checkpoint the last step given to ``step`` unless it is already saved.

    After a requested stop every rank exits with status 0 (nothing after the loop runs as if
    training were complete); a superseded epoch makes every rank exit with status 5.
    """
    ranks = Ranks.current()
    if model is not None and optimizer is not None:
        parts = Parts(model, optimizer, scheduler, scaler, extra)
        unsaved = ranks.from_zero(lambda: _unsaved(_reported_step))
        if unsaved:
            _write(ranks, _reported_step, parts)
    ranks.from_zero(_agent.finish)
    ranks.barrier()


def _unsaved(n: int) -> bool:
    current = _agent.current()
    last = current.last_checkpoint
    return current.stop_reason is None and (last is None or last.step < n)
