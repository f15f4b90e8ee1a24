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
  ``MetadataOptions`` require IMDSv2 tokens (``HttpTokens=required``), which the agent's notice
  poller uses, with ``HttpPutResponseHopLimit=2``: the token's PUT response must survive the
  extra network hop of a container, and "if HTTP tokens are required, container [workloads]
  need a minimum of two hops" (``InstanceMetadataOptions.HttpPutResponseHopLimit``, AWS SDK
  references; the default is one hop, and a job in a container then never gets a token).
- ``DescribeInstances`` filters ``tag:KEY`` (reconcile) and ids; terminated instances stay
  visible for about an hour, then the id is unknown (``InvalidInstanceID.NotFound``).
- Eventual consistency (EC2 Developer Guide, "Eventual consistency in the Amazon EC2 API"):
  right after ``RunInstances`` another call with the new id "might return an
  InvalidInstanceID.NotFound error. This doesn't mean the instance doesn't exist"; describe it
  again "using an exponential backoff algorithm", "up to a few minutes". So an id this object
  launched less than ``FRESH_S`` ago and not yet visible is ``PENDING``, and any other id is
  ``GONE`` only after ``NOT_FOUND_CHECKS`` more looks with the retry's backoff. The same page:
  a NotFound from ``TerminateInstances`` "doesn't mean the instance was or will be terminated".
- ``TerminateInstances`` is idempotent by default (EC2 Developer Guide, "Ensuring idempotency");
  on an unknown id it fails with ``InvalidInstanceID.NotFound`` (``.Malformed`` for a bad id).
- ``ClientToken`` (same guide): a repeated ``RunInstances`` with the same token and parameters
  returns the original result and launches nothing; the token stays valid for at least 24 hours
  after the instance's termination.
- Errors: ``InsufficientInstanceCapacity`` is one of EC2's *server* error codes (HTTP 500, EC2
  API Reference, "Error codes"): it is recognised as a capacity shortfall before any retry.
- ``StateReason.Code`` tells why an instance ended: ``Server.SpotInstanceTermination`` (the
  market took it back), ``Client.InstanceInitiatedShutdown`` (the job ended and the script
  powered off), ``Client.UserInitiatedShutdown`` (``terminate_instances``).
- Billing (EC2 User Guide, "Amazon EC2 instance state changes"): a ``stopped`` instance is not
  billed but its EBS volumes are; ``shutting-down`` and ``terminated`` are not billed, and the
  root volume is deleted on termination.

State mapping (``status``): ``pending`` → PENDING; ``running`` → RUNNING; ``shutting-down`` and
``terminated`` → PREEMPTED for ``Server.SpotInstanceTermination`` and any other ``Server.*``
reason (the cloud ended it: the daemon recovers from the checkpoint either way), EXITED for
``Client.InstanceInitiatedShutdown``, else TERMINATED; ``stopping``/``stopped`` (someone stopped
it outside spotopt: spotopt never stops instances) → EXITED with the reason in ``detail``. EC2
cannot see the job's exit status, so ``exit_code`` is always None.

Idempotency: ``launch`` first looks for an instance tagged with the key (``spotopt:key``), then
calls ``run_instances`` with ``ClientToken``. The look-up finds a placement launched before a
daemon crash even after EC2's token memory is gone; the token covers the look-up missing an
instance too new to be listed, and two launches racing (the offline EC2 of the tests honours it
as documented: ``tests/fake_ec2.py``).

