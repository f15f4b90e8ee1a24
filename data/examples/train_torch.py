"""A PyTorch training job under the spotopt agent: a small MLP on generated data, CPU, seconds.

Run it alone (checkpoints go to ./spotopt-checkpoints), under spotopt, or with several processes
(DistributedDataParallel on gloo; ``launch_ddp.py`` starts them, so does ``torchrun``)::

    python data/examples/train_torch.py --steps 300 --out result
    spotopt agent run-local data/examples/train_torch.py -- --steps 300 --out result
    python data/examples/launch_ddp.py --nproc 2 data/examples/train_torch.py -- --steps 300 --out result

It uses every kind of state a resume must bring back: AdamW's moments, a learning-rate
schedule, dropout (torch's generator, a different stream per rank), input noise from NumPy and
a label flip from Python's ``random``, and a shuffled loader part-way through an epoch. With
deterministic algorithms on one thread, a run resumed from any checkpoint ends bit-identical to
an uninterrupted one. ``--out DIR`` receives ``model.pt`` and ``optimizer.pt`` (state dicts) and
``losses.pt``; ``--log FILE`` gets ``<step> <loss hex> <epoch>`` per step from rank 0.
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from spotopt.agent import torch as agent

FEATURES, HIDDEN, SAMPLES, BATCH = 16, 64, 512, 32


def make_data(seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(SAMPLES, FEATURES, generator=generator)
    w = torch.randn(FEATURES, generator=generator)
    y = (torch.tanh(x @ w) > 0).float()
    return TensorDataset(x, y)


def make_model() -> nn.Module:
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Dropout(0.1), nn.Linear(HIDDEN, 1), nn.Flatten(0)
    )


def held(until_file: Path | None, step: int, world: int) -> bool:
    """True while ``until_file`` says not to go past ``step`` yet (tests hold the job there);
    every rank gets the same answer, or one would train while another waits in a collective."""
    if until_file is None:
        return False
    try:
        hold = step >= int(until_file.read_text(encoding="utf-8").strip() or 0)
    except (FileNotFoundError, ValueError):
        hold = False
    if world > 1:
        flag = torch.tensor([int(hold)])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        hold = bool(flag.item())
    return hold


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write model.pt, optimizer.pt and losses.pt here when done")
    parser.add_argument("--log", type=Path, help="append '<step> <loss hex> <epoch>' per step (rank 0)")
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per step (tests: slow it down)")
    parser.add_argument("--init-method", default="env://", help="torch.distributed rendezvous")
    parser.add_argument("--until-file", type=Path, help="tests: train no further than the step it holds")
    args = parser.parse_args(argv)

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", init_method=args.init_method, world_size=world, rank=rank)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    net = make_model()
    model = nn.parallel.DistributedDataParallel(net) if world > 1 else net
    torch.manual_seed(args.seed + 1 + rank)  # then each rank its own dropout stream
    np.random.seed(args.seed + rank)
    random.seed(args.seed + rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=50, gamma=0.7)
    dataset = make_data(args.seed)
    sampler = agent.ResumableSampler(
        DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed), BATCH
    )
    # Its own generator: making an iterator must not draw from torch's global one.
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler, generator=torch.Generator())
    extra: dict[str, object] = {"losses": []}

    step = agent.resume(model=model, optimizer=optimizer, scheduler=scheduler, extra=extra)
    losses: list[float] = extra["losses"]  # type: ignore[assignment]
    log = args.log.open("a", encoding="utf-8") if args.log and rank == 0 else None
    epoch_label = os.environ.get("SPOTOPT_EPOCH", "0")
    stop = False
    while step < args.steps and not stop:
        sampler.at(step)
        for x, y in loader:
            while held(args.until_file, step, world) and not stop:  # still serve the agent while held
                stop = agent.step(step, model=model, optimizer=optimizer, scheduler=scheduler, extra=extra)
                time.sleep(0.01)
            if stop:
                break
            x = x + torch.from_numpy(np.random.normal(0, 0.05, x.shape).astype(np.float32))
            if random.random() < 0.05:
                y = 1 - y
            loss = nn.functional.binary_cross_entropy_with_logits(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            losses.append(float(loss.item()))
            if log:
                log.write(f"{step} {losses[-1].hex()} {epoch_label}\n")
                log.flush()
            if args.step_delay:
                time.sleep(args.step_delay)
            stop = agent.step(step, model=model, optimizer=optimizer, scheduler=scheduler, extra=extra)
            if stop or step == args.steps:
                break
    agent.finish(model=model, optimizer=optimizer, scheduler=scheduler, extra=extra)
    if args.out and rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        torch.save(net.state_dict(), args.out / "model.pt")
        torch.save(optimizer.state_dict(), args.out / "optimizer.pt")
        torch.save(torch.tensor(losses, dtype=torch.float64), args.out / "losses.pt")
    if world > 1:
        dist.barrier()  # no rank tears the group down while another still uses it (a hang at exit)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
