"""Checkpoint stores for tests: a local directory, and S3 served over real HTTP by moto's server.

The moto server runs in a thread of the test process, listens on 127.0.0.1 on a free port and
is stopped at the end of the session. Every test gets its own bucket (or directory).
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from spotopt.checkpoints import Location

_buckets = itertools.count()


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


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> StoreUnderTest:
    if request.param == "file":
        return StoreUnderTest(f"file://{tmp_path / 'store'}")
    return s3_store(request.getfixturevalue("moto_s3"))
