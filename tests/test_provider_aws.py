"""The AWS provider against moto's server over real HTTP (network: 127.0.0.1 only).

Each launched instance is backed by a local process running the rendered user data
(``tests.fake_ec2.LocalEc2``), so the shared provider contract runs here as it does for
``local``. moto cannot be told to fail ``RunInstances`` with a capacity error or to throttle,
so those tests raise the exact ``ClientError`` EC2 returns from a botocore ``before-call`` hook
on the one operation, while every other call still goes to moto (cloud-apis.md §2.8).
"""

from __future__ import annotations

import base64
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spotopt.checkpoints import Location, grant_lease, read_finished, read_heartbeat
from spotopt.cloud_calls import MissingCredentials, Retry
from spotopt.clouds.aws.provider import AwsProvider, client_token, state_of
from spotopt.clouds.common.base import DATABASE_TAG, Billing, InstanceState, LaunchSpec
from spotopt.clouds.registry import get_provider
from spotopt.errors import CapacityUnavailableError, ConfigError, ProviderError
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind
from tests.fake_ec2 import FAKE_CREDENTIALS, DocumentedEc2, LocalEc2, moto_ec2, reset_ec2
from tests.fake_metadata import FakeMetadata, metadata
from tests.provider_contract import ProviderContract, wait_for
from tests.stores import moto_s3

__all__ = ["metadata", "moto_ec2", "moto_s3"]  # the fixtures, imported for pytest

SPOT = MarketKey("aws", "us-east-1", "us-east-1b", "g5.xlarge", MarketKind.SPOT)
ON_DEMAND = MarketKey("aws", "us-west-2", "us-west-2a", "g5.xlarge", MarketKind.ON_DEMAND)
PROFILE = "spotopt-job"
TRAIN = Path(__file__).resolve().parents[1] / "data" / "examples" / "train_numpy.py"
SLEEP = (sys.executable, "-c", "import time; time.sleep(60)")


def _settings(endpoint: str, workdir: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "aws_image_id": "ami-03cf127a",
        "aws_instance_profile": PROFILE,
        "aws_endpoint_url": endpoint,
        "bootstrap_venv": sys.prefix,  # this virtualenv: spotopt is already installed in it
        "bootstrap_install": False,
        "bootstrap_workdir": str(workdir),
        "bootstrap_shutdown": False,  # LocalEc2 plays the power-off when the script ends
    }
    return Settings(**(values | overrides))


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def session(aws_env: None, moto_ec2: str) -> Any:
    import boto3

    reset_ec2()
    made = boto3.Session(region_name="us-east-1")
    iam = made.client("iam", endpoint_url=moto_ec2)
    if not iam.list_instance_profiles()["InstanceProfiles"]:
        iam.create_instance_profile(InstanceProfileName=PROFILE)
    return made


@pytest.fixture
def machines(tmp_path: Path, session: Any) -> Iterator[LocalEc2]:
    made = LocalEc2(tmp_path / "machines", grace_s=5.0)
    made.attach(session)
    yield made
    made.close()


@pytest.fixture
def provider(moto_ec2: str, session: Any, machines: LocalEc2, tmp_path: Path) -> AwsProvider:
    retry = Retry(sleep=lambda s: None)
    return AwsProvider(_settings(moto_ec2, tmp_path), regions=["us-east-1"], session=session, retry=retry)


@pytest.fixture
def market() -> MarketKey:
    return SPOT


class TestAwsProviderContract(ProviderContract):
    pass


def _spec(command: tuple[str, ...] = SLEEP, cap: float | None = None, **tags: str) -> LaunchSpec:
    return LaunchSpec("j1", 7, command, "s3://bucket/ckpt", tags=tags, max_usd_per_instance_hour=cap)


def _ec2(provider: AwsProvider, region: str = "us-east-1") -> Any:
    return provider.clients.ec2(region)


def _raw(provider: AwsProvider, instance_id: str) -> dict[str, Any]:
    ec2_id, region = instance_id.split("@")
    reply = _ec2(provider, region).describe_instances(InstanceIds=[ec2_id])
    instance: dict[str, Any] = reply["Reservations"][0]["Instances"][0]
    return instance


