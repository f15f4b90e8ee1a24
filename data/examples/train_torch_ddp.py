"""``train_torch.py`` as N DistributedDataParallel processes on one machine (gloo, CPU)::

    python data/examples/train_torch_ddp.py --nproc 2 -- --steps 300 --out result
    spotopt agent run-local data/examples/train_torch_ddp.py -- --nproc 2 -- --steps 300 --out result

What ``torchrun --standalone --nproc-per-node N`` does, minus what gets in the way under spotopt:
the ranks meet through a file in a fresh directory (no port to pick, so no port to collide on),
a SIGTERM reaching this launcher is passed on to the ranks (each rank's agent turns it into a
checkpoint and a stop), and the launcher exits with the ranks' status (0 after a requested
stop: torchrun reports its own SIGTERM as a failure). If one rank fails the others are killed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = Path(__file__).resolve().with_name("train_torch.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="-- then train_torch.py's arguments")
    opts = parser.parse_args()
    train_args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    with tempfile.TemporaryDirectory(prefix="spotopt-ddp-") as rendezvous:
        init = f"file://{Path(rendezvous) / 'store'}"
        ranks = [
            subprocess.Popen(
                [sys.executable, str(TRAIN), "--init-method", init, *train_args],
                env=os.environ | {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(opts.nproc)},
            )
            for r in range(opts.nproc)
        ]

        def forward(sig: int, _frame: object) -> None:
            for proc in ranks:
                if proc.poll() is None:
                    proc.send_signal(sig)

        signal.signal(signal.SIGTERM, forward)
        status = 0
        while any(proc.poll() is None for proc in ranks):
            failed = [proc.returncode for proc in ranks if proc.returncode not in (None, 0)]
            if failed and status == 0:  # a rank died: the others would wait for it in a collective
                status = failed[0]
                for proc in ranks:
                    if proc.poll() is None:
                        proc.kill()
            time.sleep(0.05)
        codes = [proc.returncode for proc in ranks]
    code = status or next((c for c in codes if c != 0), 0)
    sys.exit(128 - code if code < 0 else code)  # killed by signal N: the shell's 128 + N


if __name__ == "__main__":
    main()
