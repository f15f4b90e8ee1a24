"""The ``aws`` provider: one EC2 instance per placement, spot (one-time) or on-demand.

What it relies on from the EC2 API reference and the boto3 docs (read through the docs search;
offline behaviour checked against moto 5.2.5, see /work/shared/notes/cloud-apis.md §2.5–2.8):

- ``RunInstances``: ``InstanceMarketOptions={"MarketType": "spot", "SpotOptions":
  {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}``, plus
  ``"MaxPrice"`` when the job has a ``max_usd_per_hour`` (``LaunchSpec.max_usd_per_instance_hour``
  as ``base.price_cap`` rounds it). EC2's ``SpotMarketOptions.MaxPrice`` is a string, "the
  maximum hourly price that you're willing to pay for a Spot Instance"; without it "you will
  pay the current Spot price" up to the on-demand price, and with it "your Spot Instances will
  be interrupted more frequently" (the EC2 API reference as the SDK docs carry it: AWS SDK for
  Java ``SpotMarketOptions.setMaxPrice(String)``, aws-sdk-ec2 ``SpotMarketOptions::max_price``).
  That interruption is the point: the instance is taken back once its price passes the cap, so
  the bill never does, even between two of the daemon's budget checks. A launch while the price
  is already above it fails with ``SpotMaxPriceTooLow``: capacity unavailable. On-demand
  launches carry no market options at all. ``ClientToken``
  makes the call idempotent ("Maximum 64 ASCII characters"; a longer key is hashed).
  ``UserData`` is base64-encoded by boto3 itself and limited to 16 KB before encoding.
  ``TagSpecifications`` tag the instance (and its volumes) at creation, so an instance is never
  untagged, even for a moment. ``InstanceInitiatedShutdownBehavior="terminate"``: the start-up
  script's power-off at the end of the job terminates the instance, so it stops costing.
  ``MetadataOptions`` require IMDSv2 tokens, which the agent's notice poller uses.
- ``DescribeInstances`` filters ``tag:KEY`` (reconcile) and ids; terminated instances stay
  visible for about an hour, then the id is unknown (``InvalidInstanceID.NotFound``).
- ``TerminateInstances`` on an already terminated instance succeeds; on an unknown id it fails
  with ``InvalidInstanceID.NotFound`` (``.Malformed`` for a bad id), which is ``GONE`` here.
- ``StateReason.Code`` tells why an instance ended: ``Server.SpotInstanceTermination`` (the
  market took it back), ``Client.InstanceInitiatedShutdown`` (the job ended and the script
  powered off), ``Client.UserInitiatedShutdown`` (``terminate_instances``).

State mapping (``status``): ``pending`` → PENDING; ``running`` → RUNNING; ``shutting-down`` and
``terminated`` → PREEMPTED for ``Server.SpotInstanceTermination`` and any other ``Server.*``
reason (the cloud ended it: the daemon recovers from the checkpoint either way), EXITED for
``Client.InstanceInitiatedShutdown``, else TERMINATED; ``stopping``/``stopped`` (someone stopped
it outside spotopt: spotopt never stops instances) → EXITED with the reason in ``detail``. EC2
cannot see the job's exit status, so ``exit_code`` is always None.

Idempotency: ``launch`` first looks for an instance tagged with the key (``spotopt:key``), then
calls ``run_instances`` with ``ClientToken``. The look-up finds a placement launched before a
daemon crash even after EC2's token memory is gone; the token covers two launches racing (moto
ignores ``ClientToken``, so offline tests prove the look-up, not the token).

Instance ids are ``<EC2 id>@<region>`` (``i-0abc…@us-east-1``): EC2 ids are only found in their
region, and the daemon's journal must lead a restarted provider back to them. Only instances
carrying the ``spotopt:job`` tag are spotopt's: any other id is ``GONE`` and never terminated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from spotopt.adaptors.aws import AwsClients
from spotopt.cloud_calls import Retry, error_codes
from spotopt.errors import ProviderError
from spotopt.providers.base import (
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    market_label,
    matches,
    price_cap,
    sorted_instances,
)
from spotopt.providers.bootstrap import render_script
from spotopt.providers.calls import none_if_missing, provider_call
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind

T = TypeVar("T")

TAG_JOB, TAG_EPOCH, TAG_MOVE, TAG_KEY, TAG_MARKET = (
    "spotopt:job",
    "spotopt:epoch",
    "spotopt:move",
    "spotopt:key",
    "spotopt:market",
)
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "SpotMaxPriceTooLow",
        "MaxSpotInstanceCountExceeded",
        "Unsupported",
        "UnfulfillableCapacity",
    }
)
"""EC2 error codes that mean "not in this market now": the planner tries the next market.