def _fail_once(provider: AwsProvider, operation: str, code: str, times: int = 1) -> list[str]:
    """Raise EC2's ``code`` from the next ``times`` calls of ``operation``; later calls reach moto."""
    from botocore.exceptions import ClientError

    calls: list[str] = []

    def fail(**_: Any) -> None:
        calls.append(code)
        if len(calls) <= times:
            error = {"Error": {"Code": code, "Message": f"simulated {code}"}}
            raise ClientError(error, operation)  # type: ignore[arg-type]

    _ec2(provider).meta.events.register(f"before-call.ec2.{operation}", fail)
    return calls


def _sent(provider: AwsProvider, operation: str, region: str = "us-east-1") -> list[dict[str, Any]]:
    """The query parameters of every ``operation`` call, as they go on the wire (EC2 is a query
    API: ``{"InstanceMarketOptions.SpotOptions.MaxPrice": "2.5", ...}``); moto keeps no MaxPrice."""
    sent: list[dict[str, Any]] = []

    def record(params: dict[str, Any], **_: Any) -> None:
        sent.append(dict(params["body"]))

    _ec2(provider, region).meta.events.register(f"before-call.ec2.{operation}", record)
    return sent


MAX_PRICE = "InstanceMarketOptions.SpotOptions.MaxPrice"


def test_launch_sends_spot_options_tags_user_data_and_the_zone(provider: AwsProvider) -> None:
    instance = provider.launch(_spec(team="ml", move="m-3"), SPOT, "j1-e7")
    raw = _raw(provider, instance.instance_id)
    assert raw["InstanceLifecycle"] == "spot"
    assert raw["Placement"]["AvailabilityZone"] == "us-east-1b"
    assert raw["InstanceType"] == "g5.xlarge"
    assert raw["ClientToken"] == "j1-e7"
    assert raw["IamInstanceProfile"]["Arn"].endswith(f"instance-profile/{PROFILE}")
    assert raw["MetadataOptions"]["HttpTokens"] == "required"
    # a container is one more hop: with the default of 1 its IMDSv2 token never arrives
    assert raw["MetadataOptions"]["HttpPutResponseHopLimit"] == 2
    tags = {t["Key"]: t["Value"] for t in raw["Tags"]}
    assert tags == {
        "spotopt:job": "j1",
        "spotopt:epoch": "7",
        "spotopt:key": "j1-e7",
        "spotopt:move": "m-3",
        "spotopt:market": "aws/us-east-1/us-east-1b/g5.xlarge/spot",
        "spotopt:tags": '{"move": "m-3", "team": "ml"}',
        "team": "ml",
        "move": "m-3",
    }
    ec2_id = instance.instance_id.split("@")[0]
    attribute = _ec2(provider).describe_instance_attribute(InstanceId=ec2_id, Attribute="userData")
    script = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert script.startswith("#!/bin/bash\n") and "export SPOTOPT_JOB=j1\n" in script
    assert "export SPOTOPT_CLOUD=aws\n" in script and "AWS_SECRET" not in script
    behaviour = _ec2(provider).describe_instance_attribute(
        InstanceId=ec2_id, Attribute="instanceInitiatedShutdownBehavior"
    )
    assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    assert instance.tags == {"team": "ml", "move": "m-3"}
    assert instance.instance_id.endswith("@us-east-1") and instance.instance_id.startswith("i-")


def test_on_demand_has_no_market_options_and_lands_in_its_region(provider: AwsProvider) -> None:
    instance = provider.launch(_spec(), ON_DEMAND, "j1-od")
    raw = _raw(provider, instance.instance_id)
    assert "InstanceLifecycle" not in raw
    assert raw["Placement"]["AvailabilityZone"] == "us-west-2a"
    assert instance.instance_id.endswith("@us-west-2")
    assert provider.list_instances(job="j1") == [instance]  # the launch region is now listed


def test_a_capped_spot_launch_carries_max_price_rounded_down(provider: AwsProvider) -> None:
    sent = _sent(provider, "RunInstances")
    instance = provider.launch(_spec(cap=2 / 3), SPOT, "j1-capped")
    (body,) = sent
    assert body[MAX_PRICE] == "0.66666"  # never above the cap: 0.66667 would be
    assert body["InstanceMarketOptions.MarketType"] == "spot"
    assert body["InstanceMarketOptions.SpotOptions.SpotInstanceType"] == "one-time"
    assert _raw(provider, instance.instance_id)["InstanceLifecycle"] == "spot"
    provider.launch(_spec(cap=12.0), SPOT, "j1-capped-12")
    assert sent[1][MAX_PRICE] == "12.00000"


