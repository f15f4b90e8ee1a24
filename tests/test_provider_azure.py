"""The Azure provider against a stateful fake of Azure Resource Manager (``responses``).

The fake (``tests/azure_fake.py``) answers what azure-mgmt-compute and azure-mgmt-network send,
with the ARM long-running-operation protocol (``Azure-AsyncOperation`` polled: InProgress, then
Succeeded or Failed); credentials are a fake token and no request leaves the process.
"""

from __future__ import annotations

import base64
import dataclasses
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import responses
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

from spotopt.cloud_calls import MissingCredentials
from spotopt.clouds.azure.adaptor import AzureClients, rest_json
from spotopt.clouds.azure.provider import AzureProvider
from spotopt.clouds.common.base import Billing, InstanceState, LaunchSpec
from spotopt.clouds.common.bootstrap import render_script
from spotopt.clouds.registry import get_provider
from spotopt.errors import CapacityUnavailableError, ConfigError
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind
from tests.azure_fake import GROUP, SUBSCRIPTION, AzureArmFake, admin_key
from tests.collect_fakes import FakeCredential, Sleeps, no_wait_retry
from tests.provider_contract import CloudProviderContract, ends_at_once
from tests.provider_contract import fixed_script as script

SPOT_T4 = MarketKey("azure", "eastus", None, "Standard_NC4as_T4_v3", MarketKind.SPOT)
IN_GROUP = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers"
SUBNET = f"{IN_GROUP}/Microsoft.Network/virtualNetworks/vnet/subnets/workers"
IDENTITY = f"{IN_GROUP}/Microsoft.ManagedIdentity/userAssignedIdentities/spotopt-agent"
SETTINGS = Settings(
    azure_resource_group=GROUP,
    azure_subnet_id=SUBNET,
    azure_image="Canonical:ubuntu-24_04-lts:server:latest",
    azure_identity_id=IDENTITY,
    azure_ssh_public_key=admin_key(),
    bootstrap_install=False,  # what is installed is tests/test_bootstrap.py's business
)
LAUNCHED = datetime(2026, 11, 22, 18, 0, tzinfo=UTC)


@pytest.fixture
def fake() -> Iterator[AzureArmFake]:
    made = AzureArmFake(ends_by_itself=ends_at_once)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        made.install(rsps)
        yield made


def _provider(settings: Settings = SETTINGS, **options: object) -> AzureProvider:
    clients = AzureClients(credential=FakeCredential(), subscription_id=SUBSCRIPTION)
    return AzureProvider(
        settings, clients=clients, retry=no_wait_retry(), poll_s=0, now=lambda: LAUNCHED, **options
    )  # type: ignore[arg-type]


@pytest.fixture
def provider(fake: AzureArmFake) -> AzureProvider:
    return _provider(script=script)


@pytest.fixture
def market() -> MarketKey:
    return SPOT_T4


class TestAzureProviderContract(CloudProviderContract):
    pass


def _spec(job: str = "train-1", epoch: int = 3, **tags: str) -> LaunchSpec:
    return LaunchSpec(
        job=job, epoch=epoch, command=("python", "train.py"), checkpoint_uri="az://c/ck", tags=tags
    )


