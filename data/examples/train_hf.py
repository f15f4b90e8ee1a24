"""A Hugging Face ``Trainer`` job under the spotopt agent: a tiny BERT classifier, built in code
(no download), on generated token ids, CPU, seconds::

    python data/examples/train_hf.py --steps 60 --out result
    spotopt agent run-local data/examples/train_hf.py -- --steps 60 --out result

The one spotopt line is ``callbacks=[SpotoptCallback()]``. Dropout, AdamW, a linear warm-up and
decay schedule and the Trainer's shuffled loader are all in play; with deterministic algorithms on
one thread a run resumed from any checkpoint ends bit-identical to an uninterrupted one.
``--out DIR`` receives ``model.pt`` and ``optimizer.pt`` (state dicts) and ``counters.pt`` (the
Trainer's global step and epoch, the last learning rate); ``--log``, ``--step-delay`` and
``--die-before-finish`` are the tests' (``step_record.py``).
"""

from __future__ import annotations

import argparse
import tempfile
from typing import Any

import torch
from step_record import arguments, record, train_end
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from spotopt.agent.torch.hf import SpotoptCallback

SAMPLES, LENGTH, VOCAB, BATCH = 96, 12, 50, 8


class TokenData(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token ids; the label is whether token 7 occurs."""

    def __init__(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (SAMPLES, LENGTH), generator=generator)
        self.labels = (self.ids == 7).any(dim=1).long()

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


class StepRecord(TrainerCallback):
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        record(self.args, state.global_step, model)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        train_end(self.args)


def main() -> None:
    args = arguments(__doc__.split("\n", 1)[0]).parse_args()

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=LENGTH,
        num_labels=2,
    )
    model = BertForSequenceClassification(config)
    with tempfile.TemporaryDirectory(prefix="hf-output-") as output_dir:  # the Trainer's own saves: none
        training = TrainingArguments(
            output_dir=output_dir,
            max_steps=args.steps,
            per_device_train_batch_size=BATCH,
            learning_rate=3e-3,
            warmup_steps=5,
            optim="adamw_torch",
            seed=args.seed,
            use_cpu=True,
            save_strategy="no",
            report_to=[],
            disable_tqdm=True,
            dataloader_num_workers=0,
        )
        trainer = Trainer(
            model=model,
            args=training,
            train_dataset=TokenData(args.seed),
            callbacks=[StepRecord(args), SpotoptCallback()],
        )
        trainer.train()
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(model.state_dict(), args.out / "model.pt")
        torch.save(trainer.optimizer.state_dict(), args.out / "optimizer.pt")
        lr = trainer.lr_scheduler.get_last_lr()
        counters = {"global_step": trainer.state.global_step, "epoch": trainer.state.epoch, "lr": lr}
        torch.save(counters, args.out / "counters.pt")


if __name__ == "__main__":
    main()
