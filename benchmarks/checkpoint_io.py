"""Checkpoint I/O benchmark: SIGTERM → verified checkpoint, and write / verify / restore throughput.

For each store (``file://`` in a temp directory; S3 served over HTTP by a moto server that this
script starts as its own process on 127.0.0.1) and each checkpoint size (10 MB, 100 MB, 1 GB):

- ``sigterm → verified``: a job under the agent, launched by the local provider, holds a state
  of that size; the benchmark sends SIGTERM (``LocalProvider.terminate``) and measures until
  the process has exited, which the agent does only after the checkpoint's manifest is written
  (files uploaded, read back and checked first). The checkpoint is then verified once more.
- ``notice → verified``: the same through the local provider's ``preempt`` (the agent's
  poller, every ``--poll`` seconds, sees the notice file; so the figure includes up to one poll).
- ``write``: ``write_checkpoint`` of one file (upload, read back + sha256, manifest), MB/s.
- ``verify`` / ``restore``: ``verify_files`` and ``download_checkpoint`` (with hashing), MB/s.

Set against the clouds' notice windows: AWS 120 s, GCP 30 s, Azure ≥ 30 s.

    python benchmarks/checkpoint_io.py [--sizes 10,100,1000] [--stores file,s3] [--poll 1]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from spotopt.checkpoints import (  # noqa: E402
    Location,
    download_checkpoint,
    grant_lease,
    trusted_checkpoints,
    verify_files,
    write_checkpoint,
)
from spotopt.clouds.common.base import LaunchSpec  # noqa: E402
from spotopt.clouds.local.provider import LOCAL_MARKET, LocalProvider  # noqa: E402

MB = 1_000_000
WINDOWS_S = {"AWS": 120, "GCP": 30, "Azure": 30}

JOB = """
import os, sys, time
from spotopt import agent
size = int(sys.argv[1])
block = os.urandom(min(size, 8 << 20))
agent.resume()
step = 0
while True:
    time.sleep(0.01)
    step += 1
    agent.progress(step)
    if step == 1:
        print("ready", flush=True)
    if agent.should_checkpoint():
        with agent.checkpoint(step) as d, open(d / "state.bin", "wb") as f:
            left = size
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    if agent.should_stop():
        break
agent.finish()
"""


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url, timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moto server did not start")


def stop_on_signal(
    store: tuple[str, dict[str, Any]], size: int, work: Path, how: str, poll_s: float
) -> tuple[float, int]:
    """Seconds from SIGTERM (or the notice) until the job exited with its checkpoint verified."""
    url, options = store
    loc = Location(url, options)
    job = f"bench-{how}-{size}"
    lease = grant_lease(loc, job, datetime.now(UTC))
    work.mkdir(parents=True)
    script = work / "job.py"
    script.write_text(JOB)
    provider = LocalProvider(work / "state", grace_s=600)
    env = {"SPOTOPT_POLL_EVERY": f"{poll_s}s", "SPOTOPT_CHECKPOINT_EVERY": "10h"}
    spec = LaunchSpec(job, lease.epoch, (sys.executable, str(script), str(size)), url, options, env=env)
    instance = provider.launch(spec, LOCAL_MARKET, f"{job}-{time.time()}")
    log = provider.log_path(instance.instance_id)
    while "ready" not in log.read_text():
        if not provider.status(instance.instance_id).state.is_live:
            raise SystemExit(log.read_text())
        time.sleep(0.05)
    time.sleep(0.2)  # let the agent's background thread settle (heartbeat, first poll)
    start = time.perf_counter()
    if how == "sigterm":
        status = provider.terminate(instance.instance_id)
    else:
        status = provider.preempt(instance.instance_id, notice_s=600)
    took = time.perf_counter() - start
    if status.exit_code != 0:
        raise SystemExit(f"job did not stop cleanly ({status}):\n{log.read_text()}")
    manifest = trusted_checkpoints(loc, job, None)[0]
    verify_files(loc, manifest)
    assert manifest.size_bytes == size
    return took, manifest.size_bytes


def throughput(store: tuple[str, dict[str, Any]], size: int, work: Path) -> dict[str, float]:
    url, options = store
    loc = Location(url, options)
    src = work / "src"
    src.mkdir(exist_ok=True)
    block = os.urandom(8 << 20)
    with (src / "state.bin").open("wb") as f:
        left = size
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n
    job = f"tp-{size}"
    t = time.perf_counter()
    manifest = write_checkpoint(loc, job, 1, 0, src, datetime.now(UTC), keep=1)
    write_s = time.perf_counter() - t
    t = time.perf_counter()
    verify_files(loc, manifest)
    verify_s = time.perf_counter() - t
    t = time.perf_counter()
    download_checkpoint(loc, manifest, work / "restored")
    restore_s = time.perf_counter() - t
    shutil.rmtree(src)
    shutil.rmtree(work / "restored")
    return {"write": size / MB / write_s, "verify": size / MB / verify_s, "restore": size / MB / restore_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", default="10,100,1000", help="checkpoint sizes in MB")
    parser.add_argument("--stores", default="file,s3")
    parser.add_argument("--poll", type=float, default=1.0, help="agent poll interval for the notice run (s)")
    args = parser.parse_args()
    sizes = [int(s) * MB for s in args.sizes.split(",")]
    moto = None
    print(f"notice windows: {', '.join(f'{k} {v} s' for k, v in WINDOWS_S.items())}")
    print(
        "| store | size | SIGTERM → verified (s) | notice → verified (s) | write MB/s | verify MB/s "
        "| restore MB/s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    try:
        for kind in args.stores.split(","):
            with tempfile.TemporaryDirectory(prefix="spotopt-bench-") as tmp:
                work = Path(tmp)
                if kind == "file":
                    store: tuple[str, dict[str, Any]] = (f"file://{work / 'store'}", {})
                else:
                    if moto is None:
                        moto = start_moto()
                    options = {"endpoint_url": moto[1], "key": "bench", "secret": "bench"}
                    Location("s3://bench", options).fs.mkdir("bench")
                    store = ("s3://bench/ckpt", options)
                for size in sizes:
                    case = work / f"case-{size}"
                    case.mkdir()
                    term, _ = stop_on_signal(store, size, case / "t", "sigterm", args.poll)
                    notice, _ = stop_on_signal(store, size, case / "n", "notice", args.poll)
                    rates = throughput(store, size, case)
                    print(
                        f"| {kind} | {size // MB} MB | {term:.2f} | {notice:.2f} | {rates['write']:.0f} | "
                        f"{rates['verify']:.0f} | {rates['restore']:.0f} |",
                        flush=True,
                    )
                    shutil.rmtree(case)
    finally:
        if moto is not None:
            moto[0].terminate()
            moto[0].wait()


if __name__ == "__main__":
    main()
