"""The spotopt agent in a Hugging Face ``transformers.Trainer`` (extra ``spotopt-gpu[hf]``)::

    from spotopt.agent.torch.hf import SpotoptCallback
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[SpotoptCallback()])
    trainer.train()  # resumes from the newest checkpoint; after a requested stop the process exits 0

The callback is ``spotopt.agent.torch``'s ``resume``/``step``/``finish`` at the Trainer's hooks; the
state is saved by them, in their file. What the Trainer keeps besides the model, optimizer and LR
scheduler goes with it: its ``TrainerState`` (global step, epoch, log history, FLOs, tokens seen,
best metric) and the position in its shuffled data. The Trainer only skips to that position when
it loads a checkpoint of its own, so the callback does it: it wraps the sampler of the Trainer's
loader in a ``ResumableSampler`` placed at the restored step, and, mid-epoch, sets the random
generators once more after the loader's first batch (making its iterator draws a seed from
torch's generator, which the uninterrupted run drew at the start of the epoch), as the Trainer
itself does when it resumes.

Limits: one process (the callback refuses a loader sharded across processes: the position of
each rank's shard is not derived yet); the logged training loss of the first logging window after
a resume is averaged over the steps since 0 (the Trainer keeps that counter outside its state).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from spotopt.agent import torch as agent
from spotopt.agent.torch.data import ResumableSampler
from spotopt.agent.torch.state import rng_state, set_rng_state

__all__ = ["SpotoptCallback"]

KEPT = (
    "global_step",
    "epoch",
    "num_input_tokens_seen",
    "total_flos",
    "log_history",
    "best_metric",
    "best_global_step",
    "best_model_checkpoint",
)
"""The ``TrainerState`` fields a resume restores; the others follow from ``TrainingArguments``."""


class _TrainerStateDict:
    """The live ``TrainerState`` as a checkpoint extra (saved through ``state_dict``)."""

    def __init__(self, state: TrainerState) -> None:
        self.state = state

    def state_dict(self) -> dict[str, str]:
        return {"json": json.dumps({name: getattr(self.state, name) for name in KEPT})}

    def load_state_dict(self, saved: Mapping[str, str]) -> None:
        for name, value in json.loads(saved["json"]).items():
            setattr(self.state, name, value)


class SpotoptCallback(TrainerCallback):
    """Resume at ``on_train_begin``, report and checkpoint at ``on_step_end``, finish at ``on_train_end``."""

    def __init__(self) -> None:
        self._extra: dict[str, Any] = {}
        self._rng_at_resume: dict[str, Any] | None = None
        self._resumed = False
        self._batches_per_epoch = 0

    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        **kwargs: Any,
    ) -> None:
        loader = kwargs["train_dataloader"]
        self._batches_per_epoch = len(loader)
        accumulation = args.gradient_accumulation_steps
        if self._batches_per_epoch % accumulation:
            raise ValueError(
                f"gradient_accumulation_steps: {accumulation} does not divide the {self._batches_per_epoch} "
                "batches of an epoch, so a resume mid-epoch would not be bit-identical; pick a divisor"
            )
        sampler = _resumable_sampler(loader)
        self._extra = {"trainer_state": _TrainerStateDict(state)}
        step = agent.resume(**self._parts(kwargs))
        if step == 0:
            return
        self._resumed = True
        if step >= state.max_steps:  # lost after its last step, before finishing: train none
            sampler.exhaust()
            _trainer_log.addFilter(_quiet_empty_epoch)
            return
        sampler.at(step, accumulation)
        if sampler.mid_epoch:
            self._rng_at_resume = rng_state()

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._rng_at_resume is not None:
            set_rng_state(self._rng_at_resume, agent._warn)
            self._rng_at_resume = None

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._resumed:
            state.epoch = _epoch(state.global_step, self._batches_per_epoch, args.gradient_accumulation_steps)
        if agent.step(state.global_step, **self._parts(kwargs)):
            control.should_training_stop = True

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        _trainer_log.removeFilter(_quiet_empty_epoch)
        agent.finish(**self._parts(kwargs))

    def _parts(self, hook_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "model": hook_kwargs["model"],
            "optimizer": hook_kwargs["optimizer"],
            "scheduler": hook_kwargs.get("lr_scheduler"),
            "extra": self._extra,
        }


_trainer_log = logging.getLogger("transformers.trainer")


def _quiet_empty_epoch(record: logging.LogRecord) -> bool:
    """Drop the Trainer's warning about an epoch without a batch, which is how a job resumed at
    its last step ends without training another (``SpotoptCallback`` exhausts the sampler)."""
    return not record.getMessage().startswith("There seems not to be a single sample")


def _resumable_sampler(loader: Any) -> ResumableSampler:
    """The ``ResumableSampler`` inside the Trainer's (accelerate-prepared) loader, put there on first use."""
    batches = loader.batch_sampler
    if hasattr(batches, "batch_sampler"):
        raise ValueError(
            "train_dataloader: sharded across processes (accelerate's BatchSamplerShard); "
            "spotopt's Trainer callback resumes one-process training only: run one process per job"
        )
    if not isinstance(batches.sampler, ResumableSampler):
        batches.sampler = ResumableSampler(batches.sampler, batches.batch_size, batches.drop_last)
    sampler: ResumableSampler = batches.sampler
    return sampler


def _epoch(global_step: int, batches_per_epoch: int, accumulation: int) -> float:
    """``TrainerState.epoch`` after ``global_step`` steps, computed as the Trainer computes it."""
    steps_per_epoch = math.ceil(batches_per_epoch / accumulation)
    epoch, step = divmod(global_step - 1, steps_per_epoch)
    return epoch + min((step + 1) * accumulation, batches_per_epoch) / batches_per_epoch