From the EC2 API error-code reference: ``InsufficientCapacity`` (documented for imports, cheap
to include) and ``UnfulfillableCapacity`` ("not enough spare capacity ... for Spot Instances")
besides the four the capacity and price checks of ``RunInstances`` return."""
GONE_CODES = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})
MAX_CLIENT_TOKEN = 64
MAX_TAG_VALUE = 256
PREEMPTED_REASON = "Server.SpotInstanceTermination"
EXITED_REASON = "Client.InstanceInitiatedShutdown"


def client_token(key: str) -> str:
    """``key`` itself when EC2 accepts it as a ``ClientToken`` (≤ 64 ASCII), else a stable hash."""
    if len(key) <= MAX_CLIENT_TOKEN and key.isascii():
        return key
    return "spotopt-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[: MAX_CLIENT_TOKEN - 8]


def _capacity_code(exc: BaseException) -> str | None:
    """The ``CAPACITY_CODES`` code of an EC2 error, None for any other error."""
    return next(iter(sorted(error_codes(exc) & CAPACITY_CODES)), None)


def state_of(ec2_state: str, reason_code: str) -> InstanceState:
    """The provider state of an EC2 instance state name and ``StateReason.Code`` (module doc)."""
    if ec2_state == "pending":
        return InstanceState.PENDING
    if ec2_state == "running":
        return InstanceState.RUNNING
    if ec2_state in ("stopping", "stopped"):
        return InstanceState.EXITED
    if reason_code == PREEMPTED_REASON or reason_code.startswith("Server."):
        return InstanceState.PREEMPTED
    if reason_code == EXITED_REASON:
        return InstanceState.EXITED
    return InstanceState.TERMINATED


def split_id(instance_id: str) -> tuple[str, str] | None:
    """``i-…@region`` → (EC2 id, region); None for an id this provider never made."""
    ec2_id, at, region = instance_id.partition("@")
    return (ec2_id, region) if at and ec2_id.startswith("i-") and region else None


class AwsProvider:
    """EC2 instances for jobs; ``settings`` holds the ``aws_*`` and ``bootstrap_*`` settings.

    ``regions`` are where ``list_instances`` looks (the daemon passes the regions of its
    markets); regions this object launched in are added. ``session`` (a ``boto3.Session``) and
    ``retry`` are for tests.
    """

    name = "aws"
    runs_on_market = True

    def __init__(
        self,
        settings: Settings | None = None,
        regions: Iterable[str] = (),
        session: Any | None = None,
        retry: Retry | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.clients = AwsClients(session=session, endpoint_url=self.settings.aws_endpoint_url)
        self.retry = retry or Retry()
        self.regions = dict.fromkeys(regions)

    # -- Provider ---------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        """One instance for ``spec`` in ``market``; the same key returns the same instance."""
        image, profile = self._required()
        if market.cloud != "aws":
            raise ProviderError(f"aws provider: market {market_label(market)} is not an AWS market")
        if len(idempotency_key) > MAX_TAG_VALUE:
            raise ProviderError(f"job {spec.job}: idempotency key longer than {MAX_TAG_VALUE} characters")
        tags = self._tags(spec, market, idempotency_key)
        user_data = render_script("aws", spec, market, self.settings)
        self.regions[market.region] = None
        by_key = [{"Name": f"tag:{TAG_KEY}", "Values": [idempotency_key]}]
        found = self._describe(market.region, Filters=by_key)
        if found:
            return self._instance(found[0], market.region)
        request: dict[str, Any] = {
            "ImageId": image,
            "InstanceType": market.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": client_token(idempotency_key),
            "UserData": user_data,
            "IamInstanceProfile": {"Arn": profile} if profile.startswith("arn:") else {"Name": profile},
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "TagSpecifications": [
                {"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                for kind in ("instance", "volume")
            ],
        }
        if market.zone:
            request["Placement"] = {"AvailabilityZone": market.zone}
        if market.kind is MarketKind.SPOT:
            spot = {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}
            cap = price_cap(spec)
            if cap is not None:  # the job's hard cap (module doc)
                spot["MaxPrice"] = str(cap)
            request["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": spot}
        if self.settings.aws_subnet_id:
            request["SubnetId"] = self.settings.aws_subnet_id
        groups = [g.strip() for g in (self.settings.aws_security_group_ids or "").split(",") if g.strip()]
        if groups:
            request["SecurityGroupIds"] = groups
        if self.settings.aws_key_name:
            request["KeyName"] = self.settings.aws_key_name
        ec2 = self.clients.ec2(market.region)
        reply = provider_call(
            self.retry,
            "aws",
            "ec2.run_instances",
            lambda: ec2.run_instances(**request),
            _capacity_code,
            market_label(market),
            region=market.region,
        )
        return self._instance(reply["Instances"][0], market.region)

    def status(self, instance_id: str) -> InstanceStatus:
        parts = split_id(instance_id)
        if parts is None:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="not an aws instance id")
        ec2_id, region = parts
        found = self._describe(region, InstanceIds=[ec2_id])
        if not found:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="EC2 has no such instance")
        if not _is_ours(found[0]):
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="not a spotopt instance")
        raw = found[0]
        reason = raw.get("StateReason") or {}
        state = state_of(raw["State"]["Name"], reason.get("Code", ""))
        detail = " ".join(filter(None, [raw["State"]["Name"], reason.get("Message", "")]))
        return InstanceStatus(self._instance(raw, region), instance_id, state, None, detail)

    def terminate(self, instance_id: str) -> InstanceStatus:
        """Terminate a spotopt instance; an unknown, foreign or ended one is left alone. Idempotent."""
        current = self.status(instance_id)
        if current.state is InstanceState.GONE or current.state not in (
            InstanceState.PENDING,
            InstanceState.RUNNING,
        ):
            return current
        ec2_id, region = split_id(instance_id) or ("", "")
        ec2 = self.clients.ec2(region)
        self._call(
            "ec2.terminate_instances",
            region,
            lambda: none_if_missing(lambda: ec2.terminate_instances(InstanceIds=[ec2_id]), GONE_CODES),
        )
        return self.status(instance_id)

    def list_instances(self, job: str | None = None, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """spotopt's instances (every state EC2 still shows) in ``regions``, by job and tags."""
        filters = [{"Name": "tag-key", "Values": [TAG_JOB]}]
        if job is not None:
            filters.append({"Name": f"tag:{TAG_JOB}", "Values": [job]})
        filters += [{"Name": f"tag:{k}", "Values": [v]} for k, v in (tags or {}).items()]
        found = []
        for region in self.regions or [self.clients.home_region()]:
            for raw in self._describe(region, Filters=filters):
                instance = self._instance(raw, region)
                if matches(instance, job, tags):
                    found.append(instance)
        return sorted_instances(found)

    def check(self) -> None:
        """The settings ``launch`` needs and credentials, checked without an API call:
        ``ConfigError`` naming the setting or ``MissingCredentials`` saying what to configure."""
        self._required()
        self.clients.home_region()  # builds the session: no credentials → MissingCredentials

    # -- internals -----------------------------------------------------------------------------

    def _required(self) -> tuple[str, str]:
        """The image and instance profile (ConfigError naming the setting when unset)."""
        image = self.settings.require("aws_image_id", "an AMI id (ami-…) or resolve:ssm:/PARAMETER")
        profile = self.settings.require(
            "aws_instance_profile", "the instance profile (name or ARN) whose role reaches the store"
        )
        return image, profile

    @staticmethod
    def _tags(spec: LaunchSpec, market: MarketKey, key: str) -> dict[str, str]:
        tags = {
            **spec.tags,
            TAG_JOB: spec.job,
            TAG_EPOCH: str(spec.epoch),
            TAG_KEY: key,
            TAG_MARKET: market_label(market),
        }
        if "move" in spec.tags:
            tags[TAG_MOVE] = spec.tags["move"]
        return tags

    def _call(self, api: str, region: str, fn: Callable[[], T]) -> T:
        """``provider_call`` for an EC2 call in ``region`` (named in its errors)."""
        return provider_call(self.retry, "aws", api, fn, region=region)

    def _describe(self, region: str, **args: Any) -> list[dict[str, Any]]:
        """The instances ``describe_instances(**args)`` finds; none for an id EC2 does not know."""
        ec2 = self.clients.ec2(region)

        def pages() -> list[dict[str, Any]]:
            found: list[dict[str, Any]] = []
            for page in ec2.get_paginator("describe_instances").paginate(**args):
                found += [i for r in page["Reservations"] for i in r["Instances"]]
            return found

        return self._call("ec2.describe_instances", region, lambda: none_if_missing(pages, GONE_CODES) or [])

    def _instance(self, raw: Mapping[str, Any], region: str) -> Instance:
        tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
        launched = raw["LaunchTime"]
        return Instance(
            instance_id=f"{raw['InstanceId']}@{region}",
            provider=self.name,
            job=tags.get(TAG_JOB, ""),
            epoch=int(tags.get(TAG_EPOCH, "0")),
            market=tags.get(TAG_MARKET, ""),
            idempotency_key=tags.get(TAG_KEY, ""),
            launched_at=launched.astimezone(UTC) if isinstance(launched, datetime) else launched,
            tags={k: v for k, v in tags.items() if not k.startswith("spotopt:")},
        )


def _is_ours(raw: Mapping[str, Any]) -> bool:
    return any(t["Key"] == TAG_JOB for t in raw.get("Tags", []))
