"""The daemon's end-to-end scenarios (``tests.test_daemon_local``) on AWS: moto's server over
real HTTP, reached through ``aws_endpoint_url`` by the ``clouds`` provider routing to the
``aws`` provider, as ``spotopt daemon run --provider clouds`` does.

Every launched instance is backed by a local process running its rendered user data
(``tests.fake_ec2.LocalEc2``: the start-up script installs nothing, runs the agent from this
virtualenv, and the agent runs the example job). A preemption is what AWS does: the two-minute
notice served by the fake IMDS the agent polls (``tests.fake_metadata``), the agent's emergency
checkpoint, then the instance terminated with ``Server.SpotInstanceTermination``.

The scenario bodies are imported from ``tests.test_daemon_local`` and run here with this
module's ``world`` fixture (pytest resolves fixtures where a test is collected). SQLite only:
the database side of these scenarios runs on both backends with the local provider.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spotopt.cloud_calls import Retry
from spotopt.clouds.aws.provider import AwsProvider
from spotopt.clouds.common.router import CloudsProvider, split_id
from spotopt.db.engine import Database
from spotopt.db.identity import database_id_of
from spotopt.history.setup import open_history
from spotopt.mover import jobs as jobstore
from spotopt.settings import Settings
from tests.fake_ec2 import LocalEc2, moto_ec2
from tests.fake_metadata import FakeMetadata, metadata
from tests.mover_world import World, a_day_ago, job_yaml, make_world, on_demand, spot
from tests.stores import moto_s3
from tests.test_daemon_local import (
    test_a_budget_cap_stops_the_job_over_budget_within_the_cap,
    test_a_cancel_under_way_is_escalated_to_a_halt,
    test_a_cheaper_market_moves_the_job_make_before_break,
    test_a_deadline_spot_cannot_meet_starts_on_demand,
    test_a_job_cancelled_while_it_starts_has_its_instance_stopped,
    test_a_preemption_notice_checkpoints_and_relaunches,
)
from tests.test_provider_aws import _settings, aws_env, session

__all__ = [
    "aws_env",
    "metadata",
    "moto_ec2",
    "moto_s3",
    "session",
    "test_a_budget_cap_stops_the_job_over_budget_within_the_cap",
    "test_a_cancel_under_way_is_escalated_to_a_halt",
    "test_a_cheaper_market_moves_the_job_make_before_break",
    "test_a_deadline_spot_cannot_meet_starts_on_demand",
    "test_a_job_cancelled_while_it_starts_has_its_instance_stopped",
    "test_a_preemption_notice_checkpoints_and_relaunches",
]


@pytest.fixture
def world(
    sqlite_db: Database, tmp_path: Path, moto_ec2: str, session: Any, metadata: FakeMetadata
) -> Iterator[World]:
    machines = LocalEc2(tmp_path / "machines", grace_s=5.0)
    machines.attach(session)
    aws = AwsProvider(
        _settings(moto_ec2, tmp_path / "instance"),
        regions=["us-east-1"],
        session=session,
        retry=Retry(sleep=lambda s: None),
    )
    built: list[str] = []

    def build(cloud: str, settings: Settings, regions: list[str]) -> AwsProvider:
        built.append(cloud)
        assert (cloud, regions) == ("aws", ["us-east-1"])
        return aws

    router = CloudsProvider(regions={"aws": ["us-east-1"]}, build=build)
    # These "instances" are processes on this machine, not the market's V100s: their steps/s
    # are no throughput of that GPU (the reason ``local`` says False). Measured, they would
    # tell the planner the job ends in seconds, and no move would pay.
    router.runs_on_market = False

    def preempt(instance_id: str) -> None:
        parts = split_id(instance_id)
        assert parts is not None and parts[0] == "aws", instance_id
        machines.interrupt(parts[1].split("@")[0], lambda: metadata.notify("aws"))
        metadata.aws_action = None  # the next instance has no notice pending

    made = make_world(
        sqlite_db,
        tmp_path,
        provider=router,
        preempt=preempt,
        agent_env={"SPOTOPT_AWS_METADATA_URL": metadata.url},
    )
    try:
        yield made
        assert built == ["aws"]  # built once, on first use
        assert all(i.instance_id.startswith("aws:i-") for i in router.list_instances())
    finally:
        made.stop_all()
        machines.close()


def test_a_capped_job_s_spot_instance_carries_its_cap_as_max_price(
    world: World, tmp_path: Path, session: Any
) -> None:
    """The daemon launches a job whose ``max_usd_per_hour`` is $2.50 on a whole spot instance:
    EC2 gets MaxPrice 2.50, so AWS interrupts the instance rather than bill more, even if the
    price spikes between two polls (the executor's own checks only see prices at each poll)."""
    sent: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        sent.append(dict(params["body"]))

    session.events.register("before-call.ec2.RunInstances", record)  # before any client exists
    world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    path = job_yaml(tmp_path)
    path.write_text(path.read_text() + "    max_usd_per_hour: 2.5\n", encoding="utf-8")
    jobstore.submit(world.db, path)
    world.hold("mlp", 5)
    world.daemon.tick()
    (placement,) = world.placements()
    assert (placement.state, placement.instances) == ("running", 1.0)
    (body,) = sent
    assert body["InstanceMarketOptions.MarketType"] == "spot"
    assert body["InstanceMarketOptions.SpotOptions.MaxPrice"] == "2.50000"


def test_a_job_named_like_another_database_s_gets_its_own_ec2_instance(
    world: World, tmp_path: Path, pg_url: str, metadata: FakeMetadata
) -> None:
    """Issue 21, finding 4 on EC2: two histories (SQLite and PostgreSQL) drive one account, and
    each one's first job is named ``mlp`` with job id 1 and move id 1. The ``ClientToken`` of
    each launch carries its database's id, so the second start is not answered with the first's
    instance (what a token made of name and move alone got), and neither daemon's sweep takes
    the other's instance for a leak."""
    other = open_history(pg_url)
    (tmp_path / "second").mkdir()
    second = make_world(
        other,
        tmp_path / "second",
        provider=world.provider,
        agent_env={"SPOTOPT_AWS_METADATA_URL": metadata.url},
    )
    try:
        for w in (world, second):
            w.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
            jobstore.submit(w.db, job_yaml(w.tmp))
            w.hold("mlp", 5)
            w.daemon.tick()
            w.until("the job to run", lambda w=w: w.job().state == "running")  # type: ignore[misc]
        world.daemon.tick()  # the first daemon's sweep sees the second's instance: not its own
        (first,) = world.placements()
        (theirs,) = second.placements()
        assert first.instance_id != theirs.instance_id and first.key != theirs.key
        assert database_id_of(other)[:12] in theirs.key and "-j1-m1" in theirs.key
        live = {
            i.instance_id
            for i in world.provider.list_instances()
            if world.provider.status(i.instance_id).state.is_live
        }
        assert {first.instance_id, theirs.instance_id} <= live
    finally:
        second.stop_all()
        other.dispose()
