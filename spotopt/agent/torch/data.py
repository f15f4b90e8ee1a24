"""The data loader's position as a function of the step, so a resumed run sees the same batches.

``ResumableSampler`` wraps a sampler whose order depends only on its epoch
(``DistributedSampler`` with its seed, or a ``SequentialSampler``) and skips, at the sampler and
not by loading data, the batches of the current epoch that were already trained. Deriving the
position from the step (one step = one batch) rather than counting what the loader fetched
keeps it right when worker processes prefetch batches ahead of training.

The epoch follows the step too: ``at`` sets it, and every later iteration is the next epoch.
The sampler has no ``set_epoch``, on purpose: trainers that set each epoch themselves number
them from their own state, which after a resume is not the steps' epoch (the Hugging Face
Trainer counts from 0 again; Lightning, resumed a second time at an epoch's end, one short), so
they leave the sampler alone and one rule serves a plain loop and both trainers.

Two things the sampler cannot do for the loop (the example does both): give the ``DataLoader``
its own ``generator`` — making an iterator otherwise draws a seed from torch's global generator,
so an iterator made at a resume would shift every later random draw — and keep randomness in
worker processes a function of the sample (their generators are not in the checkpoint).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import RandomSampler, Sampler


class ResumableSampler(Sampler[int]):
    def __init__(self, sampler: Sampler[Any], batch_size: int, drop_last: bool = False) -> None:
        """``batch_size`` and ``drop_last`` as given to the ``DataLoader`` (per rank)."""
        if isinstance(sampler, RandomSampler) and not hasattr(sampler, "set_epoch"):
            raise ValueError(
                "sampler: a RandomSampler draws a new order from the global generator each epoch, "
                "so a resumed epoch would differ; use DistributedSampler(dataset, num_replicas=…, "
                "rank=…, shuffle=True, seed=…), whose order is a function of the epoch"
            )
        if not isinstance(sampler, Sized):
            raise ValueError("sampler: needs a length to know where an epoch ends")
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.epoch = 0
        self._skip = 0
        self._placed = True
        """Whether the next iteration is of ``epoch`` (placed by ``at``), not of the one after."""

    @property
    def batches_per_epoch(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def at(self, step: int, batches_per_step: int = 1) -> int:
        """Position the next iteration after ``step`` steps (done so far); returns its epoch.

        With gradient accumulation a step takes ``batches_per_step`` batches and an epoch's last
        step what is left of it, as the Hugging Face Trainer and Lightning count them.
        """
        steps_per_epoch = math.ceil(self.batches_per_epoch / batches_per_step)
        epoch, steps = divmod(step, steps_per_epoch)
        self._skip = steps * batches_per_step * self.batch_size
        self._place(epoch)
        return epoch

    def exhaust(self) -> None:
        """Make the next iteration yield nothing: a trainer resumed at its last step must train no
        other (the Hugging Face Trainer runs a step before it looks at ``max_steps``)."""
        self._skip = len(self.sampler)
        self._placed = True

    @property
    def mid_epoch(self) -> bool:
        """Whether the next iteration starts part-way through its epoch (``at`` a step inside one)."""
        return self._skip > 0

    def _place(self, epoch: int) -> None:
        self.epoch = epoch
        self._placed = True
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        if not self._placed:
            self._place(self.epoch + 1)
        self._placed = False
        skip, self._skip = self._skip, 0
        return itertools.islice(iter(self.sampler), skip, None)

    def __len__(self) -> int:
        """A whole epoch's, a resumed one's too: trainers read it once for every epoch and count
        a resumed epoch's batches from its start (Lightning)."""
        return len(self.sampler)
