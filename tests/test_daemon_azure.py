"""The daemon's move and preemption scenarios (``tests.test_daemon_local``) on Azure: the real
``azure`` provider, routed to by the ``clouds`` provider as ``spotopt daemon run --provider
clouds`` does, against the Resource Manager fake of ``tests.azure_fake`` (only the HTTP is faked).

Every VM the provider creates is a local process running the ``customData`` the provider
rendered and base64-encoded (``tests.fake_azure_vm``). A preemption is what Azure does: a
Scheduled Events ``Preempt`` document on the fake metadata service the agent polls
(``tests.fake_metadata``), the agent checkpoints and its processes end, then the Spot VM is
evicted (eviction policy Delete), which the provider reads as a preemption.

The scenario bodies are imported from ``tests.test_daemon_local`` and play on Azure's markets
(``tests.mover_world.AZURE``: the V100 size in eastus zone 1, then a cheaper zone 2). The move
stays in one region: the VMs' NICs join the one ``azure_subnet_id``, and a subnet's virtual
network lives in one region, so the provider cannot place a VM in another.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotopt.clouds.azure.provider import AzureProvider
from spotopt.db.engine import Database
from spotopt.settings import Settings
from tests.azure_fake import GROUP, SUBSCRIPTION, admin_key
from tests.collect_fakes import azure_clients, no_wait_retry
from tests.fake_azure_vm import AzureMachines, LocalAzure
from tests.fake_machines import machine_world
from tests.fake_metadata import FakeMetadata, metadata
from tests.mover_world import AZURE, World
from tests.test_daemon_local import (
    test_a_cheaper_market_moves_the_job_make_before_break,
    test_a_preemption_notice_checkpoints_and_relaunches,
)

__all__ = [
    "metadata",
    "test_a_cheaper_market_moves_the_job_make_before_break",
    "test_a_preemption_notice_checkpoints_and_relaunches",
]

IN_GROUP = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers"


def azure_settings(workdir: Path) -> Settings:
    return Settings(
        azure_resource_group=GROUP,
        azure_subnet_id=f"{IN_GROUP}/Microsoft.Network/virtualNetworks/vnet/subnets/workers",
        azure_image="Canonical:ubuntu-24_04-lts:server:latest",
        azure_identity_id=f"{IN_GROUP}/Microsoft.ManagedIdentity/userAssignedIdentities/spotopt-agent",
        azure_ssh_public_key=admin_key(),
        bootstrap_venv=sys.prefix,  # this virtualenv: spotopt is already installed in it
        bootstrap_install=False,
        bootstrap_workdir=str(workdir),
        bootstrap_shutdown=False,  # the machines harness plays the power-off when the script ends
    )


@pytest.fixture
def world(sqlite_db: Database, tmp_path: Path, metadata: FakeMetadata) -> Iterator[World]:
    fake = LocalAzure()
    machines = fake.machines = AzureMachines(fake, tmp_path / "machines")
    azure = AzureProvider(
        azure_settings(tmp_path / "instance"), clients=azure_clients(), retry=no_wait_retry(), poll_s=0
    )
    with machine_world(sqlite_db, tmp_path, AZURE, azure, fake, machines, metadata) as made:
        yield made
    assert len(machines.procs) == len(fake.custom_data), "every VM created booted"
