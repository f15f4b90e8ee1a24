"""Each cloud's notice poller against a fake metadata service that answers as the cloud's document
says (issue 21, finding 12): Azure events for other VMs ignored and every event that ends this VM
seen; GCP's ``maintenance-event``; AWS's expired token renewed; throttling, server errors and
refused requests raised (never read as "no notice"); a service that hangs bounded by the
poller's timeout. The agent logging such an error and going on with its round is
``tests/test_agent.py``'s."""

from __future__ import annotations

import pytest

from spotopt.clouds.aws.notices import AwsImdsPoller
from spotopt.clouds.azure.notices import AzureScheduledEventsPoller
from spotopt.clouds.common.notices import (
    MetadataError,
    NoticeKind,
)
from spotopt.clouds.gcp.notices import GcpMetadataPoller
from tests.fake_metadata import FakeMetadata, metadata

__all__ = ["metadata"]

SCHEDULED_EVENTS = "/metadata/scheduledevents?api-version=2020-07-01"
HANG_S = 1.0
TIMEOUT_S = 0.1


def _event(kind: str, resources: list[str], status: str = "Scheduled") -> dict[str, object]:
    """One Scheduled Events entry, shaped as the document's example answer."""
    return {
        "EventId": f"{kind}-{'-'.join(resources)}",
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": resources,
        "EventStatus": status,
        "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT" if status == "Scheduled" else "",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def test_azure_ignores_other_vms_events_and_freeze(metadata: FakeMetadata) -> None:
    poller = AzureScheduledEventsPoller(metadata.url)
    metadata.azure_events = [
        _event("Preempt", ["vm-2", "vm-3"]),
        _event("Reboot", ["vm-4"]),
        _event("Freeze", ["vm"]),
    ]
    assert poller.poll() is None
    metadata.azure_events.append(_event("Preempt", ["vm-2", "vm"]))
    notice = poller.poll()
    assert notice is not None and notice.kind is NoticeKind.PREEMPT
    assert notice.detail == "Preempt (Scheduled) not before Mon, 19 Sep 2016 18:29:47 GMT"
    names = [r for r in metadata.requests if "compute/name" in r]
    assert len(names) == 1  # this VM's name is asked once


@pytest.mark.parametrize("kind", ["Reboot", "Redeploy", "Terminate"])
def test_azure_events_that_end_this_vm_stop_the_job(metadata: FakeMetadata, kind: str) -> None:
    poller = AzureScheduledEventsPoller(metadata.url)
    metadata.azure_events = [_event(kind, ["vm"], status="Started")]
    notice = poller.poll()
    assert notice is not None and notice.kind is NoticeKind.PREEMPT
    assert notice.detail == f"{kind} (Started) not before now"


@pytest.mark.parametrize("status", [400, 500])
def test_azure_errors_are_errors_not_no_notice(metadata: FakeMetadata, status: int) -> None:
    metadata.answer[SCHEDULED_EVENTS] = status
    with pytest.raises(MetadataError, match=f"azure metadata scheduledevents answered HTTP {status}"):
        AzureScheduledEventsPoller(metadata.url).poll()


def test_gcp_maintenance_events(metadata: FakeMetadata) -> None:
    poller = GcpMetadataPoller(metadata.url)
    assert poller.poll() is None  # preempted FALSE, maintenance-event NONE
    metadata.gcp_maintenance = "MIGRATE_ON_HOST_MAINTENANCE"
    migrate = poller.poll()
    assert migrate is not None and migrate.kind is NoticeKind.REBALANCE  # a checkpoint, training goes on
    metadata.gcp_maintenance = "TERMINATE_ON_HOST_MAINTENANCE"
    stop = poller.poll()
    assert stop is not None and stop.kind is NoticeKind.PREEMPT
    assert stop.detail == "instance/maintenance-event is TERMINATE_ON_HOST_MAINTENANCE"
    metadata.gcp_preempted = True
    preempted = poller.poll()
    assert preempted is not None and preempted.detail == "instance/preempted is TRUE"
    metadata.answer["/computeMetadata/v1/instance/maintenance-event"] = 503
    metadata.gcp_preempted = False
    with pytest.raises(MetadataError, match="gcp metadata maintenance-event answered HTTP 503"):
        poller.poll()


def test_aws_renews_an_expired_token(metadata: FakeMetadata) -> None:
    poller = AwsImdsPoller(metadata.url)
    assert poller.poll() is None
    metadata.expire_token()
    metadata.notify("aws")
    notice = poller.poll()
    assert notice is not None and notice.kind is NoticeKind.PREEMPT
    assert [r for r in metadata.requests if r.startswith("PUT")] == ["PUT /latest/api/token"] * 2


@pytest.mark.parametrize("status", [401, 429, 500, 503])
def test_aws_errors_are_errors_not_no_notice(metadata: FakeMetadata, status: int) -> None:
    # 401: even with a fresh token (the token is not the trouble); 429: throttled; 5xx: IMDS trouble.
    metadata.answer["/latest/meta-data/spot/instance-action"] = status
    with pytest.raises(MetadataError, match=f"/spot/instance-action answered HTTP {status}"):
        AwsImdsPoller(metadata.url).poll()


def test_aws_a_refused_token_put_is_an_error(metadata: FakeMetadata) -> None:
    metadata.answer["/latest/api/token"] = 403  # IMDS turned off for the instance
    with pytest.raises(MetadataError, match="aws metadata token PUT answered HTTP 403"):
        AwsImdsPoller(metadata.url).poll()


@pytest.mark.parametrize("cloud", ["aws", "gcp", "azure"])
def test_a_poll_that_hangs_is_bounded_by_its_timeout(metadata: FakeMetadata, cloud: str) -> None:
    # The AWS token PUT beyond a container's hop limit, Azure's first call (up to two minutes).
    pollers = {"aws": AwsImdsPoller, "gcp": GcpMetadataPoller, "azure": AzureScheduledEventsPoller}
    metadata.hang_s = HANG_S
    with pytest.raises(OSError, match="timed out"):
        pollers[cloud](metadata.url, timeout_s=TIMEOUT_S).poll()
