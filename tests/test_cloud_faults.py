"""The fault run of ``tests.cloud_faults`` on each cloud's documented fake: whatever went wrong,
nothing of ours is left billing once the job is cancelled and the daemon has settled."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import responses
from google.auth.credentials import AnonymousCredentials
from sqlalchemy import select

from spotopt.clouds.aws.provider import AwsProvider
from spotopt.clouds.azure.adaptor import AzureClients
from spotopt.clouds.azure.provider import AzureProvider
from spotopt.clouds.gcp.adaptor import GcpClients
from spotopt.clouds.gcp.provider import GcpProvider
from spotopt.db.engine import Database
from spotopt.db.models import Placement
from tests.azure_fake import SUBSCRIPTION, AzureArmFake
from tests.cloud_faults import ROUND, Clock, Fleet, beat, daemon_on, play, start
from tests.collect_fakes import FakeCredential, Sleeps, no_wait_retry
from tests.fake_ec2 import ACCOUNT, DocumentedEc2, moto_ec2
from tests.gcp_fake import PROJECT, GcpComputeFake
from tests.mover_world import AWS, AZURE, GCP
from tests.provider_contract import fixed_script
from tests.stores import moto_s3
from tests.test_daemon_azure import azure_settings
from tests.test_daemon_gcp import gcp_settings
from tests.test_provider_aws import _settings, aws_env, session

__all__ = ["aws_env", "moto_ec2", "moto_s3", "session"]  # the fixtures, imported for pytest

SEEDS = (3, 11)
BILLING_EC2_STATES = ("pending", "running", "stopping", "stopped")
"""EC2 states in which an instance or its volumes bill (EC2 User Guide, instance state changes)."""


def _check(db: Database, fleet: Fleet, tmp: Path, seed: int) -> None:
    left, struck = play(db, tmp, fleet, seed)
    assert left == [], f"left billing after the fault run (seed {seed}, faults {struck})"
    crashed = any(k.startswith("crash") for k in struck)
    assert {"power-off", "evict", "api"} <= struck.keys() and crashed, struck
    with db.session() as session:
        launched = session.scalars(select(Placement.instance_id).where(Placement.instance_id.is_not(None)))
        assert len(set(launched)) >= 3, "the run launched, lost and relaunched placements"


# -- EC2 (moto, with what the EC2 documentation adds) ---------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_nothing_bills_after_a_fault_run_on_ec2(
    seed: int, sqlite_db: Database, tmp_path: Path, moto_ec2: str, session: Any
) -> None:
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.instances import StateReason

    documented = DocumentedEc2(unseen_p=0.5, rng=random.Random(seed))
    documented.attach(session)  # before any client exists: every provider object gets it
    backend = ec2_backends[ACCOUNT]["us-east-1"]

    def instances() -> dict[str, Any]:
        return {
            f"{i.id}@us-east-1": i
            for i in backend.all_instances()
            if "spotopt:key" in {t["key"] for t in backend.describe_tags(filters={"resource-id": [i.id]})}
        }

    def evict(instance_id: str) -> None:
        instance = instances()[instance_id]
        if instance.lifecycle != "spot":
            return  # only the spot market takes instances back
        backend.terminate_instances([instance.id])
        code = "Server.SpotInstanceTermination"
        instance.state_reason = StateReason(f"{code}: Spot instance termination", code)

    def api_faults(rng: random.Random) -> None:
        if rng.random() < 0.5:
            documented.lose_next += 1  # launched, its answer lost: the ClientToken recovers it
        else:
            documented.fail_next.append("InsufficientInstanceCapacity")  # HTTP 500

    def billing() -> list[str]:
        ours = instances()
        billed = [f"instance {k} {i.state}" for k, i in ours.items() if i.state in BILLING_EC2_STATES]
        volumes = [
            f"volume {v.id}"
            for v in backend.volumes.values()
            if v.attachment is not None
            and f"{v.attachment.instance.id}@us-east-1" in ours
            and v.attachment.instance.state in BILLING_EC2_STATES
        ]
        return billed + volumes

    fleet = Fleet(
        markets=AWS,
        provider=lambda: AwsProvider(
            _settings(moto_ec2, tmp_path / "instance"),
            regions=["us-east-1"],
            session=session,
            retry=no_wait_retry(),
        ),
        up=lambda: {k for k, i in instances().items() if i.state in ("pending", "running")},
        power_off=lambda instance_id: instances()[instance_id].stop(),  # stopped: its volumes bill
        evict=evict,
        api_faults=api_faults,
        billing=billing,
    )
    _check(sqlite_db, fleet, tmp_path, seed)


# -- Compute Engine ------------------------------------------------------------------------------


@pytest.fixture
def gcp() -> Iterator[GcpComputeFake]:
    made = GcpComputeFake(offers={"nvidia-tesla-v100": ["us-central1-a", "us-central1-b"]})
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        made.install(rsps)
        yield made


@pytest.mark.parametrize("seed", SEEDS)
def test_nothing_bills_after_a_fault_run_on_compute_engine(
    seed: int, sqlite_db: Database, tmp_path: Path, gcp: GcpComputeFake
) -> None:
    def evict(instance_id: str) -> None:
        zone, name = instance_id.split("/")
        if gcp.instances[(zone, name)]["scheduling"].get("provisioningModel") == "SPOT":
            gcp.preempt(zone, name)

    fleet = Fleet(
        markets=GCP,
        provider=lambda: GcpProvider(
            gcp_settings(tmp_path / "instance"),
            script=fixed_script,
            clients=GcpClients(credentials=AnonymousCredentials(), project=PROJECT),
            retry=no_wait_retry(),
            sleep=Sleeps(),
        ),
        up=lambda: {f"{z}/{n}" for (z, n), vm in gcp.instances.items() if vm["status"] == "RUNNING"},
        power_off=lambda instance_id: gcp.power_off(*instance_id.split("/")),
        evict=evict,
        api_faults=lambda rng: gcp.faults.append(rng.choice([503, 403, 429])),  # 403/429: rate limit
        billing=gcp.billing,
    )
    _check(sqlite_db, fleet, tmp_path, seed)


# -- Azure ---------------------------------------------------------------------------------------


@pytest.fixture
def azure() -> Iterator[AzureArmFake]:
    made = AzureArmFake()
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        made.install(rsps)
        yield made


def _azure_fleet(azure: AzureArmFake, tmp: Path) -> Fleet:
    running = {"code": "PowerState/running", "level": "Info"}

    def up() -> set[str]:
        return {
            name
            for (kind, name), vm in azure.resources.items()
            if kind == "vm" and running in vm["properties"].get("instanceView", {}).get("statuses", [])
        }

    def evict(name: str) -> None:
        if azure.resources[("vm", name)]["properties"].get("priority") == "Spot":
            azure.evict(name)

    return Fleet(
        markets=AZURE,
        provider=lambda: AzureProvider(
            azure_settings(tmp / "instance"),
            script=fixed_script,
            clients=AzureClients(credential=FakeCredential(), subscription_id=SUBSCRIPTION),
            retry=no_wait_retry(),
            poll_s=0,
        ),
        up=up,
        power_off=azure.power_off,
        evict=evict,
        api_faults=lambda rng: azure.faults.append(rng.choice([500, 503, 429])),
        billing=azure.billing,
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_nothing_bills_after_a_fault_run_on_azure(
    seed: int, sqlite_db: Database, tmp_path: Path, azure: AzureArmFake
) -> None:
    _check(sqlite_db, _azure_fleet(azure, tmp_path), tmp_path, seed)


def test_a_vm_the_guest_powered_off_is_deleted_as_its_placement_ends(
    sqlite_db: Database, tmp_path: Path, azure: AzureArmFake
) -> None:
    """On Azure a VM the guest powered off is still allocated and billed: the poll that sees its
    placement end (not the next period's sweep) deletes it, its disk and NIC with it."""
    fleet = _azure_fleet(azure, tmp_path)
    clock = Clock()
    start(sqlite_db, tmp_path, fleet)
    daemon = daemon_on(sqlite_db, fleet, clock)
    daemon.tick()
    beat(sqlite_db, fleet, clock.now)
    daemon.poll()  # the job runs
    (vm,) = fleet.up()
    azure.power_off(vm)
    clock.now += ROUND
    daemon.poll()
    assert [item for item in azure.billing() if vm in item] == []
    assert any(p.end_reason == "lost" for p in _placements(sqlite_db))


def _placements(db: Database) -> list[Placement]:
    with db.session() as session:
        found = list(session.scalars(select(Placement)))
        session.expunge_all()
    return found
