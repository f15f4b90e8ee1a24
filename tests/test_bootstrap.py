"""The start-up script of each cloud, rendered and actually run with bash (not just ``bash -n``).

Offline: the store is ``file://``, the cloud's metadata service is ``tests.fake_metadata`` on
127.0.0.1 (the job's ``SPOTOPT_<CLOUD>_METADATA_URL`` points there), ``bootstrap_venv`` is this
test's own virtualenv (so ``python`` on the script's ``PATH`` has spotopt) and
``bootstrap_install`` is off (the download, hash check and install are run for real by
``tests/test_instance_install.py``). Azure's custom data is a plain ``#!`` shell script
(cloud-init runs it like AWS user data), so it runs here exactly as delivered. The script is
the whole instance: the test owns its process group and stops it in teardown.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spotopt.checkpoints import Location, grant_lease, list_checkpoints, read_finished, read_heartbeat
from spotopt.clouds.common.artifacts import Artifact, Shipment
from spotopt.clouds.common.base import LaunchSpec
from spotopt.clouds.common.bootstrap import install_lines, render_script
from spotopt.clouds.registry import CLOUD_SCRIPTS
from spotopt.errors import ConfigError
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind
from tests.fake_machines import boot, stop_group
from tests.fake_metadata import FakeMetadata, metadata

__all__ = ["metadata"]  # the fixture, imported for pytest

SCRIPT = Path(__file__).resolve().parents[1] / "data" / "examples" / "train_numpy.py"
JOB = "boot-job"
TIMEOUT_S = 120.0
MARKETS = {
    "aws": MarketKey("aws", "us-east-1", "us-east-1a", "g5.xlarge", MarketKind.SPOT),
    "gcp": MarketKey("gcp", "us-central1", "us-central1-a", "g2-standard-4", MarketKind.SPOT),
    "azure": MarketKey("azure", "eastus", "1", "Standard_NC4as_T4_v3", MarketKind.SPOT),
}
NOTICE_PATHS = {
    "aws": "GET /latest/meta-data/spot/instance-action",
    "gcp": "GET /computeMetadata/v1/instance/preempted",
    "azure": "GET /metadata/scheduledevents?api-version=2020-07-01",
}


def _settings(workdir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "bootstrap_venv": sys.prefix,
        "bootstrap_install": False,
        "bootstrap_workdir": str(workdir),
        "bootstrap_shutdown": False,
    }
    return Settings(**(values | overrides))


class Instance:
    """One "instance": ``bash`` running a start-up script in its own process group."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.proc: subprocess.Popen[bytes] | None = None

    def boot(self, script: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
        self.proc = boot(script, self.home / "startup.sh", self.home / "console.log", env, self.home)

    def console(self) -> str:
        return (self.home / "console.log").read_text(encoding="utf-8")

    def wait(self) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the start-up script did not end; console:\n{self.console()}")

    def stop(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, 0)


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[Instance]:
    made = Instance(tmp_path)
    yield made
    made.stop()


def _first_placement(loc: Location, store_url: str, log: Path, workdir: Path) -> None:
    """The job's first placement ran 10 steps and left a verified checkpoint at step 10."""
    lease = grant_lease(loc, JOB, datetime.now(UTC))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    env |= {
        "SPOTOPT_JOB": JOB,
        "SPOTOPT_EPOCH": str(lease.epoch),
        "SPOTOPT_CHECKPOINT_URI": store_url,
        "SPOTOPT_CLOUD": "none",
    }
    command = [sys.executable, str(SCRIPT), "--steps", "10", "--log", str(log)]
    subprocess.run(command, env=env, cwd=workdir, check=True, timeout=TIMEOUT_S)


@pytest.mark.parametrize("cloud", sorted(CLOUD_SCRIPTS))
def test_the_start_up_script_runs_the_agent_which_resumes_and_stops_on_the_notice(
    cloud: str, tmp_path: Path, metadata: FakeMetadata, instance: Instance
) -> None:
    store_url = f"file://{tmp_path / 'store'}"
    loc = Location(store_url)
    log = tmp_path / "steps.log"
    workdir = tmp_path / "work"
    workdir.mkdir()
    _first_placement(loc, store_url, log, workdir)
    lease = grant_lease(loc, JOB, datetime.now(UTC))
    spec = LaunchSpec(
        JOB,
        lease.epoch,
        ("python", str(SCRIPT), "--steps", "1000000", "--log", str(log), "--step-delay", "0.005"),
        store_url,
        checkpoint_every_s=3600.0,  # only the notice makes it checkpoint
        env={
            f"SPOTOPT_{cloud.upper()}_METADATA_URL": metadata.url,
            "SPOTOPT_POLL_EVERY": "0.1s",
            "SPOTOPT_HEARTBEAT_EVERY": "0.1s",
        },
    )
    script = render_script(spec, MARKETS[cloud], _settings(tmp_path / "instance-work"))
    instance.boot(script)

    deadline = time.monotonic() + TIMEOUT_S
    while (beat := read_heartbeat(loc, JOB, lease.epoch)) is None or beat.step <= 12:
        assert instance.proc is not None and instance.proc.poll() is None, instance.console()
        assert time.monotonic() < deadline, f"no progress from the resumed job:\n{instance.console()}"
        time.sleep(0.05)
    while NOTICE_PATHS[cloud] not in metadata.requests:  # its cloud's poller is running
        assert time.monotonic() < deadline, f"the {cloud} poller never asked: {metadata.requests[-5:]}"
        time.sleep(0.05)
    metadata.notify(cloud)
    assert instance.wait() == 0, instance.console()

    steps = [int(line.split()[0]) for line in log.read_text().splitlines()]
    assert steps[:10] == list(range(1, 11))
    assert steps[10] == 11, "the second placement did not resume from the step-10 checkpoint"
    newest = max((c for c in list_checkpoints(loc, JOB) if c.manifest), key=lambda c: c.step)
    assert newest.epoch == lease.epoch and newest.step > 12
    final = read_heartbeat(loc, JOB, lease.epoch)
    assert final is not None and final.state == "stopped" and cloud in (final.reason or "")
    finished = read_finished(loc, JOB)
    assert finished is not None and finished["epoch"] == lease.epoch - 1  # the notice is no finish
    console = instance.console()
    assert "spotopt: job exited with status 0" in console
    assert (tmp_path / "instance-work").is_dir()


def test_a_finished_job_ends_the_script_with_its_status_and_the_values_arrive_intact(
    tmp_path: Path, instance: Instance
) -> None:
    hostile = 'it\'s $HOME `id` "quoted" ; rm -rf / \n second line'
    job = (
        "python",
        "-c",
        "import os, sys; print(repr(os.environ['SPOTOPT_WEIRD'])); print(os.getcwd()); sys.exit(3)",
    )
    spec = LaunchSpec(
        "j", 2, job, "file:///nowhere", env={"SPOTOPT_WEIRD": hostile}, workdir=str(tmp_path / "w")
    )
    instance.boot(render_script(spec, MARKETS["gcp"], _settings(tmp_path / "unused")))
    assert instance.wait() == 3
    console = instance.console()
    assert repr(hostile) in console and str(tmp_path / "w") in console
    assert "spotopt: job exited with status 3" in console


def test_without_install_the_script_powers_off_and_carries_no_credentials() -> None:
    spec = LaunchSpec("j", 1, ("python", "train.py"), "s3://bucket/ckpt")
    script = render_script(spec, MARKETS["aws"], Settings(bootstrap_install=False))
    assert script.startswith("#!/bin/bash\n")
    assert '  python3 -m venv "$SPOTOPT_VENV"\n' in script
    assert "pip install" not in script and "cd /opt/spotopt/work\n" in script and "shutdown -h now" in script
    assert "AWS_ACCESS_KEY_ID" not in script and "AWS_SECRET_ACCESS_KEY" not in script


def test_bad_inputs_are_config_errors() -> None:
    spec = LaunchSpec("j", 1, ("python", "train.py"), "s3://bucket/ckpt")
    bare = Settings(bootstrap_install=False)
    with pytest.raises(ConfigError, match="cloud 'ibm' is unknown"):
        render_script(spec, replace(MARKETS["aws"], cloud="ibm"), bare)
    with pytest.raises(ConfigError, match="no command"):
        render_script(LaunchSpec("j", 1, (), "s3://b/p"), MARKETS["aws"], bare)
    with pytest.raises(ConfigError, match="scheme 'ftp'"):
        render_script(LaunchSpec("j", 1, ("x",), "ftp://b/p"), MARKETS["aws"], bare)
    big = LaunchSpec("j", 1, ("python", "-c", "x" * 20_000), "s3://bucket/ckpt")
    with pytest.raises(ConfigError, match="over EC2 user data's limit of 16384"):
        render_script(big, MARKETS["aws"], bare)
    lines = render_script(big, MARKETS["gcp"], bare).splitlines()  # GCP's limit is 256 KB
    assert [shlex.split(line) for line in lines if line.startswith("python -c")] == [list(big.command)]


@pytest.mark.parametrize("cloud", sorted(MARKETS))
def test_only_an_azure_instance_reads_the_store_with_the_azure_identity(cloud: str) -> None:
    """The downloader's third argument names the managed identity an Azure VM runs as; an AWS
    or GCP instance has no such identity, and its script must not name one (it carried the
    Azure setting's value wherever that was set)."""
    identity = (
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ManagedIdentity/userAssignedIdentities/a"
    )
    store = {"aws": "s3://bucket/ckpt", "gcp": "gs://bucket/ckpt", "azure": "az://ckpt/runs"}[cloud]
    spec = LaunchSpec("j", 1, ("python", "train.py"), store, storage_options={"account_name": "acct"})
    shipped = Shipment(
        Artifact("w.whl", "0" * 64, "spotopt_gpu-1-py3-none-any.whl"),
        Artifact("l.txt", "1" * 64, "l.txt"),
        "x",
    )
    lines = install_lines(shipped, spec, MARKETS[cloud], Settings(azure_identity_id=identity))
    fetch = next(shlex.split(line) for line in lines if "<<'SPOTOPT_FETCH'" in line)
    assert fetch[1:4] == ["-", store, MARKETS[cloud].region]
    assert fetch[4] == (identity if cloud == "azure" else "-")