def test_launch_puts_a_nic_then_a_spot_vm_and_polls_both_operations(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    instance = provider.launch(_spec(team="ml/vision", move="7"), SPOT_T4, "train-1/3/move-7")
    name = instance.instance_id
    assert re.fullmatch(r"spotopt-train-1-3-move-7-[0-9a-f]{10}", name)
    (nic_put,) = fake.calls("PUT", r"/networkInterfaces/")
    (vm_put,) = fake.calls("PUT", r"/virtualMachines/")
    assert [c.method for c in fake.log if "/operations/" not in c.url][:4] == [
        "GET",
        "PUT",
        "GET",
        "PUT",
    ]
    nic = nic_put.body
    assert nic_put.url.split("?")[0].endswith(f"/networkInterfaces/{name}-nic")
    assert nic["properties"]["ipConfigurations"][0]["properties"]["subnet"] == {"id": SUBNET}
    body = vm_put.body
    props = body["properties"]
    assert (props["priority"], props["evictionPolicy"], props["billingProfile"]) == (
        "Spot",
        "Delete",
        {"maxPrice": -1},
    )
    assert props["hardwareProfile"] == {"vmSize": "Standard_NC4as_T4_v3"}
    assert base64.b64decode(props["osProfile"]["customData"]).decode() == script(_spec(), SPOT_T4)
    assert (
        props["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"]
        == SETTINGS.azure_ssh_public_key
    )
    assert props["storageProfile"]["imageReference"] == {
        "publisher": "Canonical",
        "offer": "ubuntu-24_04-lts",
        "sku": "server",
        "version": "latest",
    }
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    (ref,) = props["networkProfile"]["networkInterfaces"]
    assert (
        ref["id"].endswith(f"/networkInterfaces/{name}-nic") and ref["properties"]["deleteOption"] == "Delete"
    )
    assert body["identity"] == {"type": "UserAssigned", "userAssignedIdentities": {IDENTITY: {}}}
    assert body["tags"] == {
        "team": "ml/vision",
        "move": "7",
        "spotopt:move": "7",
        "spotopt:job": "train-1",
        "spotopt:epoch": "3",
        "spotopt:key": "train-1/3/move-7",
        "spotopt:market": "azure/eastus/-/Standard_NC4as_T4_v3/spot",
        "spotopt:launched": "2026-11-22T18:00:00+00:00",
        "spotopt:tags": '{"move": "7", "team": "ml/vision"}',
    }
    assert "zones" not in body
    # Each PUT answered 201 Creating + Azure-AsyncOperation, polled InProgress then Succeeded.
    assert vm_put.answer["properties"]["provisioningState"] == "Creating"
    polls = [c.answer["status"] for c in fake.calls("GET", r"/operations/")]
    assert polls == ["InProgress", "Succeeded", "InProgress", "Succeeded"]
    assert (instance.job, instance.epoch, instance.tags, instance.launched_at) == (
        "train-1",
        3,
        {"team": "ml/vision", "move": "7"},
        LAUNCHED,
    )


def test_a_regular_zonal_market_is_a_regular_vm_in_its_zone(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    market = MarketKey("azure", "eastus", "2", "Standard_NC4as_T4_v3", MarketKind.ON_DEMAND)
    provider.launch(_spec(), market, "od")
    body = fake.calls("PUT", r"/virtualMachines/")[0].body
    assert body["properties"]["priority"] == "Regular" and "evictionPolicy" not in body["properties"]
    assert body["zones"] == ["2"]


def test_a_capped_job_s_spot_vm_has_its_cap_as_max_price_and_a_regular_vm_has_none(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    capped = dataclasses.replace(_spec(), max_usd_per_instance_hour=2 / 3)
    provider.launch(capped, SPOT_T4, "capped")
    regular = MarketKey("azure", "eastus", "2", "Standard_NC4as_T4_v3", MarketKind.ON_DEMAND)
    provider.launch(capped, regular, "capped-regular")
    spot_put, regular_put = fake.calls("PUT", r"/virtualMachines/")
    # five decimals, rounded down: Azure evicts above it, so it must not exceed the job's cap
    assert spot_put.body["properties"]["billingProfile"] == {"maxPrice": 0.66666}
    assert "billingProfile" not in regular_put.body["properties"]


def test_the_same_key_reads_the_existing_vm_and_puts_nothing(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    first = provider.launch(_spec(), SPOT_T4, "key-1")
    assert provider.launch(_spec(), SPOT_T4, "key-1") == first
    assert len(fake.calls("PUT", r"/virtualMachines/")) == 1


@pytest.mark.parametrize(
    "code", ["SkuNotAvailable", "OverconstrainedAllocationRequest", "ZonalAllocationFailed"]
)
def test_a_capacity_error_on_the_put_is_capacity_unavailable_and_leaves_nothing(
    provider: AzureProvider, fake: AzureArmFake, code: str
) -> None:
    fake.sync_error = (409, code)
    with pytest.raises(
        CapacityUnavailableError, match=rf"azure/eastus/-/Standard_NC4as_T4_v3/spot: no capacity \({code}\)"
    ):
        provider.launch(_spec(), SPOT_T4, "key-c")
    assert fake.resources == {}  # the NIC created first was deleted


def test_allocation_failed_in_the_operation_is_capacity_unavailable_and_leaves_nothing(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    fake.async_error = "AllocationFailed"
    with pytest.raises(CapacityUnavailableError, match=r"no capacity \(AllocationFailed\)"):
        provider.launch(_spec(), SPOT_T4, "key-a")
    failed = [c.answer for c in fake.calls("GET", r"/operations/") if c.answer["status"] == "Failed"]
    assert [f["error"]["code"] for f in failed] == ["AllocationFailed"]
    assert fake.resources == {}  # the failed VM and the NIC were deleted


def test_delete_answering_404_is_tolerated_and_the_nic_is_deleted_as_a_fallback(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    instance = provider.launch(_spec(), SPOT_T4, "key-d")
    name = instance.instance_id
    assert provider.terminate(name).state is InstanceState.TERMINATED
    (nic_delete,) = fake.calls("DELETE", r"/networkInterfaces/")
    assert nic_delete.status == 404  # deleteOption=Delete took it with the VM
    assert provider.terminate(name).state is InstanceState.TERMINATED
    fresh = _provider(script=script)  # another daemon process: knows nothing of our delete
    assert fresh.terminate(name).state is InstanceState.GONE
    fake.resources[("nic", "spotopt-left-nic")] = {
        "name": "spotopt-left-nic",
        "location": "eastus",
        "properties": {},
    }
    fake.resources[("vm", "spotopt-left")] = {
        "name": "spotopt-left",
        "location": "eastus",
        "tags": {},
        "properties": {"networkProfile": {"networkInterfaces": []}},
    }
    provider._delete("spotopt-left")  # a NIC without deleteOption (a failed create) goes explicitly
    assert fake.resources == {}


def test_an_evicted_spot_vm_is_preempted_and_its_nic_deleted(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    instance = provider.launch(_spec(), SPOT_T4, "key-e")
    fake.vm(instance.instance_id)["properties"]["provisioningState"] = "Deleting"  # type: ignore[index]
    assert provider.status(instance.instance_id).state is InstanceState.PREEMPTED
    fake.evict(instance.instance_id)  # the VM and its disk go; the NIC (and its address) stays
    status = provider.status(instance.instance_id)
    assert (status.state, status.billing) == (InstanceState.PREEMPTED, Billing.STORAGE)
    assert fake.billing() == [f"nic {instance.instance_id}-nic"]
    ended = provider.terminate(instance.instance_id)
    assert (ended.state, ended.billing) == (InstanceState.PREEMPTED, Billing.NONE)
    assert fake.billing() == []


def test_an_orphan_nic_is_listed_and_deleted_by_a_daemon_that_never_saw_its_vm(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    instance = provider.launch(_spec(job="nic-job"), SPOT_T4, "key-n")
    fake.evict(instance.instance_id)
    restarted = _provider(script=script)
    assert [i.instance_id for i in restarted.list_instances(job="nic-job")] == [instance.instance_id]
    assert restarted.status(instance.instance_id).billing is Billing.STORAGE
    restarted.terminate(instance.instance_id)
    assert fake.billing() == [] and restarted.list_instances() == []


def test_a_vm_the_guest_powered_off_is_billed_until_terminate_deletes_it(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    """A VM powered off from the guest is PowerState/stopped: still allocated, billed as running
    ("States and billing status of Azure Virtual Machines")."""
    instance = provider.launch(_spec(), SPOT_T4, "key-off")
    fake.power_off(instance.instance_id)
    status = provider.status(instance.instance_id)
    assert (status.state, status.billing) == (InstanceState.EXITED, Billing.COMPUTE)
    provider.terminate(instance.instance_id)
    assert fake.billing() == []  # VM, OS disk (deleteOption=Delete) and NIC


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        (lambda fake: setattr(fake, "spot_price", 1.0), "SpotPriceGreaterThanProvidedMaxPrice"),
        (lambda fake: fake.no_spot_sizes.add(SPOT_T4.instance_type), "AzureSpotIsNotSupportedForThisVMSize"),
    ],
)
def test_the_documented_spot_refusals_are_capacity_unavailable_and_leave_nothing(
    provider: AzureProvider, fake: AzureArmFake, setup: Any, code: str
) -> None:
    setup(fake)
    capped = dataclasses.replace(_spec(), max_usd_per_instance_hour=0.5)
    with pytest.raises(CapacityUnavailableError, match=rf"no capacity \({code}\)"):
        provider.launch(capped, SPOT_T4, "key-price")
    assert fake.billing() == []


def test_list_filters_by_tags_and_ignores_vms_spotopt_did_not_launch(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    a = provider.launch(_spec(job="job-a", team="x"), SPOT_T4, "key-a")
    provider.launch(_spec(job="job-b", team="y"), SPOT_T4, "key-b")
    fake.resources[("vm", "someone-else")] = {"name": "someone-else", "tags": {"team": "x"}, "properties": {}}
    assert provider.list_instances(tags={"team": "x"}) == [a]
    assert {i.job for i in provider.list_instances()} == {"job-a", "job-b"}
    assert provider.status("someone-else").state is InstanceState.GONE


@pytest.mark.parametrize(
    ("missing", "env"),
    [
        ("azure_resource_group", "SPOTOPT_AZURE_RESOURCE_GROUP"),
        ("azure_subnet_id", "SPOTOPT_AZURE_SUBNET_ID"),
        ("azure_image", "SPOTOPT_AZURE_IMAGE"),
        ("azure_identity_id", "SPOTOPT_AZURE_IDENTITY_ID"),
    ],
)
def test_a_missing_setting_is_a_config_error_before_any_call(
    fake: AzureArmFake, missing: str, env: str
) -> None:
    with pytest.raises(ConfigError, match=f"{missing} is not set: set {env}"):
        _provider(SETTINGS.model_copy(update={missing: None}), script=script)
    with pytest.raises(ConfigError, match="SPOTOPT_AZURE_IMAGE"):
        _provider(SETTINGS.model_copy(update={"azure_image": "ubuntu"}), script=script)
    assert list(fake.rsps.calls) == []


def test_an_image_id_and_a_throwaway_key_without_a_configured_one(fake: AzureArmFake) -> None:
    image = f"{IN_GROUP}/Microsoft.Compute/galleries/g/images/trainer/versions/1.0.0"
    made = _provider(
        SETTINGS.model_copy(update={"azure_image": image, "azure_ssh_public_key": None}), script=script
    )
    made.launch(_spec(), SPOT_T4, "key-i")
    props = fake.calls("PUT", r"/virtualMachines/")[0].body["properties"]
    assert props["storageProfile"]["imageReference"] == {"id": image}
    key = props["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"][0]["keyData"]
    # the API reference: "at least 2048-bit and in ssh-rsa format"
    assert key.startswith("ssh-rsa ") and load_ssh_public_key(key.encode()).key_size >= 2048  # type: ignore[union-attr]


def test_the_default_script_is_the_rendered_bootstrap_and_the_registry_builds_the_provider(
    fake: AzureArmFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = _provider()
    instance = made.launch(_spec(), SPOT_T4, "key-b")
    assert fake.custom_data[instance.instance_id] == render_script(_spec(), SPOT_T4, SETTINGS)
    for name, value in SETTINGS.model_dump(exclude_none=True).items():
        if name.startswith("azure_"):
            monkeypatch.setenv(f"SPOTOPT_{name.upper()}", str(value))
    assert isinstance(get_provider("azure"), AzureProvider)


def test_throttling_is_retried_and_missing_credentials_name_the_cloud(
    fake: AzureArmFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    sleeps = Sleeps()
    clients = AzureClients(credential=FakeCredential(), subscription_id=SUBSCRIPTION)
    provider = AzureProvider(SETTINGS, script=script, clients=clients, retry=no_wait_retry(sleeps), poll_s=0)
    fake.faults += [429, 503]
    assert provider.status("spotopt-nothing").state is InstanceState.GONE
    assert sleeps == [0.5, 1.0]
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    unconfigured = AzureProvider(SETTINGS, script=script, retry=no_wait_retry())
    with pytest.raises(MissingCredentials, match="azure: credentials failed: configure Azure credentials"):
        unconfigured.launch(_spec(), SPOT_T4, "key-m")


def test_a_failed_cleanup_keeps_the_capacity_error_and_says_what_was_left(
    provider: AzureProvider, fake: AzureArmFake
) -> None:
    fake.sync_error = (409, "SkuNotAvailable")
    fake.broken_deletes = True
    with pytest.raises(CapacityUnavailableError) as caught:
        provider.launch(_spec(), SPOT_T4, "key-l")
    (note,) = caught.value.__notes__
    assert re.match(
        r"and cleaning up spotopt-key-l-[0-9a-f]{10} failed: azure: virtualMachines\.delete failed", note
    )


def test_answers_of_either_sdk_generation_are_read_as_rest_json() -> None:
    """azure-mgmt-compute ≥ 38 (TypeSpec) models are mappings of the REST JSON; older ones (as
    azure-mgmt-resourcegraph's still are) are msrest objects with snake_case attributes. Both
    read as the REST JSON the provider works on (the floors themselves: ``.ci/sdk-floors``)."""
    from azure.mgmt.compute.models import VirtualMachine
    from azure.mgmt.resourcegraph.models import QueryRequestOptions

    vm = VirtualMachine(location="eastus", priority="Spot")  # flattened keywords: both generations
    assert rest_json(vm) == {"location": "eastus", "properties": {"priority": "Spot"}}
    msrest = QueryRequestOptions(result_format="objectArray", top=10)
    assert rest_json(msrest) == {"$top": 10, "resultFormat": "objectArray", "allowPartialScopes": False}
