"""Offline fakes for the live collectors: scripted cloud replies built from fixture files.

AWS: a boto3 session under moto, where chosen operations answer from scripted replies through a
``before-call`` hook (moto fakes spot prices badly and lacks the pricing API and placement
scores). GCP and Azure: ``responses`` serves the SDKs' HTTP requests (both use ``requests``).
Every fake records the requests it saw so tests can check what was asked.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from azure.core.credentials import AccessToken
from botocore.awsrequest import AWSResponse
from google.auth.credentials import AnonymousCredentials

from spotopt.cloud_calls import Retry
from spotopt.clouds.aws.adaptor import AwsClients
from spotopt.clouds.azure.adaptor import AzureClients
from spotopt.clouds.gcp.adaptor import GcpClients

FIXTURES = Path(__file__).parent / "fixtures"
NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
PROJECT = "spotopt-test"
SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
CE = f"https://compute.googleapis.com/compute/v1/projects/{PROJECT}"
SKUS_URL = "https://cloudbilling.googleapis.com/v1/services/6F81-5844-456A/skus"
ARM = "https://management.azure.com"
RESOURCE_SKUS_URL = f"{ARM}/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/skus"
GRAPH_URL = f"{ARM}/providers/Microsoft.ResourceGraph/resources"
RETAIL_URL = "https://prices.azure.com/api/retail/prices"
RETAIL_NEXT_URL = "https://prices.azure.com:443/api/retail/prices"
ADVISOR_URL = "https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json"


def fixture(cloud: str, name: str) -> Any:
    return json.loads((FIXTURES / cloud / name).read_text())


class Sleeps(list[float]):
    """Records the retry sleeps instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def no_wait_retry(sleeps: Sleeps | None = None, attempts: int = 3) -> Retry:
    return Retry(attempts=attempts, sleep=sleeps if sleeps is not None else Sleeps(), rng=lambda: 0.5)


@dataclass(frozen=True)
class AwsError:
    code: str
    status: int
    message: str = ""


Reply = dict[str, Any] | AwsError


def _with_datetimes(reply: dict[str, Any]) -> dict[str, Any]:
    """botocore hands ``Timestamp`` over as a datetime; fixtures hold the CLI's ISO strings."""
    if "SpotPriceHistory" in reply:
        reply = dict(reply)
        reply["SpotPriceHistory"] = [
            {**i, "Timestamp": datetime.fromisoformat(i["Timestamp"])}
            if isinstance(i.get("Timestamp"), str) and i["Timestamp"][:1].isdigit()
            else i
            for i in reply["SpotPriceHistory"]
        ]
    return reply


class AwsFake:
    """A boto3 session (use inside ``mock_aws``) with scripted operations.

    ``script(op, *replies)`` answers the next calls of ``op`` in order (an ``AwsError`` is raised
    as a ClientError); ``answer(op, fn)`` answers every call with ``fn(params)``.
    """

    def __init__(self) -> None:
        self.session = boto3.Session(region_name="us-east-1")
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._handlers: dict[str, Callable[[dict[str, Any]], Reply]] = {}
        self.answer("ec2", "DescribeInstanceTypes", self._instance_types)

    @staticmethod
    def _instance_types(params: dict[str, Any]) -> Reply:
        page = "instance_types_page2.json" if params.get("NextToken") else "instance_types_page1.json"
        return fixture("aws", page)

    def answer(self, service: str, op: str, fn: Callable[[dict[str, Any]], Reply]) -> None:
        if op not in self._handlers:
            self.session.events.register(f"before-parameter-build.{service}.{op}", self._recorder(op))
            self.session.events.register(f"before-call.{service}.{op}", self._replier(op))
        self._handlers[op] = fn

    def script(self, service: str, op: str, *replies: Reply) -> None:
        queue = list(replies)

        def next_reply(params: dict[str, Any]) -> Reply:
            assert queue, f"unexpected extra call of {op}: {params}"
            return queue.pop(0)

        self.answer(service, op, next_reply)

    def _recorder(self, op: str) -> Callable[..., None]:
        def record(params: dict[str, Any], **kwargs: Any) -> None:
            self.requests[op].append(dict(params))

        return record

    def _replier(self, op: str) -> Callable[..., Any]:
        def reply(**kwargs: Any) -> Any:
            answer = self._handlers[op](self.requests[op][-1])
            if isinstance(answer, AwsError):
                body = {
                    "Error": {"Code": answer.code, "Message": answer.message or f"scripted {answer.code}"},
                    "ResponseMetadata": {"HTTPStatusCode": answer.status},
                }
                return AWSResponse("https://stub", answer.status, {}, None), body
            return AWSResponse("https://stub", 200, {}, None), _with_datetimes(answer)

        return reply

    def clients(self) -> AwsClients:
        return AwsClients(session=self.session)


