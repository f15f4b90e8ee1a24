"""The GCP provider against a stateful fake of the Compute Engine REST API (``responses``).

The fake (``tests/gcp_fake.py``) answers what google-cloud-compute's REST transport sends, with
bodies shaped after the Compute Engine v1 reference; credentials are anonymous and no request
leaves the process (``responses`` refuses any URL it was not told about).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote_plus

import pytest
import responses
from google.auth.credentials import AnonymousCredentials

from spotopt.cloud_calls import MissingCredentials
from spotopt.clouds.common.base import Billing, InstanceState, LaunchSpec
from spotopt.clouds.common.bootstrap import render_script
from spotopt.clouds.common.naming import request_uuid
from spotopt.clouds.gcp.adaptor import GcpClients
from spotopt.clouds.gcp.provider import GcpProvider
from spotopt.clouds.registry import get_provider
from spotopt.errors import CapacityUnavailableError, ConfigError, ProviderError
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind
from tests.collect_fakes import Sleeps, no_wait_retry
from tests.gcp_fake import PROJECT, GcpComputeFake
from tests.provider_contract import CloudProviderContract, ends_at_once
from tests.provider_contract import fixed_script as script

ZONE = "us-central1-a"
SPOT_V100 = MarketKey("gcp", "us-central1", ZONE, "n1-standard-8+1xnvidia-tesla-v100", MarketKind.SPOT)
REGIONAL_L4 = MarketKey("gcp", "us-central1", None, "g2-standard-8", MarketKind.SPOT)
SETTINGS = Settings(
    gcp_image="projects/debian-cloud/global/images/family/debian-12",
    gcp_service_account="agent@spotopt-test.iam.gserviceaccount.com",
    bootstrap_install=False,  # what is installed is tests/test_bootstrap.py's business
)


@pytest.fixture
def fake() -> Iterator[GcpComputeFake]:
    made = GcpComputeFake(
        offers={"g2-standard-8": ["us-central1-b", "us-central1-c", "europe-west4-a"]},
        ends_by_itself=ends_at_once,
    )
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        made.install(rsps)
        yield made


@pytest.fixture
def sleeps() -> Sleeps:
    return Sleeps()


def _clients() -> GcpClients:
    return GcpClients(credentials=AnonymousCredentials(), project=PROJECT)


@pytest.fixture
def provider(fake: GcpComputeFake, sleeps: Sleeps) -> GcpProvider:
    return GcpProvider(SETTINGS, script=script, clients=_clients(), retry=no_wait_retry(), sleep=sleeps)


@pytest.fixture
def market() -> MarketKey:
    return SPOT_V100


class TestGcpProviderContract(CloudProviderContract):
    pass


def _spec(job: str = "train-1", epoch: int = 3, **tags: str) -> LaunchSpec:
    return LaunchSpec(
        job=job, epoch=epoch, command=("python", "train.py"), checkpoint_uri="gs://b/ck", tags=tags
    )


def test_a_spot_insert_sends_spot_scheduling_gpus_labels_metadata_and_a_request_id(
    provider: GcpProvider, fake: GcpComputeFake, sleeps: Sleeps
) -> None:
    instance = provider.launch(_spec(team="Vision/ML", move="7"), SPOT_V100, "train-1/3/move-7")
    (insert,) = fake.calls("POST", r"/zones/us-central1-a/instances\?")
    body = json.loads(insert.request.body)
    name = body["name"]
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", name) and name.startswith(
        "spotopt-train-1-3-move-7-"
    )
    assert instance.instance_id == f"{ZONE}/{name}"
    assert body["scheduling"] == {
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
    }
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/n1-standard-8"
    assert body["guestAccelerators"] == [
        {"acceleratorType": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-v100", "acceleratorCount": 1}
    ]
    assert body["disks"][0]["autoDelete"] is True
    assert body["disks"][0]["initializeParams"]["sourceImage"] == SETTINGS.gcp_image
    assert body["serviceAccounts"][0]["email"] == SETTINGS.gcp_service_account
    (interface,) = body["networkInterfaces"]
    assert interface["network"] == "global/networks/default" and "subnetwork" not in interface
    assert interface["accessConfigs"] == [{"name": "external-nat", "type": "ONE_TO_ONE_NAT"}]
    labels = body["labels"]
    assert labels["spotopt-job"] == "train-1" and labels["spotopt-epoch"] == "3"
    assert labels["spotopt-move"] == labels["move"] == "7"
    assert re.fullmatch(r"train-1_3_move-7-[0-9a-f]{10}", labels["spotopt-key"])
    assert re.fullmatch(r"vision_ml-[0-9a-f]{10}", labels["team"])  # sanitised, exact value in metadata
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["startup-script"] == script(_spec(), SPOT_V100)
    assert (meta["spotopt-key"], meta["spotopt-job"], json.loads(meta["spotopt-tags"])) == (
        "train-1/3/move-7",
        "train-1",
        {"team": "Vision/ML", "move": "7"},
    )
    request_id = re.search(r"requestId=([0-9a-f-]+)", insert.request.url)
    assert request_id is not None and request_id[1] == request_uuid("train-1/3/move-7", ZONE)
    assert uuid.UUID(request_id[1]).version == 5
    # The operation came back PENDING and was waited on until DONE; polling went through `sleep`.
    assert json.loads(insert.response.text)["status"] == "PENDING"
    (wait,) = fake.calls("POST", r"/operations/operation-\d+-insert/wait")
    assert json.loads(wait.response.text)["status"] == "DONE"
    assert sleeps == [1.0]
    assert (instance.job, instance.epoch, instance.tags) == ("train-1", 3, {"team": "Vision/ML", "move": "7"})
    assert instance.market == "gcp/us-central1/us-central1-a/n1-standard-8+1xnvidia-tesla-v100/spot"


def test_an_on_demand_market_is_standard_and_a_built_in_gpu_type_attaches_nothing(
    fake: GcpComputeFake,
) -> None:
    settings = SETTINGS.model_copy(
        update={"gcp_subnetwork": "regions/us-central1/subnetworks/workers", "gcp_external_ip": False}
    )
    provider = GcpProvider(settings, clients=_clients(), retry=no_wait_retry(), sleep=Sleeps())
    market = MarketKey("gcp", "us-central1", "us-central1-b", "g2-standard-8", MarketKind.ON_DEMAND)
    instance = provider.launch(_spec(), market, "od")
    body = json.loads(fake.calls("POST", r"/instances\?")[0].request.body)
    meta = {i["key"]: i["value"] for i in body["metadata"]["items"]}
    assert meta["startup-script"] == render_script(_spec(), market, settings)  # the default
    zone, name = instance.instance_id.split("/")
    assert fake.instances[(zone, name)]["status"] == "RUNNING"
    (interface,) = body["networkInterfaces"]
    assert interface["subnetwork"] == "regions/us-central1/subnetworks/workers"
    assert "accessConfigs" not in interface
    assert body["scheduling"]["provisioningModel"] == "STANDARD"
    assert "instanceTerminationAction" not in body["scheduling"]
    assert "guestAccelerators" not in body


def test_a_repeated_insert_with_the_same_request_id_returns_the_existing_instance(
    provider: GcpProvider, fake: GcpComputeFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = provider.launch(_spec(), SPOT_V100, "key-1")
    monkeypatch.setattr(provider, "_list", lambda flt: [])  # the label lookup raced a launcher
    assert provider.launch(_spec(), SPOT_V100, "key-1") == first
    inserts = fake.calls("POST", r"/instances\?")
    assert [json.loads(c.response.text)["name"] for c in inserts] == ["operation-1000-insert"] * 2
    assert len(fake.inserted) == 1 and len(fake.instances) == 1


def test_a_409_already_exists_on_insert_returns_the_existing_instance(
    provider: GcpProvider, fake: GcpComputeFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = provider.launch(_spec(), SPOT_V100, "key-1")
    fake.requests.clear()  # GCP no longer remembers the request id: the name collides
    monkeypatch.setattr(provider, "_list", lambda flt: [])
    assert provider.launch(_spec(), SPOT_V100, "key-1") == first
    second = fake.calls("POST", r"/instances\?")[-1]
    assert second.response.status_code == 409
    assert json.loads(second.response.text)["error"]["errors"][0]["reason"] == "alreadyExists"
    assert len(fake.instances) == 1


def test_zone_resource_pool_exhausted_is_capacity_unavailable(
    provider: GcpProvider, fake: GcpComputeFake
) -> None:
    fake.exhausted.add(ZONE)
    with pytest.raises(
        CapacityUnavailableError,
        match=r"gcp/us-central1/us-central1-a/n1-standard-8.*ZONE_RESOURCE_POOL_EXHAUSTED",
    ):
        provider.launch(_spec(), SPOT_V100, "key-x")
    (wait,) = fake.calls("POST", r"/wait")
    assert json.loads(wait.response.text)["error"]["errors"][0]["code"] == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert fake.instances == {}


def test_a_quota_error_is_capacity_unavailable_without_trying_other_zones(
    provider: GcpProvider, fake: GcpComputeFake
) -> None:
    fake.quota_exceeded = True
    with pytest.raises(CapacityUnavailableError, match="QUOTA_EXCEEDED"):
        provider.launch(_spec(), REGIONAL_L4, "key-q")
    assert len(fake.calls("POST", r"/instances\?")) == 1


def test_a_regional_market_tries_the_zones_offering_the_type_in_order(
    provider: GcpProvider, fake: GcpComputeFake
) -> None:
    fake.exhausted.add("us-central1-b")
    instance = provider.launch(_spec(), REGIONAL_L4, "key-r")
    assert instance.instance_id.startswith("us-central1-c/")
    (offers,) = fake.calls("GET", r"/aggregated/machineTypes")
    assert 'name = "g2-standard-8"' in unquote_plus(offers.request.url)
    zones = [
        re.search(r"/zones/([a-z0-9-]+)/instances", c.request.url)[1]
        for c in fake.calls("POST", r"/instances\?")
    ]  # type: ignore[index]
    assert zones == ["us-central1-b", "us-central1-c"]
    # A retry after the fallback finds the instance by its key label wherever it went.
    assert provider.launch(_spec(), REGIONAL_L4, "key-r") == instance
    assert len(fake.calls("POST", r"/instances\?")) == 2
    fake.exhausted.add("us-central1-c")
    with pytest.raises(CapacityUnavailableError, match="us-central1-b, us-central1-c"):
        provider.launch(_spec(), REGIONAL_L4, "key-r2")


def test_a_region_where_no_zone_offers_the_type_is_capacity_unavailable(provider: GcpProvider) -> None:
    market = MarketKey("gcp", "asia-east1", None, "g2-standard-8", MarketKind.SPOT)
    with pytest.raises(CapacityUnavailableError, match="no zone of asia-east1 offers g2-standard-8"):
        provider.launch(_spec(), market, "key-asia")


def test_delete_answering_404_is_tolerated(
    provider: GcpProvider, fake: GcpComputeFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    instance = provider.launch(_spec(), SPOT_V100, "key-d")
    zone, name = instance.instance_id.split("/")
    real_status = provider.status

    def status_then_vanish(instance_id: str) -> Any:
        seen = real_status(instance_id)
        fake.instances.pop((zone, name), None)  # someone deleted it between our get and our delete
        return seen

    monkeypatch.setattr(provider, "status", status_then_vanish)
    assert provider.terminate(instance.instance_id).state is InstanceState.TERMINATED
    (delete,) = fake.calls("DELETE", rf"/instances/{name}")
    assert delete.response.status_code == 404


def test_a_preempted_instance_is_preempted_after_gcp_deleted_it(
    provider: GcpProvider, fake: GcpComputeFake
) -> None:
    instance = provider.launch(_spec(), SPOT_V100, "key-p")
    zone, name = instance.instance_id.split("/")
    fake.preempt(zone, name)
    status = provider.status(instance.instance_id)
    assert (status.state, status.instance) == (InstanceState.PREEMPTED, None)
    (ops,) = fake.calls("GET", r"/zones/us-central1-a/operations\?")
    # the documented filter syntax only (the fake refuses a ':' substring match)
    assert 'filter=(operationType = "compute.instances.preempted") OR (operationType = "delete")' in (
        unquote_plus(ops.request.url)
    )
    assert provider.terminate(instance.instance_id).state is InstanceState.PREEMPTED
    assert fake.calls("DELETE", "/instances/") == []


def test_list_filters_by_the_job_label_and_ignores_foreign_instances(
    provider: GcpProvider, fake: GcpComputeFake
) -> None:
    a = provider.launch(_spec(job="Job A"), SPOT_V100, "key-a")
    provider.launch(_spec(job="job-b"), SPOT_V100, "key-b")
    fake.instances[(ZONE, "someone-else")] = {
        "name": "someone-else",
        "status": "RUNNING",
        "metadata": {"items": []},
        "labels": {},
        "creationTimestamp": "2026-11-22T10:00:00.000-08:00",
    }
    assert provider.list_instances(job="Job A") == [a]
    query = unquote_plus(fake.calls("GET", r"/aggregated/instances")[-1].request.url)
    assert re.search(r'filter=labels\.spotopt-job = "job_a-[0-9a-f]{10}"', query)
    assert len(provider.list_instances()) == 2
    assert provider.status(f"{ZONE}/someone-else").state is InstanceState.GONE


def test_ids_that_are_not_zone_slash_name_are_gone_without_a_call(
    provider: GcpProvider, fake: GcpComputeFake
) -> None:
    for bad in ("", "no-zone", "a/b/c"):
        assert provider.status(bad).state is InstanceState.GONE
    assert list(fake.rsps.calls) == []


@pytest.mark.parametrize(
    ("missing", "env"),
    [("gcp_image", "SPOTOPT_GCP_IMAGE"), ("gcp_service_account", "SPOTOPT_GCP_SERVICE_ACCOUNT")],
)
def test_a_missing_setting_is_a_config_error_before_any_call(
    missing: str, env: str, fake: GcpComputeFake
) -> None:
    settings = SETTINGS.model_copy(update={missing: None})
    with pytest.raises(ConfigError, match=f"{missing} is not set: set {env}"):
        GcpProvider(settings, script=script)
    assert list(fake.rsps.calls) == []


def test_settings_come_from_the_environment_and_the_registry_builds_the_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPOTOPT_GCP_IMAGE", "projects/p/global/images/family/f")
    monkeypatch.setenv("SPOTOPT_GCP_SERVICE_ACCOUNT", "sa@p.iam.gserviceaccount.com")
    monkeypatch.setenv("SPOTOPT_GCP_PROJECT", "from-env")
    made = get_provider("gcp", script=script)
    assert isinstance(made, GcpProvider)
    assert made.image == "projects/p/global/images/family/f"
    assert made.clients._project == "from-env"


def test_a_vm_stopping_under_a_delete_is_terminated_and_transient_errors_are_retried(
    fake: GcpComputeFake,
) -> None:
    retry_sleeps = Sleeps()
    provider = GcpProvider(
        SETTINGS, script=script, clients=_clients(), retry=no_wait_retry(retry_sleeps), sleep=Sleeps()
    )
    instance = provider.launch(_spec(), SPOT_V100, "key-s")
    zone, name = instance.instance_id.split("/")
    fake.instances[(zone, name)]["status"] = "STOPPING"
    fake._operation(zone, name, "delete", "RUNNING")  # another process is deleting it
    fake.faults += [503, 429]  # throttled and unavailable once each, then served
    assert provider.status(instance.instance_id).state is InstanceState.TERMINATED
    assert retry_sleeps == [0.5, 1.0]  # the collectors' jittered backoff (rng 0.5)
    fake.faults += [503] * 3
    with pytest.raises(ProviderError, match=r"gcp: instances\.get failed: still failing after 3 attempts"):
        provider.status(instance.instance_id)


def test_missing_gcp_credentials_name_the_cloud_and_what_to_configure(
    monkeypatch: pytest.MonkeyPatch, fake: GcpComputeFake
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", "/nonexistent/adc.json")
    provider = GcpProvider(SETTINGS, script=script, retry=no_wait_retry())
    with pytest.raises(MissingCredentials, match="gcp: credentials failed: configure Application Default"):
        provider.launch(_spec(), SPOT_V100, "key-m")
    assert list(fake.rsps.calls) == []


def test_an_operation_of_another_instance_whose_name_contains_this_one_is_not_taken(
    provider: GcpProvider, fake: GcpComputeFake
) -> None:
    """The target link is compared exactly: ``job-1`` is not preempted by ``job-10``'s preemption."""
    a = provider.launch(_spec(), SPOT_V100, "key-1")
    zone, name = a.instance_id.split("/")
    fake.instances[(zone, name + "0")] = dict(fake.instances[(zone, name)], name=name + "0")
    fake.preempt(zone, name + "0")
    assert provider.status(a.instance_id).state is InstanceState.RUNNING
    fake.instances.pop((zone, name))
    assert provider.status(a.instance_id).state is InstanceState.GONE