def test_no_cap_no_max_price_and_on_demand_never_carries_one(provider: AwsProvider) -> None:
    sent = _sent(provider, "RunInstances")
    provider.launch(_spec(), SPOT, "j1-uncapped")
    (body,) = sent
    assert body["InstanceMarketOptions.MarketType"] == "spot" and MAX_PRICE not in body
    on_demand = _sent(provider, "RunInstances", ON_DEMAND.region)
    instance = provider.launch(_spec(cap=2.5), ON_DEMAND, "j1-od-capped")
    (body,) = on_demand
    assert not any(k.startswith("InstanceMarketOptions") for k in body), body
    assert "InstanceLifecycle" not in _raw(provider, instance.instance_id)


def test_a_cap_below_the_spot_price_is_capacity_unavailable(provider: AwsProvider) -> None:
    """EC2 refuses a ``MaxPrice`` under the current spot price with ``SpotMaxPriceTooLow``: the
    market is out of reach for this job now, the planner's next market is tried."""
    sent = _sent(provider, "RunInstances")
    _fail_once(provider, "RunInstances", "SpotMaxPriceTooLow")
    with pytest.raises(CapacityUnavailableError, match=r"spot: no capacity \(SpotMaxPriceTooLow\)") as caught:
        provider.launch(_spec(cap=0.05), SPOT, "j1-too-low")
    assert "aws/us-east-1: ec2.run_instances failed" in str(caught.value)
    assert [b[MAX_PRICE] for b in sent] == ["0.05000"]  # refused once, never retried
    assert provider.list_instances(job="j1") == []


def test_one_key_launches_one_instance_and_terminate_twice_is_fine(provider: AwsProvider) -> None:
    first = provider.launch(_spec(), SPOT, "j1-once")
    assert provider.launch(_spec(), SPOT, "j1-once") == first
    reply = _ec2(provider).describe_instances(Filters=[{"Name": "tag:spotopt:key", "Values": ["j1-once"]}])
    assert sum(len(r["Instances"]) for r in reply["Reservations"]) == 1
    assert provider.terminate(first.instance_id).state is InstanceState.TERMINATED
    assert provider.terminate(first.instance_id).state is InstanceState.TERMINATED
    assert _raw(provider, first.instance_id)["State"]["Name"] == "terminated"


def test_a_long_key_becomes_a_stable_64_character_client_token(provider: AwsProvider) -> None:
    key = "job-" + "x" * 100
    assert client_token(key) == client_token(key) and len(client_token(key)) == 64
    assert client_token("é") != "é" and client_token("short") == "short"
    instance = provider.launch(_spec(), SPOT, key)
    raw = _raw(provider, instance.instance_id)
    assert raw["ClientToken"] == client_token(key)
    assert instance.idempotency_key == key and provider.launch(_spec(), SPOT, key) == instance


@pytest.mark.parametrize(
    "code",
    [
        "InsufficientInstanceCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "Unsupported",
        "InsufficientCapacity",
        "UnfulfillableCapacity",
    ],
)
def test_capacity_and_price_errors_are_capacity_unavailable(provider: AwsProvider, code: str) -> None:
    _fail_once(provider, "RunInstances", code)
    with pytest.raises(CapacityUnavailableError, match=rf"aws/us-east-1/us-east-1b/g5.xlarge/spot.*{code}"):
        provider.launch(_spec(), SPOT, "j1-cap")
    assert provider.list_instances(job="j1") == []


def test_throttling_is_retried_and_other_errors_name_the_call(provider: AwsProvider) -> None:
    calls = _fail_once(provider, "RunInstances", "RequestLimitExceeded", times=2)
    instance = provider.launch(_spec(), SPOT, "j1-throttled")
    assert len(calls) == 3 and provider.status(instance.instance_id).state.is_live
    _fail_once(provider, "RunInstances", "InvalidParameterValue")
    bad = r"^aws/us-east-1: ec2\.run_instances failed: .*\(InvalidParameterValue\).*: simulated Invalid"
    with pytest.raises(ProviderError, match=bad) as caught:
        provider.launch(_spec(), SPOT, "j1-bad")
    assert not isinstance(caught.value, CapacityUnavailableError)


