"""A training script as N DistributedDataParallel processes on one machine (gloo, CPU)::

    python data/examples/launch_ddp.py --nproc 2 data/examples/train_torch.py -- --steps 300 --out result
    spotopt agent run-local data/examples/launch_ddp.py -- data/examples/train_torch.py -- --steps 300

What ``torchrun --standalone --nproc-per-node N`` does, minus what gets in the way under spotopt:
the ranks meet through a file in a fresh directory (the script gets ``--init-method file://…``:
no port to pick, so no port to collide on), a SIGTERM reaching this launcher is passed on to the
ranks (each rank's agent turns it into a checkpoint and a stop), and the launcher exits with the
ranks' status (0 after a requested stop: torchrun reports its own SIGTERM as a failure). If one
rank fails the others are killed.

The script is imported once, here, and the ranks are forked from this process: torch is imported
once rather than once per rank (seconds each). Nothing of torch has run before the fork (no
thread pool, no CUDA context: each rank initialises its own device), which is what forking a
process that imported torch needs. The script defines ``main(argv)`` and reads ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE`` (set as torchrun sets them) and ``--init-method``.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("script", type=Path, help="a training script that defines main(argv)")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    opts = parser.parse_args()
    script_args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    sys.path.insert(0, str(opts.script.resolve().parent))
    train = importlib.import_module(opts.script.stem).main
    fork = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="spotopt-ddp-") as rendezvous:
        argv = ["--init-method", f"file://{Path(rendezvous) / 'store'}", *script_args]
        ranks = [fork.Process(target=_rank, args=(train, r, opts.nproc, argv)) for r in range(opts.nproc)]
        for proc in ranks:
            proc.start()

        def forward(sig: int, _frame: object) -> None:
            for proc in ranks:
                if proc.pid is not None and proc.exitcode is None:
                    os.kill(proc.pid, sig)

        signal.signal(signal.SIGTERM, forward)
        status = 0
        while any(proc.is_alive() for proc in ranks):
            failed = [proc.exitcode for proc in ranks if proc.exitcode not in (None, 0)]
            if failed and status == 0:  # a rank died: the others would wait for it in a collective
                status = failed[0]
                for proc in ranks:
                    if proc.is_alive():
                        proc.kill()
            time.sleep(0.05)
        codes = [proc.exitcode for proc in ranks]
    code = status or next((c for c in codes if c != 0), 0)
    assert code is not None
    sys.exit(128 - code if code < 0 else code)  # killed by signal N: the shell's 128 + N


def _rank(train: Callable[[list[str]], None], rank: int, world: int, argv: list[str]) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)})
    train(argv)


if __name__ == "__main__":
    main()
