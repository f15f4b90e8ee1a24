"""A Lightning job under the spotopt agent: a small MLP on generated data, CPU, seconds, in one
process or as several DistributedDataParallel processes (gloo)::

    python data/examples/train_lightning.py --steps 60 --out result
    spotopt agent run-local data/examples/train_lightning.py -- --steps 60 --out result
    python data/examples/launch_ddp.py --nproc 2 data/examples/train_lightning.py -- --steps 60 --out result

The spotopt lines: the loader's ``ResumableSampler`` (its own ``generator`` too) and
``callbacks=[SpotoptCallback(sampler)]``. Dropout, AdamW, a step-wise LR schedule and a shuffled
loader are in play; with deterministic algorithms on one thread a run resumed from any checkpoint
ends bit-identical to an uninterrupted one. ``--out DIR`` receives ``model.pt`` and
``optimizer.pt`` (state dicts) and ``counters.pt`` (Lightning's global step and epoch, the last
learning rate); ``--log``, ``--step-delay`` and ``--die-before-finish`` are the tests'
(``step_record.py``).

Under several processes (``WORLD_SIZE`` > 1, as ``launch_ddp.py`` or ``torchrun`` set it) the
script initialises the process group itself (Lightning uses one it finds initialised and, with
``LOCAL_RANK`` set, starts no processes of its own), gives each rank its shard of the data in the
``ResumableSampler`` (so Lightning must not put in a sampler of its own:
``use_distributed_sampler=False``) and its own dropout stream, and rank 0 writes ``--out``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from step_record import arguments, record, train_end
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from spotopt.agent.torch import ResumableSampler
from spotopt.agent.torch.lightning import SpotoptCallback

FEATURES, HIDDEN, SAMPLES, BATCH = 16, 32, 96, 8


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Dropout(0.1), nn.Linear(HIDDEN, 1), nn.Flatten(0)
        )

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.binary_cross_entropy_with_logits(self.net(x), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class StepRecord(pl.Callback):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def on_train_batch_end(self, trainer: pl.Trainer, module: pl.LightningModule, *_: Any) -> None:
        record(self.args, trainer.global_step, module)

    def on_train_end(self, trainer: pl.Trainer, module: pl.LightningModule) -> None:
        train_end(self.args)


def main(argv: list[str] | None = None) -> None:
    parser = arguments(__doc__.split("\n", 1)[0])
    parser.add_argument("--init-method", default="env://", help="torch.distributed rendezvous")
    args = parser.parse_args(argv)

    torch.set_num_threads(1)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", init_method=args.init_method, world_size=world, rank=rank)
    pl.seed_everything(args.seed, verbose=False)
    generator = torch.Generator().manual_seed(args.seed)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    y = (x @ torch.randn(FEATURES, generator=generator) > 0).float()
    data = TensorDataset(x, y)
    sampler = ResumableSampler(DistributedSampler(data, num_replicas=world, rank=rank, seed=args.seed), BATCH)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler, generator=torch.Generator())
    module = Classifier()  # the same initial weights on every rank
    if world > 1:
        pl.seed_everything(args.seed + 1 + rank, verbose=False)  # then each rank its own dropout stream
    trainer = pl.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        use_distributed_sampler=False,
        deterministic=True,
        callbacks=[StepRecord(args), SpotoptCallback(sampler)],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, loader)
    if args.out and rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(module.state_dict(), args.out / "model.pt")
        torch.save(trainer.optimizers[0].state_dict(), args.out / "optimizer.pt")
        counters = {"global_step": trainer.global_step, "epoch": trainer.current_epoch}
        torch.save(
            counters | {"lr": trainer.lr_scheduler_configs[0].scheduler.get_last_lr()},
            args.out / "counters.pt",
        )
    if world > 1:
        dist.barrier()  # no rank tears the group down while another still uses it
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