def test_reconcile_finds_an_instance_launched_by_another_provider_object(
    provider: AwsProvider, moto_ec2: str, session: Any, tmp_path: Path
) -> None:
    instance = provider.launch(_spec(team="ml"), SPOT, "j1-crash")
    # the daemon crashed after the launch; a new process builds a new provider
    restarted = AwsProvider(_settings(moto_ec2, tmp_path), regions=["us-east-1"], session=session)
    assert restarted.list_instances(job="j1") == [instance]
    assert restarted.list_instances(tags={"team": "ml"}) == [instance]
    assert restarted.list_instances(job="other") == []
    assert restarted.status(instance.instance_id).state is InstanceState.RUNNING
    assert restarted.launch(_spec(team="ml"), SPOT, "j1-crash") == instance


def test_foreign_and_malformed_ids_are_gone_and_never_terminated(provider: AwsProvider) -> None:
    ec2 = _ec2(provider)
    foreign = ec2.run_instances(ImageId="ami-03cf127a", InstanceType="t3.micro", MinCount=1, MaxCount=1)
    foreign_id = foreign["Instances"][0]["InstanceId"] + "@us-east-1"
    assert provider.terminate(foreign_id).state is InstanceState.GONE
    assert _raw(provider, foreign_id)["State"]["Name"] == "running"
    assert foreign_id not in {i.instance_id for i in provider.list_instances()}
    for unknown in ("i-0123456789abcdef0@us-east-1", "i-nope@us-east-1", "i-0123", "local-1"):
        assert provider.status(unknown).state is InstanceState.GONE
        assert provider.terminate(unknown).state is InstanceState.GONE


def test_a_spot_interruption_is_preempted(provider: AwsProvider, machines: LocalEc2) -> None:
    instance = provider.launch(_spec(), SPOT, "j1-preempt")
    ec2_id = instance.instance_id.split("@")[0]
    machines.wait_started(ec2_id)
    machines.preempt(ec2_id)
    status = provider.status(instance.instance_id)
    assert status.state is InstanceState.PREEMPTED and "Spot" in status.detail
    assert provider.terminate(instance.instance_id).state is InstanceState.PREEMPTED


@pytest.mark.parametrize(
    ("ec2_state", "reason", "expected"),
    [
        ("pending", "", InstanceState.PENDING),
        ("running", "", InstanceState.RUNNING),
        ("shutting-down", "Server.SpotInstanceTermination", InstanceState.PREEMPTED),
        ("terminated", "Server.SpotInstanceTermination", InstanceState.PREEMPTED),
        ("terminated", "Server.InternalError", InstanceState.PREEMPTED),
        ("terminated", "Client.InstanceInitiatedShutdown", InstanceState.EXITED),
        ("terminated", "Client.UserInitiatedShutdown", InstanceState.TERMINATED),
        ("stopped", "Client.UserInitiatedShutdown", InstanceState.EXITED),
    ],
)
def test_ec2_states_map_to_provider_states(ec2_state: str, reason: str, expected: InstanceState) -> None:
    assert state_of(ec2_state, reason) is expected


def test_missing_settings_are_named_before_any_call(tmp_path: Path, aws_env: None) -> None:
    retry = Retry(sleep=lambda s: None)
    unreachable = "http://127.0.0.1:9"  # a call would fail loudly, not name the setting
    for missing, variable in (
        ("aws_image_id", "SPOTOPT_AWS_IMAGE_ID"),
        ("aws_instance_profile", "SPOTOPT_AWS_INSTANCE_PROFILE"),
    ):
        settings = _settings(unreachable, tmp_path, **{missing: " "})
        provider = AwsProvider(settings, retry=retry)
        with pytest.raises(ConfigError, match=f"^{missing} is not set: set {variable} to "):
            provider.launch(_spec(), SPOT, "k")


def test_missing_credentials_say_which_cloud_and_what_to_configure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    session = boto3.Session(region_name="us-east-1")
    provider = AwsProvider(_settings("http://127.0.0.1:9", tmp_path), session=session)
    with pytest.raises(MissingCredentials, match=r"aws.*configure AWS credentials"):
        provider.launch(_spec(), SPOT, "k")


