"""The spotopt agent in a Lightning ``Trainer`` (extra ``spotopt-gpu[lightning]``)::

    from spotopt.agent.torch import ResumableSampler
    from spotopt.agent.torch.lightning import SpotoptCallback
    sampler = ResumableSampler(DistributedSampler(data, num_replicas=1, rank=0, seed=0), batch_size=32)
    loader = DataLoader(data, batch_size=32, sampler=sampler, generator=torch.Generator())
    trainer = L.Trainer(max_steps=1000, callbacks=[SpotoptCallback(sampler)])
    trainer.fit(module, loader)  # resumes from the newest checkpoint; after a requested stop, exits 0

The callback is ``spotopt.agent.torch``'s ``resume``/``step``/``finish`` at Lightning's hooks; the
state is saved by them, in their file. Besides the module, the optimizers and LR schedulers it
keeps Lightning's loop state (global step, epoch, batch progress: what Lightning restores from a
checkpoint of its own) and positions the loader's ``ResumableSampler`` at the restored step before
Lightning makes its first iterator. Mid-epoch, the random generators are set once more at the
first batch, in case making the iterator drew from them.

It checkpoints at ``on_train_batch_end``, after Lightning stepped the optimizer and the step-wise
schedulers. A SIGTERM is the agent's, as in any loop: from ``on_train_start`` the callback puts
back the handler Lightning replaced (the agent's on rank 0, its stop flag on the others), so every
rank stops at one agreed step, saved, and exits 0. Lightning's own handler, under DDP, broadcasts
from inside the signal handler, which pairs with whatever collective the other rank is in at
that moment. The state of other callbacks (early stopping, ``ModelCheckpoint``) is not kept.

Under DDP every rank runs the callback; the process group may be initialised before the
``Trainer`` starts (``data/examples/train_lightning.py`` does, with ``launch_ddp.py``), and the
loader's ``ResumableSampler`` holds the rank's shard, so ``use_distributed_sampler=False``.
"""

from __future__ import annotations

import signal
import threading
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.warnings import PossibleUserWarning

from spotopt.agent import torch as agent
from spotopt.agent.torch.data import ResumableSampler
from spotopt.agent.torch.state import rng_state, set_rng_state

__all__ = ["SpotoptCallback"]


class _Loops:
    """Lightning's fit loop as a checkpoint extra (its own ``state_dict``, as in a ``.ckpt``)."""

    def __init__(self, trainer: pl.Trainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.fit_loop.state_dict()

    def load_state_dict(self, saved: Mapping[str, Any]) -> None:
        self.trainer.fit_loop.load_state_dict(dict(saved))


class SpotoptCallback(pl.Callback):
    """Resume at ``on_fit_start``, take SIGTERM back at ``on_train_start``, checkpoint at
    ``on_train_batch_end``, finish at ``on_fit_end``."""

    def __init__(self, sampler: ResumableSampler | None = None) -> None:
        """``sampler``: the training loader's; without one a resume mid-epoch starts the epoch over."""
        self.sampler = sampler
        self._parts: dict[str, Any] = {}
        self._rng_at_resume: dict[str, Any] | None = None
        self._last_step = -1
        self._sigterm: Callable[..., Any] | int | None = None

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        optimizers = list(trainer.optimizers)
        schedulers = [config.scheduler for config in trainer.lr_scheduler_configs]
        extra: dict[str, Any] = {"loops": _Loops(trainer)}
        extra |= {f"optimizer.{i}": o for i, o in enumerate(optimizers[1:], start=1)}
        extra |= {f"scheduler.{i}": s for i, s in enumerate(schedulers[1:], start=1)}
        self._parts = {
            "model": pl_module,
            "optimizer": optimizers[0],
            "scheduler": schedulers[0] if schedulers else None,
            "extra": extra,
        }
        step = agent.resume(**self._parts)
        self._sigterm = signal.getsignal(signal.SIGTERM)  # as resume left it; Lightning replaces it next
        self._last_step = step
        if 0 <= trainer.max_steps <= step:
            _close_last_epoch(trainer)
        if step == 0 or self.sampler is None:
            return
        self.sampler.at(step, trainer.accumulate_grad_batches)
        if self.sampler.mid_epoch:
            self._rng_at_resume = rng_state()
            # Lightning cannot see that the sampler, not the loader, holds the position
            warnings.filterwarnings(
                "ignore", "You're resuming from a checkpoint that ended", PossibleUserWarning
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._sigterm)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._rng_at_resume is not None:
            set_rng_state(self._rng_at_resume, agent._warn)
            self._rng_at_resume = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step == self._last_step:  # accumulating gradients: no optimizer step yet
            return
        self._last_step = step
        if agent.step(step, **self._parts):
            trainer.should_stop = True

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Here rather than at ``on_train_end``: resumed from its last step (lost before finishing),
        Lightning skips the whole fit loop, ``on_train_end`` included, and the job would never be
        marked complete."""
        agent.finish(**self._parts)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        """Lightning raises on a SIGTERM that came before ``on_train_start`` once the batch is done:
        checkpoint that step (unless saved), exit 0."""
        if isinstance(exception, SIGTERMException) and self._parts:
            agent.step(trainer.global_step, **self._parts)
            agent.finish(**self._parts)


def _close_last_epoch(trainer: pl.Trainer) -> None:
    """Count the epoch that the last step ended, as Lightning's loop does on leaving it: resumed
    from a checkpoint of that step (lost before finishing), Lightning skips the whole loop, and
    its ``current_epoch`` would stay one short of the uninterrupted run's. A checkpoint ``finish``
    wrote after the loop already counts it."""
    progress = trainer.fit_loop.epoch_progress
    if progress.current.processed < progress.current.started:
        progress.increment_processed()
        progress.increment_completed()
