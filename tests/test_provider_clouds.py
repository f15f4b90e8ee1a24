"""The ``clouds`` provider: routing by market and by id prefix, lazy building, and clouds that
cannot be built (settings or credentials missing) left out with their reason.

The routing runs the shared provider contract with one local provider standing for each cloud,
so what is checked is the router itself; each cloud's provider has its own contract run
against its fake (``test_provider_aws`` etc.).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotopt.cloud_calls import MissingCredentials
from spotopt.clouds.aws.provider import AwsProvider
from spotopt.clouds.common.base import InstanceState, LaunchSpec, Provider
from spotopt.clouds.common.router import CloudsProvider, build_cloud, split_id
from spotopt.clouds.local.provider import LocalProvider
from spotopt.clouds.registry import get_provider
from spotopt.errors import ConfigError, ProviderError
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind
from tests.fake_ec2 import FAKE_CREDENTIALS
from tests.provider_contract import ProviderContract

MARKETS = {
    "aws": MarketKey("aws", "us-east-1", "us-east-1a", "p3.2xlarge", MarketKind.SPOT),
    "gcp": MarketKey("gcp", "us-central1", "us-central1-a", "g2-standard-4", MarketKind.SPOT),
    "azure": MarketKey("azure", "eastus", None, "Standard_NC6s_v3", MarketKind.ON_DEMAND),
}
SLEEP = (sys.executable, "-c", "import time; time.sleep(60)")


class Clouds:
    """A builder standing each cloud in with a local provider of its own, recording the builds."""

    def __init__(self, home: Path, broken: dict[str, Exception] | None = None) -> None:
        self.home = home
        self.broken = broken or {}
        self.built: list[tuple[str, list[str]]] = []
        self.made: dict[str, LocalProvider] = {}

    def __call__(self, cloud: str, settings: Settings, regions: list[str]) -> Provider:
        self.built.append((cloud, regions))
        if cloud in self.broken:
            raise self.broken[cloud]
        self.made[cloud] = LocalProvider(self.home / cloud, grace_s=5.0)
        return self.made[cloud]

    def stop_all(self) -> None:
        for provider in self.made.values():
            for instance in provider.list_instances():
                provider.terminate(instance.instance_id)


@pytest.fixture
def clouds(tmp_path: Path) -> Iterator[Clouds]:
    made = Clouds(tmp_path / "clouds")
    yield made
    made.stop_all()


class TestCloudsProviderContract(ProviderContract):
    @pytest.fixture(params=sorted(MARKETS))
    def market(self, request: pytest.FixtureRequest) -> MarketKey:
        return MARKETS[request.param]

    @pytest.fixture
    def provider(self, clouds: Clouds) -> CloudsProvider:
        return CloudsProvider(regions={"aws": ["us-east-1"], "gcp": [], "azure": []}, build=clouds)


def _spec(job: str = "j") -> LaunchSpec:
    return LaunchSpec(job, 1, SLEEP, "file:///nonexistent", tags={"spotopt:job": job})


def test_each_placement_goes_to_its_markets_cloud_and_ids_name_the_cloud(clouds: Clouds) -> None:
    router = CloudsProvider(regions={"aws": ["us-east-1", "us-west-2"], "gcp": ["us-central1"]}, build=clouds)
    assert clouds.built == []  # nothing built (no SDK imported) before a call needs a cloud
    launched = {cloud: router.launch(_spec(cloud), market, f"k-{cloud}") for cloud, market in MARKETS.items()}
    assert clouds.built == [("aws", ["us-east-1", "us-west-2"]), ("gcp", ["us-central1"]), ("azure", [])]
    for cloud, instance in launched.items():
        assert instance.provider == "clouds" and instance.instance_id.startswith(f"{cloud}:local-")
        own = instance.instance_id.split(":", 1)[1]
        # the instance is the one of its cloud's provider, and only there
        assert [c for c, p in clouds.made.items() if p.status(own).state.is_live] == [cloud]
    in_order = sorted(launched.values(), key=lambda i: (i.launched_at, i.instance_id))
    assert [i.instance_id for i in router.list_instances()] == [i.instance_id for i in in_order]
    ended = router.terminate(launched["gcp"].instance_id)
    assert ended.instance_id == launched["gcp"].instance_id and ended.state is InstanceState.TERMINATED
    assert ended.instance is not None and ended.instance.instance_id == launched["gcp"].instance_id
    assert router.status(launched["aws"].instance_id).state.is_live
    assert len(clouds.built) == 3  # each cloud built once


@pytest.mark.parametrize(
    "instance_id", ["i-0abc@us-east-1", "local-123", "oracle:i-1", "aws:", ":x", "us-east1-b/spotopt-a"]
)
def test_an_id_without_a_cloud_prefix_is_gone_and_never_terminated(clouds: Clouds, instance_id: str) -> None:
    router = CloudsProvider(regions={"aws": []}, build=clouds)
    assert split_id(instance_id) is None
    assert router.status(instance_id).state is InstanceState.GONE
    assert router.terminate(instance_id).state is InstanceState.GONE
    assert clouds.built == []


def test_ids_keep_the_clouds_own_id_verbatim() -> None:
    assert split_id("aws:i-0abc@us-east-1") == ("aws", "i-0abc@us-east-1")
    assert split_id("gcp:us-central1-a/spotopt-x") == ("gcp", "us-central1-a/spotopt-x")
    assert split_id("azure:spotopt-a:b") == ("azure", "spotopt-a:b")


def test_a_cloud_that_cannot_be_built_is_left_out_with_its_reason(tmp_path: Path) -> None:
    broken = {
        "gcp": ConfigError("gcp_image is not set: set SPOTOPT_GCP_IMAGE to the boot image"),
        "azure": MissingCredentials("azure", "configure Azure credentials"),
    }
    clouds = Clouds(tmp_path / "clouds", broken)
    try:
        router = CloudsProvider(regions={"aws": [], "gcp": [], "azure": []}, build=clouds)
        assert router.usable() == ["aws"]
        assert router.problems == {
            "gcp": "gcp: gcp_image is not set: set SPOTOPT_GCP_IMAGE to the boot image",
            "azure": "azure: configure Azure credentials",
        }
        router.launch(_spec(), MARKETS["aws"], "k")
        assert len(router.list_instances()) == 1  # the broken clouds are skipped, not fatal
        with pytest.raises(ConfigError, match=r"^gcp: gcp_image is not set"):
            router.launch(_spec(), MARKETS["gcp"], "k2")
        # An id on a cloud we cannot reach is not "gone": that would relaunch a running job.
        with pytest.raises(ProviderError, match=r"azure:x.*configure Azure credentials"):
            router.status("azure:x")
        assert [c for c, _ in clouds.built] == ["aws", "gcp", "azure"]  # one attempt per cloud
    finally:
        clouds.stop_all()


def test_the_registry_builds_clouds() -> None:
    made = get_provider("clouds", regions={"aws": ["us-east-1"]})
    assert isinstance(made, CloudsProvider) and made.runs_on_market and made.name == "clouds"


@pytest.fixture
def no_aws_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


AWS_SETTINGS = {"aws_image_id": "ami-1", "aws_instance_profile": "spotopt-job"}


def test_building_each_cloud_checks_its_settings_and_credentials(
    no_aws_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"^aws_image_id is not set: set SPOTOPT_AWS_IMAGE_ID"):
        build_cloud("aws", Settings(), ["us-east-1"])
    with pytest.raises(MissingCredentials, match="configure AWS credentials"):
        build_cloud("aws", Settings(**AWS_SETTINGS), ["us-east-1"])
    with pytest.raises(ConfigError, match=r"^gcp_image is not set: set SPOTOPT_GCP_IMAGE"):
        build_cloud("gcp", Settings(), [])
    with pytest.raises(ConfigError, match=r"^azure_resource_group is not set"):
        build_cloud("azure", Settings(), [])
    azure = {
        "azure_resource_group": "rg",
        "azure_subnet_id": "/subscriptions/s/resourceGroups/rg/providers/"
        "Microsoft.Network/virtualNetworks/v/subnets/s",
        "azure_image": "Canonical:ubuntu-24_04-lts:server:latest",
        "azure_identity_id": "/subscriptions/s/resourceGroups/rg/providers/"
        "Microsoft.ManagedIdentity/userAssignedIdentities/spotopt",
    }
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    with pytest.raises(MissingCredentials, match="AZURE_SUBSCRIPTION_ID"):
        build_cloud("azure", Settings(**azure), [])
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    aws = build_cloud("aws", Settings(**AWS_SETTINGS), ["us-east-1", "eu-west-1"])
    assert isinstance(aws, AwsProvider) and list(aws.regions) == ["us-east-1", "eu-west-1"]
    with pytest.raises(ConfigError, match="cloud 'oracle' is unknown"):
        build_cloud("oracle", Settings(), [])