def test_the_registry_builds_aws(tmp_path: Path) -> None:
    made = get_provider("aws", settings=_settings("http://127.0.0.1:9", tmp_path))
    assert isinstance(made, AwsProvider) and made.name == "aws"


def test_an_instance_whose_job_ends_is_exited(provider: AwsProvider, machines: LocalEc2) -> None:
    script = (sys.executable, "-c", "import os; print('job', os.environ['SPOTOPT_JOB'], os.getcwd())")
    instance = provider.launch(_spec(script), SPOT, "j1-ends")
    wait_for(provider, instance.instance_id, {InstanceState.EXITED})
    log = machines.log(instance.instance_id.split("@")[0])
    assert f"job j1 {provider.settings.bootstrap_workdir}" in log
    assert "spotopt: job exited with status 0" in log


def test_a_preempted_spot_job_resumes_on_the_next_instance_and_finishes(
    provider: AwsProvider, machines: LocalEc2, metadata: FakeMetadata, tmp_path: Path
) -> None:
    """The whole AWS path: user data → agent → IMDS notice → checkpoint → spot interruption →
    a new placement (new epoch, new key) resumes from it and finishes; the first ends PREEMPTED,
    the second EXITED (its script ended, as the power-off would end a real instance)."""
    store = f"file://{tmp_path / 'store'}"
    loc = Location(store)
    log = tmp_path / "steps.log"
    env = {
        "SPOTOPT_AWS_METADATA_URL": metadata.url,
        "SPOTOPT_POLL_EVERY": "0.1s",
        "SPOTOPT_HEARTBEAT_EVERY": "0.1s",
    }
    instances = []
    total = 1_000_000  # the first placement never ends by itself: only the notice stops it
    for delay in ("0.01", "0"):
        lease = grant_lease(loc, "trainer", datetime.now(UTC))
        command = ("python", str(TRAIN), "--steps", str(total), "--log", str(log), "--step-delay", delay)
        spec = LaunchSpec("trainer", lease.epoch, command, store, checkpoint_every_s=3600.0, env=env)
        instance = provider.launch(spec, SPOT, f"trainer-e{lease.epoch}")
        instances.append(instance)
        if len(instances) == 1:
            ec2_id = instance.instance_id.split("@")[0]
            deadline = time.monotonic() + 60
            while (beat := read_heartbeat(loc, "trainer", lease.epoch)) is None or beat.step < 20:
                assert time.monotonic() < deadline, machines.log(ec2_id)
                time.sleep(0.05)
            metadata.notify("aws")  # the two-minute warning: the agent checkpoints and stops
            assert machines.procs[ec2_id].wait(timeout=60) == 0, machines.log(ec2_id)
            metadata.aws_action = None  # the next instance has no notice pending
            machines.preempt(ec2_id)
            stopped = read_heartbeat(loc, "trainer", lease.epoch)
            assert stopped is not None and stopped.last_checkpoint_step is not None
            total = stopped.last_checkpoint_step + 50
    wait_for(provider, instances[1].instance_id, {InstanceState.EXITED}, timeout_s=60)
    assert provider.status(instances[0].instance_id).state is InstanceState.PREEMPTED
    # every step once: the second instance resumed exactly where the notice's checkpoint was
    assert [int(line.split()[0]) for line in log.read_text().splitlines()] == list(range(1, total + 1))
    finished = read_finished(loc, "trainer")
    assert finished is not None and finished["epoch"] == 2 and finished["step"] == total
    # EC2's LaunchTime has one-second resolution: two launches in the same second list in id order.
    assert sorted(i.epoch for i in provider.list_instances(job="trainer")) == [1, 2]


def test_a_foreign_market_or_an_overlong_key_is_refused(tmp_path: Path, aws_env: None) -> None:
    provider = AwsProvider(_settings("http://127.0.0.1:9", tmp_path), retry=Retry(sleep=lambda s: None))
    gcp = MarketKey("gcp", "us-central1", "us-central1-a", "g2-standard-4", MarketKind.SPOT)
    with pytest.raises(ProviderError, match="is not an AWS market"):
        provider.launch(_spec(), gcp, "k")
    with pytest.raises(ProviderError, match="idempotency key longer than 256"):
        provider.launch(_spec(), SPOT, "k" * 257)


# -- what the EC2 documentation says, played by tests.fake_ec2.DocumentedEc2 -----------------------