def test_rate_limit_exceeded_is_a_request_rate_retried_not_a_capacity_shortage(
    fake: GcpComputeFake,
) -> None:
    """Compute Engine answers its request-rate limit with HTTP 403 ``rateLimitExceeded`` ("wait
    until some requests complete and try your request again"): the insert is retried and
    launches; the market is not reported out of capacity."""
    sleeps = Sleeps()
    provider = GcpProvider(
        SETTINGS, script=script, clients=_clients(), retry=no_wait_retry(sleeps), sleep=Sleeps()
    )
    fake.faults.append(403)
    instance = provider.launch(_spec(), SPOT_V100, "key-rate")
    assert provider.status(instance.instance_id).state is InstanceState.RUNNING
    assert sleeps == [0.5]  # one backoff, then the insert went through


def test_a_vm_the_guest_stopped_bills_its_disk_until_terminate_deletes_both(
    provider: GcpProvider, fake: GcpComputeFake
) -> None:
    instance = provider.launch(_spec(), SPOT_V100, "key-stop")
    zone, name = instance.instance_id.split("/")
    assert fake.disks.keys() == {(zone, name)}
    fake.power_off(zone, name)
    status = provider.status(instance.instance_id)
    assert (status.state, status.billing) == (InstanceState.EXITED, Billing.STORAGE)
    ended = provider.terminate(instance.instance_id)
    assert (ended.state, ended.billing) == (InstanceState.EXITED, Billing.NONE)
    assert fake.billing() == []  # instance and boot disk (autoDelete) gone