Instance ids are ``<EC2 id>@<region>`` (``i-0abc…@us-east-1``): EC2 ids are only found in their
region, and the daemon's journal must lead a restarted provider back to them. Only instances
carrying the ``spotopt:job`` tag are spotopt's: any other visible id is ``GONE`` and never
terminated; an id EC2 does not show (yet) is terminated anyway, since only our own launches
hand us ids. ``Instance.tags`` are the spec's tags, kept as JSON in ``spotopt:tags`` (instances
launched before that tag existed read as their tags without the ``spotopt:`` ones).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from spotopt.cloud_calls import Retry, error_codes
from spotopt.clouds.aws.adaptor import AwsClients
from spotopt.clouds.common.base import (
    Billing,
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    market_label,
    matches,
    price_cap,
    sorted_instances,
)
from spotopt.clouds.common.bootstrap import render_script
from spotopt.clouds.common.calls import after_delete, none_if_missing, provider_call
from spotopt.errors import ProviderError
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind

T = TypeVar("T")

TAG_JOB, TAG_EPOCH, TAG_MOVE, TAG_KEY, TAG_MARKET, TAG_TAGS = (
    "spotopt:job",
    "spotopt:epoch",
    "spotopt:move",
    "spotopt:key",
    "spotopt:market",
    "spotopt:tags",
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
FRESH_S = 300.0
"""How long an id this object launched may stay invisible to other calls before it counts as
gone ("increasing gradually up to a few minutes of wait time": EC2 eventual consistency)."""
NOT_FOUND_CHECKS = 3
"""Further looks, with the retry's backoff, before an unseen id that is not fresh is ``GONE``."""
HOP_LIMIT = 2
"""``HttpPutResponseHopLimit``: the instance, plus the hop of a container network (module doc)."""
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


def leftover_of(ec2_state: str) -> Billing:
    """What an ended instance still bills: a stopped one its EBS volumes (module doc)."""
    return Billing.STORAGE if ec2_state in ("stopping", "stopped") else Billing.NONE


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
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or Settings()
        self.clients = AwsClients(session=session, endpoint_url=self.settings.aws_endpoint_url)
        self.retry = retry or Retry()
        self.regions = dict.fromkeys(regions)
        self.monotonic = monotonic
        self._fresh: dict[str, float] = {}
        """Ids this object launched → when (``monotonic``): not yet visible is not gone."""
        self._ended: dict[str, InstanceStatus] = {}
        """How instances we terminated after they ended had ended (``after_delete``)."""

    # -- Provider ---------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        """One instance for ``spec`` in ``market``; the same key returns the same instance."""
        image, profile = self._required()
        if market.cloud != "aws":
            raise ProviderError(f"aws provider: market {market_label(market)} is not an AWS market")
        if len(idempotency_key) > MAX_TAG_VALUE:
            raise ProviderError(f"job {spec.job}: idempotency key longer than {MAX_TAG_VALUE} characters")
        tags = self._tags(spec, market, idempotency_key)
        user_data = render_script(spec, market, self.settings)
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
            "MetadataOptions": {
                "HttpTokens": "required",
                "HttpEndpoint": "enabled",
                "HttpPutResponseHopLimit": HOP_LIMIT,
            },
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
        instance = self._instance(reply["Instances"][0], market.region)
        self._fresh[instance.instance_id] = self.monotonic()
        return instance

    def status(self, instance_id: str) -> InstanceStatus:
        if split_id(instance_id) is None:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="not an aws instance id")
        return self._status(instance_id, self._look(instance_id))

    def terminate(self, instance_id: str) -> InstanceStatus:
        """Terminate a spotopt instance in any state but ``shutting-down``/``terminated`` (a
        stopped one still bills its volumes); a foreign one is left alone. Idempotent.

        An id EC2 does not show is terminated anyway: it came from our own launch, and "not
        found" may only mean "not yet visible" (module doc). While such an id is fresh and the
        terminate too answers NotFound, nothing is known yet: ``ProviderError``, so the caller
        tries again later rather than take the instance for gone."""
        parts = split_id(instance_id)
        if parts is None:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="not an aws instance id")
        raw = self._look(instance_id)
        before = self._status(instance_id, raw)
        if raw is not None and (before.instance is None or before.billing is Billing.NONE):
            return before  # foreign (never terminated), or already ending and billing nothing
        ec2_id, region = parts
        ec2 = self.clients.ec2(region)
        done = self._call(
            "ec2.terminate_instances",
            region,
            lambda: none_if_missing(lambda: ec2.terminate_instances(InstanceIds=[ec2_id]), GONE_CODES),
        )
        if done is None:
            if self._is_fresh(instance_id):
                raise ProviderError(
                    f"aws/{region}: {ec2_id} was launched moments ago and EC2 does not show it yet "
                    "(eventual consistency); terminate it again later"
                )
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="EC2 has no such instance")
        self._fresh.pop(instance_id, None)
        if raw is None:  # a fresh id EC2 did not show yet but took: it was live
            return InstanceStatus(None, instance_id, InstanceState.TERMINATED, detail="terminated")
        return after_delete(before, self._ended)

    def list_instances(self, job: str | None = None, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """spotopt's instances (every state EC2 still shows) in ``regions``, by job and tags
        (an instance launched moments ago may not be listed yet: eventual consistency)."""
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
            # "EC2 allows for any character in its tags" (EC2 User Guide, "Tag restrictions"),
            # up to 256 Unicode characters a value: JSON as it is, not \u-escaped.
            TAG_TAGS: json.dumps(dict(spec.tags), sort_keys=True, ensure_ascii=False),
        }
        if "move" in spec.tags:
            tags[TAG_MOVE] = spec.tags["move"]
        for name, value in tags.items():
            if len(value) > MAX_TAG_VALUE:
                raise ProviderError(
                    f"job {spec.job}: tag {name} is {len(value)} characters; EC2 allows {MAX_TAG_VALUE}"
                )
        return tags

    def _status(self, instance_id: str, raw: Mapping[str, Any] | None) -> InstanceStatus:
        """The status of what ``_look`` found for ``instance_id`` (None: EC2 does not show it)."""
        if raw is None:
            if self._is_fresh(instance_id):
                detail = "launched, not yet visible to EC2's other calls (eventual consistency)"
                return InstanceStatus(None, instance_id, InstanceState.PENDING, detail=detail)
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="EC2 has no such instance")
        if not _is_ours(raw):
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="not a spotopt instance")
        name = raw["State"]["Name"]
        if name in ("shutting-down", "terminated") and instance_id in self._ended:
            return self._ended[instance_id]  # ended by itself, then terminated by us: how it ended
        reason = raw.get("StateReason") or {}
        state = state_of(name, reason.get("Code", ""))
        detail = " ".join(filter(None, [name, reason.get("Message", "")]))
        region = instance_id.partition("@")[2]
        return InstanceStatus(
            self._instance(raw, region), instance_id, state, None, detail, leftover_of(name)
        )

    def _is_fresh(self, instance_id: str) -> bool:
        launched = self._fresh.get(instance_id)
        return launched is not None and self.monotonic() - launched < FRESH_S

    def _look(self, instance_id: str) -> dict[str, Any] | None:
        """The instance as ``DescribeInstances`` shows it, or None when EC2 does not show it: at
        once for a fresh id (the caller knows it exists), else after ``NOT_FOUND_CHECKS`` more
        looks with the retry's backoff (module doc: eventual consistency)."""
        ec2_id, region = split_id(instance_id) or ("", "")
        checks = 0 if self._is_fresh(instance_id) else NOT_FOUND_CHECKS
        for attempt in range(checks + 1):
            found = self._describe(region, InstanceIds=[ec2_id])
            if found:
                self._fresh.pop(instance_id, None)  # visible now: the usual rules apply
                return found[0]
            if attempt < checks:
                self.retry.sleep(self.retry.delay(attempt + 1))
        return None

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
            tags=json.loads(tags[TAG_TAGS])
            if TAG_TAGS in tags
            else {k: v for k, v in tags.items() if not k.startswith("spotopt:")},
        )


def _is_ours(raw: Mapping[str, Any]) -> bool:
    return any(t["Key"] == TAG_JOB for t in raw.get("Tags", []))
