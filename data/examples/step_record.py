"""What the trainer examples (``train_hf.py``, ``train_lightning.py``) share: their arguments and a
per-step record of the parameters for the tests that interrupt them (``--log``, written by rank 0
when there are several processes; a trainer hands its callbacks no per-step loss, so the record is
the sum of all parameters: in practice a different value at any differing bit), and a death
between the last step and the agent's finish (``--die-before-finish``)."""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch


def arguments(description: str) -> argparse.ArgumentParser:
    """The shared arguments; an example adds its own, then parses."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, help="write model.pt, optimizer.pt and counters.pt here when done"
    )
    parser.add_argument("--log", type=Path, help="append '<step> <fingerprint hex> <epoch>' per step")
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (tests: slow it down)")
    parser.add_argument(
        "--die-before-finish",
        action="store_true",
        help="SIGKILL this process when training ends, before the agent's finish (tests: a job lost there)",
    )
    return parser


def record(args: argparse.Namespace, step: int, model: torch.nn.Module) -> None:
    """After each step: append ``<step> <fingerprint hex> <agent epoch>`` to ``--log``, then sleep."""
    if args.log is not None and os.environ.get("RANK", "0") == "0":
        fingerprint = float(sum(p.detach().double().sum() for p in model.parameters()))
        line = f"{step} {fingerprint.hex()} {os.environ.get('SPOTOPT_EPOCH', '0')}\n"
        with args.log.open("a", encoding="utf-8") as out:
            out.write(line)
    if args.step_delay:
        time.sleep(args.step_delay)


def train_end(args: argparse.Namespace) -> None:
    """At the trainer's end of training, before ``SpotoptCallback`` (listed after the recorder)
    finishes the job: with ``--die-before-finish``, the process dies there as a lost machine would."""
    if args.die_before_finish:
        os.kill(os.getpid(), signal.SIGKILL)
