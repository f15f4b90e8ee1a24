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
import responses

from spotopt.db.engine import Database
from spotopt.providers.clouds import CloudsProvider, split_id
from spotopt.providers.gcp import GcpProvider
from spotopt.settings import Settings
from tests.collect_fakes import gcp_clients, no_wait_retry
from tests.fake_gce import GceMachines, LocalGce
from tests.fake_metadata import FakeMetadata, metadata
from tests.mover_world import GCP, World, make_world
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
        bootstrap_pip_spec="",
        bootstrap_workdir=str(workdir),
        bootstrap_shutdown=False,  # the machines harness plays the power-off when the script ends
    )


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
    router = CloudsProvider(regions={"gcp": ["us-central1"]}, build=lambda cloud, s, r: gcp)
    router.runs_on_market = False  # local processes, not the market's V100s (see test_daemon_aws)

    def preempt(instance_id: str) -> None:
        parts = split_id(instance_id)
        assert parts is not None and parts[0] == "gcp", instance_id
        machines.interrupt(parts[1].split("/")[1], lambda: metadata.notify("gcp"))
        metadata.gcp_preempted = False  # the next VM is not preempted

    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        fake.install(rsps)
        made = make_world(
            sqlite_db,
            tmp_path,
            provider=router,
            preempt=preempt,
            agent_env={"SPOTOPT_GCP_METADATA_URL": metadata.url},
            markets=GCP,
        )
        try:
            yield made
            assert len(machines.procs) == len(fake.inserted) > 0, "every VM inserted booted"
            assert all(i.instance_id.startswith("gcp:us-central1-") for i in router.list_instances())
        finally:
            made.stop_all()
            machines.close()
