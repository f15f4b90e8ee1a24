"""The provider contract (``spotopt.clouds.common.base``): every provider's test module subclasses this.

A subclass supplies ``provider`` (a fresh provider) and ``market`` as fixtures; ``long_command``
(a command that runs until it is terminated) and ``short_command`` (one that exits by itself with
status 3) default to Python processes on this machine, where the local provider and the cloud
fakes that back instances with local processes run them; a subclass may override them. The tests
here hold for every provider, local or cloud (against its fake).
"""

from __future__ import annotations

import shlex
import sys
import time
from datetime import datetime

import pytest

from spotopt.clouds.common.base import Instance, InstanceState, LaunchSpec, Provider
from spotopt.types import MarketKey


def _spec(command: tuple[str, ...], job: str = "contract-job", epoch: int = 1, **tags: str) -> LaunchSpec:
    return LaunchSpec(job=job, epoch=epoch, command=command, checkpoint_uri="file:///nonexistent", tags=tags)


def wait_for(
    provider: Provider, instance_id: str, states: set[InstanceState], timeout_s: float = 30.0
) -> None:
    deadline = time.monotonic() + timeout_s
    while provider.status(instance_id).state not in states:
        assert time.monotonic() < deadline, f"{instance_id} never reached {states}"
        time.sleep(0.02)


class ProviderContract:
    """Inherit and provide the fixtures ``provider`` and ``market``."""

    @pytest.fixture
    def long_command(self) -> tuple[str, ...]:
        return (sys.executable, "-c", "import time; time.sleep(60)")

    @pytest.fixture
    def short_command(self) -> tuple[str, ...]:
        return (sys.executable, "-c", "import sys; sys.exit(3)")

    def test_launch_returns_a_running_instance_with_its_records(
        self, provider: Provider, market: MarketKey, long_command: tuple[str, ...]
    ) -> None:
        instance = provider.launch(_spec(long_command, team="ml"), market, "key-launch")
        try:
            assert isinstance(instance, Instance)
            assert (instance.job, instance.epoch, instance.provider) == ("contract-job", 1, provider.name)
            assert instance.market.startswith(market.cloud + "/")
            assert instance.launched_at.tzinfo is not None
            assert instance.launched_at <= datetime.now(instance.launched_at.tzinfo)
            assert provider.status(instance.instance_id).state.is_live
        finally:
            provider.terminate(instance.instance_id)

    def test_the_same_idempotency_key_launches_once(
        self, provider: Provider, market: MarketKey, long_command: tuple[str, ...]
    ) -> None:
        first = provider.launch(_spec(long_command), market, "key-same")
        try:
            again = provider.launch(_spec(long_command), market, "key-same")
            assert again == first
            assert [i.instance_id for i in provider.list_instances(job="contract-job")] == [first.instance_id]
        finally:
            provider.terminate(first.instance_id)

    def test_different_keys_launch_different_instances(
        self, provider: Provider, market: MarketKey, long_command: tuple[str, ...]
    ) -> None:
        a = provider.launch(_spec(long_command, epoch=1), market, "key-a")
        b = provider.launch(_spec(long_command, epoch=2), market, "key-b")
        try:
            assert a.instance_id != b.instance_id
            assert {i.epoch for i in provider.list_instances(job="contract-job")} == {1, 2}
        finally:
            provider.terminate(a.instance_id)
            provider.terminate(b.instance_id)

    def test_terminate_is_idempotent(
        self, provider: Provider, market: MarketKey, long_command: tuple[str, ...]
    ) -> None:
        instance = provider.launch(_spec(long_command), market, "key-term")
        first = provider.terminate(instance.instance_id)
        assert first.state is InstanceState.TERMINATED
        assert provider.terminate(instance.instance_id).state is InstanceState.TERMINATED
        assert provider.status(instance.instance_id).state is InstanceState.TERMINATED

    def test_an_unknown_instance_is_gone_and_terminating_it_succeeds(self, provider: Provider) -> None:
        assert provider.status("no-such-instance").state is InstanceState.GONE
        assert provider.terminate("no-such-instance").state is InstanceState.GONE

    def test_an_instance_that_ends_by_itself_is_exited_and_terminate_is_still_success(
        self, provider: Provider, market: MarketKey, short_command: tuple[str, ...]
    ) -> None:
        instance = provider.launch(_spec(short_command), market, "key-short")
        wait_for(provider, instance.instance_id, {InstanceState.EXITED})
        status = provider.status(instance.instance_id)
        assert status.exit_code in (3, None)  # clouds may not see the process's status
        assert provider.terminate(instance.instance_id).state is InstanceState.EXITED

    def test_list_filters_by_job_and_tags(
        self, provider: Provider, market: MarketKey, long_command: tuple[str, ...]
    ) -> None:
        a = provider.launch(_spec(long_command, job="job-a", team="x"), market, "key-la")
        b = provider.launch(_spec(long_command, job="job-b", team="y"), market, "key-lb")
        try:
            assert [i.instance_id for i in provider.list_instances(job="job-a")] == [a.instance_id]
            assert [i.instance_id for i in provider.list_instances(tags={"team": "y"})] == [b.instance_id]
            assert provider.list_instances(job="job-a", tags={"team": "y"}) == []
            assert {i.instance_id for i in provider.list_instances()} >= {a.instance_id, b.instance_id}
        finally:
            provider.terminate(a.instance_id)
            provider.terminate(b.instance_id)


def fixed_script(spec: LaunchSpec, market: MarketKey) -> str:
    """A stand-in start-up script for a cloud fake: the launch's command (the real one is
    ``bootstrap.render_script``, tested by running it)."""
    return "#!/bin/bash\nexec " + shlex.join(spec.command) + "\n"


def ends_at_once(script: str) -> bool:
    """Whether a cloud fake's VM running ``script`` finds its job ended (the short command)."""
    return shlex.join(CloudProviderContract.SHORT) in script


class CloudProviderContract(ProviderContract):
    """The contract for a cloud provider against its fake, which runs no process: a VM whose
    start-up script holds ``SHORT`` is one whose job ended and powered it off (``ends_at_once``)."""

    LONG = ("python", "train.py")
    SHORT = ("sh", "-c", "exit 3")

    @pytest.fixture
    def long_command(self) -> tuple[str, ...]:
        return self.LONG

    @pytest.fixture
    def short_command(self) -> tuple[str, ...]:
        return self.SHORT
