"""``spotopt throughput profile --provider aws`` (issue 37 item 2, "a cloud in production"), run as
a user runs it (the console script, ``--format json``) against AWS offline: moto's server over
real HTTP for EC2 and for the job's S3 checkpoint store, reached through the endpoint settings.

moto only keeps records; ``tests.fake_ec2.LocalEc2`` makes them machines: each instance moto
launched runs its user data with bash (the agent from this virtualenv, the example trainer), and
an instance terminated through the API has its processes stopped. The console script's boto3
calls happen in its own process, where no session event of this one fires, so a thread here
syncs the machines with moto's records as EC2 would by itself (``booting``). The agent on the
"instance" heartbeats into the S3 store; the profile reads its step times from there.
"""

from __future__ import annotations

import importlib.metadata
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from spotopt.cloud_calls import Retry
from spotopt.clouds.aws.provider import AwsProvider
from spotopt.db.engine import Database
from spotopt.jobspec import parse_jobs
from spotopt.mover import profile as profiling
from tests.fake_ec2 import ACCOUNT, FAKE_CREDENTIALS, DocumentedEc2, LocalEc2, moto_ec2
from tests.helpers import ingest, price, strict_json
from tests.stores import moto_s3
from tests.test_provider_aws import PROFILE, _settings, aws_env, session

__all__ = ["aws_env", "moto_ec2", "moto_s3", "session"]  # fixtures, imported for pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "examples"
SPOTOPT = Path(sys.executable).with_name("spotopt")
STEP_DELAY_S = 0.005
"""The example trainer sleeps this long per step, so it never exceeds 1/STEP_DELAY_S steps/s."""
MARKET = "aws/us-east-1/us-east-1a/g6.xlarge"
"""An L4 instance; the history's list prices hold cheaper L4 markets on GCP and Azure, which an
AWS profile cannot launch."""


def _ec2_instances() -> list[Any]:
    """Every instance moto's EC2 holds, in any region (its records, read in this process)."""
    from moto.ec2.models import ec2_backends

    backends = ec2_backends[ACCOUNT]
    return [i for region in list(backends.keys()) for i in backends[region].all_instances()]


def _tags(instance: Any) -> dict[str, str]:
    return {t["key"]: t["value"] for t in instance.get_tags()}