@pytest.fixture
def documented(session: Any) -> DocumentedEc2:
    """Attached before ``provider`` builds its clients (pytest builds this fixture first)."""
    made = DocumentedEc2()
    made.attach(session)
    return made


def test_an_instance_not_yet_visible_after_its_launch_is_pending_not_gone(
    documented: DocumentedEc2, provider: AwsProvider
) -> None:
    """EC2 eventual consistency: right after RunInstances, DescribeInstances may answer
    InvalidInstanceID.NotFound for the new id; that is no reason to take it for gone (the
    executor asks for the status straight after the launch)."""
    instance = provider.launch(_spec(), SPOT, "j1-fresh")
    status = provider.status(instance.instance_id)
    assert status.state is InstanceState.PENDING and "eventual consistency" in status.detail
    assert provider.status(instance.instance_id).state is InstanceState.RUNNING  # visible now


def test_a_restarted_daemon_looks_again_before_it_calls_an_unseen_instance_gone(
    documented: DocumentedEc2, provider: AwsProvider, moto_ec2: str, session: Any, tmp_path: Path
) -> None:
    instance = provider.launch(_spec(), SPOT, "j1-restart")
    restarted = AwsProvider(_settings(moto_ec2, tmp_path), session=session, retry=Retry(sleep=lambda s: None))
    assert restarted.status(instance.instance_id).state is InstanceState.RUNNING  # NotFound, then found


def test_terminate_is_called_even_when_describe_does_not_show_the_instance_yet(
    documented: DocumentedEc2, provider: AwsProvider
) -> None:
    instance = provider.launch(_spec(), SPOT, "j1-unseen")
    assert provider.terminate(instance.instance_id).state is InstanceState.TERMINATED
    assert _raw(provider, instance.instance_id)["State"]["Name"] == "terminated"


def test_insufficient_capacity_comes_as_http_500_and_is_not_retried(
    documented: DocumentedEc2, provider: AwsProvider
) -> None:
    """EC2 sends InsufficientInstanceCapacity as a server error (HTTP 500): capacity at once, the
    planner's next market, not five transient retries that may even launch after all."""
    documented.fail_next.append("InsufficientInstanceCapacity")
    with pytest.raises(CapacityUnavailableError, match=r"InsufficientInstanceCapacity"):
        provider.launch(_spec(), SPOT, "j1-500")
    assert documented.launched == 0  # a retry would have launched: the error came only once
    assert provider.list_instances(job="j1") == []


def test_a_launch_whose_answer_was_lost_is_found_again_through_its_client_token(
    documented: DocumentedEc2, provider: AwsProvider
) -> None:
    documented.lose_next = 1  # EC2 launched it, the 500 InternalError hid the answer
    instance = provider.launch(_spec(), SPOT, "j1-lost")
    assert provider.launch(_spec(), SPOT, "j1-lost") == instance
    assert documented.launched == 1


def test_instance_tags_are_the_spec_s_so_the_sweep_can_find_them(provider: AwsProvider) -> None:
    """The daemon's launches carry ``spotopt:*`` tags of their own (job, epoch, move, the
    database id): they come back as given, and ``list_instances`` filters on them."""
    tags = {"spotopt:job": "j1", DATABASE_TAG: "db-1", "team": "ml"}
    instance = provider.launch(_spec(**tags), SPOT, "j1-tags")
    assert instance.tags == tags
    assert provider.list_instances(tags={DATABASE_TAG: "db-1"}) == [instance]
    assert provider.list_instances(tags={DATABASE_TAG: "db-2"}) == []


def test_a_stopped_instance_bills_its_volumes_until_terminate_ends_it(provider: AwsProvider) -> None:
    instance = provider.launch(_spec(), SPOT, "j1-stopped")
    _ec2(provider).stop_instances(InstanceIds=[instance.instance_id.split("@")[0]])
    status = provider.status(instance.instance_id)
    assert (status.state, status.billing) == (InstanceState.EXITED, Billing.STORAGE)
    ended = provider.terminate(instance.instance_id)
    assert (ended.state, ended.billing) == (InstanceState.EXITED, Billing.NONE)
    assert _raw(provider, instance.instance_id)["State"]["Name"] == "terminated"
    assert provider.status(instance.instance_id).billing is Billing.NONE
