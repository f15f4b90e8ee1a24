"""Real server processes for tests: a free loopback port, start, wait until it answers, stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

STARTUP_S = 60.0
"""How long a server may take to answer (generous: CI machines are shared)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def answering(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except urllib.error.HTTPError:
        return True  # it answered (e.g. 401 without the token)
    except OSError:
        return False


@contextmanager
def spotopt_server(
    args: Sequence[str], ready_url: str, log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m spotopt ARGS`` as a process of its own, yielded once ``ready_url`` answers;
    stopped (SIGTERM, then SIGKILL) and reaped on exit. Its output goes to ``log``."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "spotopt", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        try:
            deadline = time.monotonic() + STARTUP_S
            while not answering(ready_url):
                if proc.poll() is not None:
                    raise AssertionError(f"server exited with {proc.returncode}: {log.read_text()}")
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"server did not answer {ready_url} in {STARTUP_S:.0f} s: {log.read_text()}"
                    )
                time.sleep(0.2)
            yield proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