@contextmanager
def booting(machines: LocalEc2) -> Iterator[None]:
    """What EC2 does by itself while the console script runs: boot each instance moto launched
    (bash on its user data), power off one whose script ended, stop the processes of one
    terminated."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.1):
            machines.sync()

    thread = threading.Thread(target=loop, name="ec2-machines", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
        machines.sync()


@pytest.fixture
def user(tmp_path: Path, moto_ec2: str, session: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """A user's environment for AWS: credentials, the endpoint (EC2 for the provider, S3 for the
    store: the console script's reads and the instance's agent), the provider's settings, and a
    bucket for the job's checkpoints. Set in this process too: an instance's processes inherit
    it (less ``SPOTOPT_*``, which only its user data exports)."""
    for name, value in {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": moto_ec2}.items():
        monkeypatch.setenv(name, value)
    session.client("s3", endpoint_url=moto_ec2).create_bucket(Bucket="profile-store")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    return env | {
        "AWS_EC2_METADATA_DISABLED": "true",
        "SPOTOPT_DB_URL": f"sqlite:///{tmp_path / 'h.sqlite'}",
        "SPOTOPT_AWS_ENDPOINT_URL": moto_ec2,
        "SPOTOPT_AWS_IMAGE_ID": "ami-03cf127a",
        "SPOTOPT_AWS_INSTANCE_PROFILE": PROFILE,
        "SPOTOPT_BOOTSTRAP_VENV": sys.prefix,  # this virtualenv: spotopt is installed in it
        "SPOTOPT_BOOTSTRAP_INSTALL": "false",  # tests/test_instance_install.py runs the install
        "SPOTOPT_BOOTSTRAP_WORKDIR": str(tmp_path / "instance"),
        "SPOTOPT_BOOTSTRAP_SHUTDOWN": "false",  # LocalEc2 plays the power-off
    }


def _job_file(tmp_path: Path) -> Path:
    """data/examples/job.yaml with its trainer beside it, running long, checkpoints in S3, without
    its spec figure for L4 (which would win over any measurement)."""
    (tmp_path / "train_numpy.py").write_text((EXAMPLES / "train_numpy.py").read_text())
    spec = yaml.safe_load((EXAMPLES / "job.yaml").read_text())
    job = spec["jobs"][0]
    job["run"] = f"{sys.executable} train_numpy.py --steps 100000000 --step-delay {STEP_DELAY_S}"
    job["checkpoint"]["uri"] = "s3://profile-store/ckpt"
    del job["throughput"]["L4"]
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _prices(tmp_path: Path, env: dict[str, str], *rows: str) -> None:
    """Import ``rows`` (``market,usd_per_hour`` for g6.xlarge in us-east-1a) an hour old."""
    at = (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [f"{at},aws,us-east-1,us-east-1a,g6.xlarge,{row}" for row in rows]
    (tmp_path / "prices.csv").write_text(
        "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n" + "\n".join(lines) + "\n"
    )
    assert _spotopt(tmp_path, env, "import", "csv", "prices.csv").returncode == 0


def _spotopt(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SPOTOPT), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )


def _stored(tmp_path: Path, env: dict[str, str]) -> list[dict[str, Any]]:
    out = _spotopt(tmp_path, env, "throughput", "list", "--workload", "example", "--format", "json")
    assert out.returncode == 0, out.stderr
    return list(strict_json(out.stdout))


def _store_keys(moto: str, prefix: str) -> list[str]:
    import boto3

    listed = boto3.client("s3", endpoint_url=moto).list_objects_v2(Bucket="profile-store", Prefix=prefix)
    return [o["Key"] for o in listed.get("Contents", [])]


def test_a_profile_on_aws_reads_the_agents_heartbeats_from_s3_and_stores_a_measured_figure(
    tmp_path: Path, user: dict[str, str], moto_ec2: str
) -> None:
    """The cheapest L4 market of AWS (spot here), not the cheaper GCP and Azure ones of the list
    prices (old code: picked GCP's, which ``--provider aws`` cannot launch); the instance tagged
    as a profile of this database, a spot instance, ended; the rate measured from the agent's
    heartbeats in S3; the profile's own store prefix removed."""
    _job_file(tmp_path)
    _prices(tmp_path, user, "spot,0.40", "on-demand,0.80")
    machines = LocalEc2(tmp_path / "machines", grace_s=5.0)
    try:
        with booting(machines):
            out = _spotopt(tmp_path, user, "throughput", "profile", "job.yaml", "--gpu", "L4", "--provider",
                           "aws", "--steps", "20", "--budget-usd", "1", "--format", "json")  # fmt: skip
        logs = "\n".join(machines.log(vm) for vm in machines.procs)
        assert out.returncode == 0, out.stderr + logs
        (row,) = strict_json(out.stdout)
        assert (row["ended"], row["market"], row["usd_per_hour"]) == ("measured", f"{MARKET}/spot", 0.40)
        measured = row["steps_per_s"]
        assert 0 < measured <= 1 / STEP_DELAY_S and row["steps"] >= 20 and 0 < row["cost_usd"] <= 1
        (figure,) = _stored(tmp_path, user)
        assert (figure["source"], figure["steps_per_s"], figure["gpu_model"]) == ("measured", measured, "L4")

        (instance,) = _ec2_instances()
        tags = _tags(instance)
        assert (tags["spotopt:profile"], instance.instance_type, instance.lifecycle) == (
            "example",
            "g6.xlarge",
            "spot",
        )
        assert tags["spotopt:db"] and instance.placement.zone == "us-east-1a"
        assert instance._state.name == "terminated"
        (proc,) = machines.procs.values()
        assert proc.poll() is not None  # the instance's processes are gone
        assert [k for k in _store_keys(moto_ec2, "ckpt/") if "/profile-" in f"/{k}"] == []
    finally:
        machines.close()


def test_on_aws_nothing_reporting_ends_at_the_time_limit_and_the_instance_carries_the_pinned_install(
    tmp_path: Path, user: dict[str, str], moto_ec2: str
) -> None:
    """An instance that never reports (it boots nothing here: a hung install, a broken image) is
    terminated at the run's time limit (what ``--budget-usd`` pays for), nothing is stored, and
    the message says so. On-demand is the cheapest quote, so no spot options. Its user data is
    the daemon's: the wheel and lock downloaded from the store, sha256-checked, installed with
    ``--require-hashes`` (never a bare ``pip install spotopt``). A budget below the cheapest run
    is refused first, with nothing launched."""
    _job_file(tmp_path)
    _prices(tmp_path, user, "on-demand,0.70")
    lock = tmp_path / "small.lock"  # the daemon's own pyyaml, as tests/test_instance_install.py
    lock.write_text(f"pyyaml=={importlib.metadata.version('pyyaml')} \\\n    --hash=sha256:{'0' * 64}\n")
    env = user | {"SPOTOPT_BOOTSTRAP_INSTALL": "true", "SPOTOPT_BOOTSTRAP_LOCK": str(lock)}
    env["SPOTOPT_BOOTSTRAP_VENV"] = str(tmp_path / "venv")

    refused = _spotopt(tmp_path, env, "throughput", "profile", "job.yaml", "--gpu", "L4", "--provider", "aws",
                       "--budget-usd", "0.001")  # fmt: skip
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("error: --budget-usd:") and refused.stderr.count("\n") == 1
    assert f"{MARKET}/on-demand" in refused.stderr and _ec2_instances() == []

    # one run bills AWS's 60 s minimum at $0.70/h (about $0.0117): $0.0125 pays for about 64 s
    started = time.monotonic()
    out = _spotopt(tmp_path, env, "throughput", "profile", "job.yaml", "--gpu", "L4", "--provider", "aws",
                   "--seconds", "5", "--budget-usd", "0.0125", "--format", "json")  # fmt: skip
    took = time.monotonic() - started
    assert out.returncode == 1, out.stderr
    (row,) = strict_json(out.stdout)
    assert (row["ended"], row["steps_per_s"], row["market"]) == ("time limit", None, f"{MARKET}/on-demand")
    assert 0 < row["cost_usd"] <= 0.0125 and took >= 60  # the budget paid for the time it waited
    assert row["heartbeats"] == 0
    warning = out.stderr.splitlines()[-1]
    assert warning.startswith("warning: example on 1x L4: nothing measured (time limit after ")
    silent = f"no heartbeat arrived from the job's agent on {MARKET}/on-demand); nothing stored"
    assert warning.endswith(silent)
    assert _stored(tmp_path, env) == []

    (instance,) = _ec2_instances()
    assert instance._state.name == "terminated" and instance.lifecycle is None
    assert _tags(instance)["spotopt:profile"] == "example"
    script = instance.user_data.decode()  # what the machine runs (LocalEc2 boots the same)
    shipped = _store_keys(moto_ec2, "ckpt/_spotopt/artifacts/")
    assert len(shipped) == 2, shipped  # the wheel and the lock, content-addressed
    for key in shipped:  # each downloaded by its key and checked against its sha256
        assert f"{key.removeprefix('ckpt/')} {key.split('/')[-2]}" in script
    wheel = next(k for k in shipped if k.endswith(".whl"))
    assert f"--hash=sha256:{wheel.split('/')[-2]}" in script
    assert "--require-hashes --only-binary :all:" in script
    assert not [
        line for line in script.splitlines() if "pip install" in line and "--require-hashes" not in line
    ]


def test_a_killed_profiles_aws_instance_is_ended_by_the_sweep(
    tmp_path: Path, user: dict[str, str], moto_ec2: str
) -> None:
    """SIGKILL (no ``finally`` runs) leaves the profile's instance running on EC2; ``spotopt daemon
    sweep --provider aws`` leaves it while a profile may still measure it, and terminates it once
    it is older than any profile runs."""
    _job_file(tmp_path)
    _prices(tmp_path, user, "spot,0.40")
    machines = LocalEc2(tmp_path / "machines", grace_s=5.0)
    try:
        with booting(machines):
            command = subprocess.Popen(
                [str(SPOTOPT), "throughput", "profile", "job.yaml", "--gpu", "L4", "--provider", "aws",
                 "--steps", "100000000"],
                cwd=tmp_path, env=user, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                deadline = time.monotonic() + 120
                while not machines.procs:  # launched, and its machine booted
                    assert command.poll() is None and time.monotonic() < deadline, (
                        "the profile never launched"
                    )
                    time.sleep(0.2)
            finally:
                command.send_signal(signal.SIGKILL)
                command.wait(60)
            (instance,) = _ec2_instances()
            assert instance._state.name == "running" and _tags(instance)["spotopt:profile"] == "example"

            def sweep() -> list[dict[str, Any]]:
                done = _spotopt(tmp_path, user, "daemon", "sweep", "--provider", "aws", "--format", "json")
                assert done.returncode == 0, done.stderr
                return list(strict_json(done.stdout)["leftovers"])

            assert sweep() == []  # young: its command may still be measuring it
            assert instance._state.name == "running"
            instance.launch_time = (
                datetime.now(UTC) - timedelta(seconds=profiling.LEFTOVER_AFTER_S + 60)
            ).strftime("%Y-%m-%dT%H:%M:%S.000Z")
            (ended,) = sweep()
            assert ended["action"] == "terminated" and str(ended["why"]).startswith(
                "a profile run of 'example'"
            )
            assert instance._state.name == "terminated"
            assert sweep() == []
        (proc,) = machines.procs.values()
        assert proc.poll() is not None
    finally:
        machines.close()


def test_an_instance_ec2_does_not_list_yet_is_still_ended_by_an_interrupted_profile(
    db: Database, tmp_path: Path, user: dict[str, str], moto_ec2: str, session: Any
) -> None:
    """Ctrl-C right after the launch, while EC2's filtered listing does not show the new instance
    yet (eventual consistency, ``tests.fake_ec2.DocumentedEc2``): the profile terminates the id
    its launch returned. Old code ended only what the listing showed, and left it running."""
    DocumentedEc2(unseen_p=1.0).attach(session)
    ingest(db, [price("g5.xlarge", (datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%d %H:%M"), 1.0)])
    jobs = parse_jobs(yaml.safe_load(_job_file(tmp_path).read_text()), "job.yaml").jobs
    with db.session() as s:
        (run,) = profiling.plan_runs(
            s, jobs, tmp_path, "A10G", [1], steps=5, seconds=None, warmup_steps=2, budget_usd=None,
            now=datetime.now(UTC), clouds=("aws",),
        )  # fmt: skip
    settings = _settings(moto_ec2, tmp_path / "instance")
    aws = AwsProvider(settings, session=session, retry=Retry(sleep=lambda s: None))
    looks = iter([0.0])

    def interrupted() -> float:
        """The start's time, then Ctrl-C at the loop's first look, right after the launch."""
        try:
            return next(looks)
        except StopIteration:
            raise KeyboardInterrupt from None

    with pytest.raises(KeyboardInterrupt):
        profiling.profile(aws, run, steps=5, seconds=None, warmup_steps=2, limit_s=60.0, clock=interrupted)
    (instance,) = _ec2_instances()
    assert _tags(instance)["spotopt:profile"] == "example" and instance._state.name == "terminated"
