"""The daemon's move and preemption scenarios (``tests.test_daemon_local``) on GCP: the real
``gcp`` provider, routed to by the ``clouds`` provider as ``spotopt daemon run --provider
clouds`` does, against the Compute Engine fake of ``tests.gcp_fake`` (only the HTTP is faked).

Every VM the provider inserts is a local process running the ``startup-script`` the provider
rendered (``tests.fake_gce``: the script installs nothing, runs the agent from this virtualenv,
and the agent runs the example job). A preemption is what GCP does: ``instance/preempted``
turns TRUE on the fake metadata server the agent polls (``tests.fake_metadata``), the agent
checkpoints and its processes end, then the Spot VM is deleted with a
``compute.instances.preempted`` operation, which is how the provider tells a preemption.

The scenario bodies are imported from ``tests.test_daemon_local`` and play on GCP's markets
(``tests.mover_world.GCP``: a V100 in us-central1-a, then a cheaper us-central1-b).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotopt.clouds.gcp.provider import GcpProvider
from spotopt.db.engine import Database
from spotopt.settings import Settings
from tests.collect_fakes import gcp_clients, no_wait_retry
from tests.fake_gce import GceMachines, LocalGce
from tests.fake_machines import machine_world
from tests.fake_metadata import FakeMetadata, metadata
from tests.mover_world import GCP, World
from tests.test_daemon_local import (
    test_a_cheaper_market_moves_the_job_make_before_break,
    test_a_preemption_notice_checkpoints_and_relaunches,
)

__all__ = [
    "metadata",
    "test_a_cheaper_market_moves_the_job_make_before_break",
    "test_a_preemption_notice_checkpoints_and_relaunches",
]


def gcp_settings(workdir: Path) -> Settings:
    return Settings(
        gcp_image="projects/debian-cloud/global/images/family/debian-12",
        gcp_service_account="agent@spotopt-test.iam.gserviceaccount.com",
        bootstrap_venv=sys.prefix,  # this virtualenv: spotopt is already installed in it
        bootstrap_install=False,
        bootstrap_workdir=str(workdir),
        bootstrap_shutdown=False,  # the machines harness plays the power-off when the script ends
    )


def vm_name(instance_id: str) -> str:
    """The VM's name in the provider's ``ZONE/NAME`` id."""
    return instance_id.split("/")[1]


@pytest.fixture
def world(sqlite_db: Database, tmp_path: Path, metadata: FakeMetadata) -> Iterator[World]:
    fake = LocalGce()
    machines = fake.machines = GceMachines(fake, tmp_path / "machines")
    gcp = GcpProvider(
        gcp_settings(tmp_path / "instance"),
        clients=gcp_clients(),
        retry=no_wait_retry(),
        sleep=lambda s: None,
    )
    with machine_world(sqlite_db, tmp_path, GCP, gcp, fake, machines, metadata, vm_name) as made:
        yield made
    assert len(machines.procs) == len(fake.inserted), "every VM inserted booted"
