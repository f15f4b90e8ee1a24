"""Checkpoint stores for tests: a local directory, S3 served by moto's server, Azure Blob by Azurite.

The moto server runs in a thread of the test process; Azurite (npm ``azurite``, a Node program:
``.ci/run`` installs it into ``.ci/azurite`` when npm exists) runs as a child process owned by
the session. Both listen on 127.0.0.1 on a free port and stop at the end of the session. Without
Azurite the ``az`` cases skip, saying how to install it. Every test gets its own bucket,
container or directory. (``gs://`` is not here: gcsfs 2026.10 hangs against
gcp-storage-emulator, see docs/guides/agent.md.)
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spotopt.checkpoints import Location

_buckets = itertools.count()
ROOT = Path(__file__).resolve().parents[1]
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
"""Azurite's fixed, public development account (documented by Microsoft; not a secret)."""


@dataclass(frozen=True)
class StoreUnderTest:
    url: str
    storage_options: dict[str, Any] = field(default_factory=dict)

    def location(self) -> Location:
        return Location(self.url, self.storage_options)

    def env(self) -> dict[str, str]:
        """The agent environment that points a job at this store."""
        env = {"SPOTOPT_CHECKPOINT_URI": self.url}
        if self.storage_options:
            env["SPOTOPT_STORAGE_OPTIONS"] = json.dumps(self.storage_options)
        return env


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[str]:
    """Endpoint URL of a moto server (real HTTP on 127.0.0.1) owned by this test session."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def s3_store(endpoint: str) -> StoreUnderTest:
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    bucket = f"spotopt-test-{next(_buckets)}"
    store = StoreUnderTest(f"s3://{bucket}/stores", options)
    store.location().fs.mkdir(bucket)
    return store


def _azurite_program() -> str | None:
    for candidate in (
        os.environ.get("AZURITE_BLOB"),
        shutil.which("azurite-blob"),
        str(ROOT / ".ci" / "azurite" / "node_modules" / ".bin" / "azurite-blob"),
    ):
        if candidate and Path(candidate).is_file() and shutil.which("node"):
            return candidate
    return None


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Blob endpoint of an Azurite server owned by this session (skips without Azurite/node)."""
    program = _azurite_program()
    if program is None:
        pytest.skip("Azurite is not installed: npm install azurite (.ci/run does so when npm exists)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = tmp_path_factory.mktemp("azurite")
    proc = subprocess.Popen(
        [
            program,
            "--blobHost",
            "127.0.0.1",
            "--blobPort",
            str(port),
            "--location",
            str(data),
            "--silent",
            "--skipApiVersionCheck",
            "--loose",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"Azurite ({program}) did not start on port {port}")
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # Azurite may ignore SIGTERM while requests are open
        proc.kill()
        proc.wait()


def az_store(endpoint: str) -> StoreUnderTest:
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint};"
    )
    container = f"spotopt-test-{next(_buckets)}"
    store = StoreUnderTest(f"az://{container}/stores", {"connection_string": connection})
    store.location().fs.mkdir(container)
    return store


def store_for(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> StoreUnderTest:
    """A fresh store of ``kind`` (file, s3, az) for one test."""
    if kind == "file":
        return StoreUnderTest(f"file://{tmp_path / 'store'}")
    if kind == "s3":
        return s3_store(request.getfixturevalue("moto_s3"))
    return az_store(request.getfixturevalue("azurite"))


@pytest.fixture(params=["file", "s3", "az"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreUnderTest:
    return store_for(request.param, request, tmp_path)
