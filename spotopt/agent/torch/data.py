"""The data loader's position as a function of the step, so a resumed run sees the same batches.

``ResumableSampler`` wraps a sampler whose order depends only on its epoch
(``DistributedSampler`` with its seed, or a ``SequentialSampler``) and skips, at the sampler and
not by loading data, the batches of the current epoch that were already trained. Deriving the
position from the step (one step = one batch) rather than counting what the loader fetched
keeps it right when worker processes prefetch batches ahead of training.

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
        if isinstance(sampler, RandomSampler):
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

    @property
    def batches_per_epoch(self) -> int:
        n = len(self.sampler)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    def at(self, step: int) -> int:
        """Position the next iteration at ``step`` (steps done so far); returns its epoch."""
        self.epoch, batches = divmod(step, self.batches_per_epoch)
        self._skip = batches * self.batch_size
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(self.epoch)
        return self.epoch

    def __iter__(self) -> Iterator[int]:
        skip, self._skip = self._skip, 0
        return itertools.islice(iter(self.sampler), skip, None)

    def __len__(self) -> int:
        return len(self.sampler) - self._skip