def aws_env(monkeypatch: Any) -> None:
    """Credentials moto accepts, and no way for boto3 to find real ones."""
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/credentials",
        "AWS_CONFIG_FILE": "/nonexistent/config",
    }.items():
        monkeypatch.setenv(key, value)


def script_aws_defaults(fake: AwsFake) -> None:
    """The happy path of every scripted AWS operation, for tests about something else."""
    fake.answer(
        "ec2",
        "DescribeSpotPriceHistory",
        lambda p: fixture(
            "aws", "spot_history_page2.json" if p.get("NextToken") else "spot_history_page1.json"
        ),
    )
    fake.answer(
        "pricing",
        "GetProducts",
        lambda p: fixture("aws", "pricing_page2.json" if p.get("NextToken") else "pricing_page1.json"),
    )
    fake.answer("ec2", "GetSpotPlacementScores", lambda p: fixture("aws", "placement_scores.json"))
    fake.answer(
        "ec2",
        "DescribeRegions",
        lambda p: {"Regions": [{"RegionName": "us-east-1", "Endpoint": "ec2.us-east-1.amazonaws.com"}]},
    )


class FakeCredential:
    """azure-core's TokenCredential protocol, offline."""

    def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return AccessToken("fake-token", int(time.time()) + 3600)


def gcp_clients() -> GcpClients:
    return GcpClients(credentials=AnonymousCredentials(), project=PROJECT)


def azure_clients() -> AzureClients:
    return AzureClients(credential=FakeCredential(), subscription_id=SUBSCRIPTION)


def paged(
    first: str, second: str, cloud: str, token: str
) -> Callable[[Any], tuple[int, dict[str, str], str]]:
    """A ``responses`` callback: fixture ``second`` when the URL carries ``token``, else ``first``."""

    def reply(request: Any) -> tuple[int, dict[str, str], str]:
        return 200, {}, json.dumps(fixture(cloud, second if token in request.url else first))

    return reply


def add_gcp_defaults(rsps: Any) -> None:
    """Machine types (2 pages), accelerator types and billing SKUs (2 pages)."""
    json_type = "application/json"
    machines = paged("machine_types_page1.json", "machine_types_page2.json", "gcp", "pageToken=mt-2")
    rsps.add_callback("GET", f"{CE}/aggregated/machineTypes", callback=machines, content_type=json_type)
    rsps.get(f"{CE}/aggregated/acceleratorTypes", json=fixture("gcp", "accelerator_types.json"))
    skus = paged("skus_page1.json", "skus_page2.json", "gcp", "pageToken=sku-2")
    rsps.add_callback("GET", SKUS_URL, callback=skus, content_type=json_type)


def add_azure_defaults(rsps: Any) -> None:
    """Resource SKUs (2 pages), retail prices for eastus (2 pages), Resource Graph answers."""
    skus = paged("resource_skus_page1.json", "resource_skus_page2.json", "azure", "skiptoken=page2")
    rsps.add_callback("GET", RESOURCE_SKUS_URL, callback=skus, content_type="application/json")
    rsps.get(RETAIL_URL, json=fixture("azure", "retail_page1.json"))
    # Azure's NextPageLink names the port: https://prices.azure.com:443/api/retail/prices?…&$skip=1000
    rsps.get(RETAIL_NEXT_URL, json=fixture("azure", "retail_page2.json"))
    rsps.add_callback("POST", GRAPH_URL, callback=graph_reply, content_type="application/json")


def graph_reply(request: Any) -> tuple[int, dict[str, str], str]:
    """Resource Graph: eviction rates or price history depending on the query, paged once."""
    body = json.loads(request.body)
    name = "graph_eviction" if "skuspotevictionrate" in body["query"] else "graph_price_history"
    page = "page2" if body.get("options", {}).get("$skipToken") else "page1"
    return 200, {}, json.dumps(fixture("azure", f"{name}_{page}.json"))
