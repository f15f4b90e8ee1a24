"""Preemption notices, polled from inside the instance: AWS IMDSv2, GCP metadata, Azure Scheduled Events.

Only the poller of the cloud the job runs on is active (``SPOTOPT_CLOUD``, else detected from
the DMI vendor strings Linux exposes under ``/sys/class/dmi/id``, which costs no network
round-trip). Base URLs can be overridden (``SPOTOPT_<CLOUD>_METADATA_URL``) so tests point them
at a fake metadata server on 127.0.0.1. stdlib ``urllib`` keeps the agent's imports light.

What each cloud says (``/work/shared/notes/cloud-apis.md`` §2.6, §3.5, §4.6, and the pages
cited by each poller):

- AWS: ``PUT /latest/api/token`` (TTL header) → token; ``GET /latest/meta-data/spot/instance-action``
  is 404 until a notice, then ``{"action", "time"}`` ~2 minutes ahead; the rebalance
  recommendation ``/latest/meta-data/events/recommendations/rebalance`` may come earlier.
- GCP: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google`` →
  ``TRUE`` once preempted, ~30 s before the hard stop; ``instance/maintenance-event`` →
  ``TERMINATE_ON_HOST_MAINTENANCE`` about 60 s before a GPU VM is stopped for host maintenance.
- Azure: ``GET /metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true`` →
  events naming the VMs they affect; ``Preempt`` ~30 s ahead, ``Reboot``, ``Redeploy`` and
  ``Terminate`` on their own notice.

A poll answers a notice, None (the documented "nothing pending") or raises: an answer the
document does not give for "nothing pending" (a 5xx, a throttling 429, a 401 a fresh token does
not cure, a 400) is an error, never "no notice", and every request is bounded by
``TIMEOUT_S``, so that a metadata service that hangs (a token PUT beyond the hop limit, Azure's
first Scheduled Events call) costs the agent's round at most that long; the agent logs the
error and its round goes on (``spotopt.agent.core``).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Protocol

from spotopt.agent.config import AgentConfig

TIMEOUT_S = 2.0
DEFAULT_URLS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}
DMI_VENDORS = {"amazon": "aws", "google": "gcp", "microsoft": "azure"}


class NoticeKind(StrEnum):
    PREEMPT = "preempt"
    """The instance will be taken away: checkpoint and stop."""
    REBALANCE = "rebalance"
    """Elevated risk (AWS rebalance recommendation): checkpoint now, keep running."""


@dataclass(frozen=True, slots=True)
class Notice:
    cloud: str
    kind: NoticeKind
    detail: str


class MetadataError(OSError):
    """The metadata service answered what its document does not give for "nothing pending"."""


class NoticePoller(Protocol):
    def poll(self) -> Notice | None:
        """One look at the metadata service: the current notice, or None. Network errors propagate."""
        ...


def _request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, timeout_s: float = TIMEOUT_S
) -> tuple[int, bytes]:
    """(status, body); HTTP error statuses are returned, not raised (404 is the normal 'no notice').
    No answer within ``timeout_s`` (connecting, or between bytes) raises ``TimeoutError``."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _expect(cloud: str, what: str, status: int, body: bytes, allowed: tuple[int, ...]) -> None:
    """``MetadataError`` naming the endpoint and status unless ``status`` is one of ``allowed``."""
    if status not in allowed:
        text = body[:200].decode("utf-8", "replace").strip()
        raise MetadataError(f"{cloud} metadata {what} answered HTTP {status}" + (f": {text}" if text else ""))


class AwsImdsPoller:
    """IMDSv2: a session token first, then the spot instance-action and the rebalance recommendation.

    Per the EC2 user guide ("Use the Instance Metadata Service to access instance metadata",
    IMDSv2): a GET with an expired or invalid token is answered 401, and the client gets a
    new token with the PUT and tries again (once here: a 401 that a fresh token does not cure is
    an error); a 404 on ``spot/instance-action`` or the rebalance recommendation is the normal
    "no notice"; throttling is a 429 and service trouble a 5xx, both errors to retry at the next
    poll, never "no notice". The token PUT itself answers 200, else (a 403 when IMDS is off, a
    hang when the PUT's hop limit is too low for a container) it is an error.
    """

    TOKEN_TTL_S = 21600

    def __init__(self, base_url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.base = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self._token: str | None = None

    def _get(self, path: str) -> tuple[int, bytes]:
        for _ in range(2):
            if self._token is None:
                status, body = _request(
                    f"{self.base}/latest/api/token",
                    "PUT",
                    {"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_S)},
                    self.timeout_s,
                )
                _expect("aws", "token PUT", status, body, (200,))
                self._token = body.decode()
            status, body = _request(
                f"{self.base}{path}",
                headers={"X-aws-ec2-metadata-token": self._token},
                timeout_s=self.timeout_s,
            )
            if status != 401:
                break
            self._token = None  # expired: fetch a new one once
        _expect("aws", path, status, body, (200, 404))
        return status, body

    def poll(self) -> Notice | None:
        status, body = self._get("/latest/meta-data/spot/instance-action")
        if status == 200:
            data = json.loads(body)
            return Notice("aws", NoticeKind.PREEMPT, f"spot {data.get('action')} at {data.get('time')}")
        status, body = self._get("/latest/meta-data/events/recommendations/rebalance")
        if status == 200:
            return Notice(
                "aws",
                NoticeKind.REBALANCE,
                f"rebalance recommendation at {json.loads(body).get('noticeTime')}",
            )
        return None


class GcpMetadataPoller:
    """``instance/preempted`` and ``instance/maintenance-event`` of the GCP metadata server.

    Per Compute Engine's "About VM metadata" and "Host maintenance events" pages:
    ``preempted`` is ``TRUE`` once a Spot or preemptible VM is being preempted (~30 s
    ahead); ``maintenance-event`` is ``NONE``, ``MIGRATE_ON_HOST_MAINTENANCE`` (a live migration:
    the VM keeps running, worth a checkpoint) or ``TERMINATE_ON_HOST_MAINTENANCE`` (GPU VMs
    cannot migrate: the VM is stopped about 60 s later, so checkpoint and stop). Every request
    carries ``Metadata-Flavor: Google`` and answers 200; anything else (a 503 while the server
    restarts, a 403) is an error.
    """

    STOPS = "TERMINATE_ON_HOST_MAINTENANCE"
    MIGRATES = "MIGRATE_ON_HOST_MAINTENANCE"

    def __init__(self, base_url: str, timeout_s: float = TIMEOUT_S) -> None:
        base = f"{base_url.rstrip('/')}/computeMetadata/v1/instance"
        self.url = f"{base}/preempted"
        self.maintenance_url = f"{base}/maintenance-event"
        self.timeout_s = timeout_s

    def _get(self, url: str) -> str:
        status, body = _request(url, headers={"Metadata-Flavor": "Google"}, timeout_s=self.timeout_s)
        _expect("gcp", url.rsplit("/", 1)[1], status, body, (200,))
        return body.decode("utf-8", "replace").strip().upper()

    def poll(self) -> Notice | None:
        if self._get(self.url) == "TRUE":
            return Notice("gcp", NoticeKind.PREEMPT, "instance/preempted is TRUE")
        event = self._get(self.maintenance_url)
        if event == self.STOPS:
            return Notice("gcp", NoticeKind.PREEMPT, f"instance/maintenance-event is {event}")
        if event == self.MIGRATES:
            return Notice("gcp", NoticeKind.REBALANCE, f"instance/maintenance-event is {event}")
        return None


class AzureScheduledEventsPoller:
    """Azure Scheduled Events, for this VM only.

    Per "Azure Metadata Service: Scheduled Events for Linux VMs" (learn.microsoft.com): events
    go to every VM of an availability set, scale set placement group or cloud service, so each
    names the VMs it affects in ``Resources`` and an event for other VMs is none of this one's
    business (this VM's name comes from the instance metadata,
    ``/metadata/instance/compute/name``). ``Preempt`` (a Spot eviction), ``Terminate`` (the VM
    is deleted), ``Reboot`` (memory is lost) and ``Redeploy`` (moved to another host, the
    temporary disk lost) all end the training process: checkpoint and stop. ``Freeze`` pauses
    the VM for seconds and is ignored. The service answers 200 with the events (an empty list:
    nothing pending), 400 to a request without ``Metadata: true`` or with a bad api-version and
    500 on its own failure: both are errors, never "no notice". The first call after boot can
    take up to two minutes while the service enables itself: ``TIMEOUT_S`` bounds it, and the
    next poll tries again.
    """

    API_VERSION = "2020-07-01"
    ENDS = ("Preempt", "Terminate", "Reboot", "Redeploy")

    def __init__(self, base_url: str, timeout_s: float = TIMEOUT_S) -> None:
        base = base_url.rstrip("/")
        self.url = f"{base}/metadata/scheduledevents?api-version={self.API_VERSION}"
        self.name_url = f"{base}/metadata/instance/compute/name?api-version=2021-02-01&format=text"
        self.timeout_s = timeout_s
        self._name: str | None = None

    def _get(self, url: str, what: str) -> bytes:
        status, body = _request(url, headers={"Metadata": "true"}, timeout_s=self.timeout_s)
        _expect("azure", what, status, body, (200,))
        return body

    def vm_name(self) -> str:
        """This VM's name as ``Resources`` lists it (asked once)."""
        if self._name is None:
            self._name = self._get(self.name_url, "compute/name").decode("utf-8").strip()
        return self._name

    def poll(self) -> Notice | None:
        events = json.loads(self._get(self.url, "scheduledevents")).get("Events", [])
        mine = [
            e for e in events if e.get("EventType") in self.ENDS and self.vm_name() in e.get("Resources", [])
        ]
        if not mine:
            return None
        event = mine[0]
        when = event.get("NotBefore") or "now"
        return Notice(
            "azure",
            NoticeKind.PREEMPT,
            f"{event.get('EventType')} ({event.get('EventStatus')}) not before {when}",
        )


class LocalNoticePoller:
    """The local provider's ``preempt`` writes a file; its appearance is the notice."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def poll(self) -> Notice | None:
        if self.path.exists():
            return Notice(
                "local", NoticeKind.PREEMPT, self.path.read_text(encoding="utf-8").strip() or "preempted"
            )
        return None


def detect_cloud(dmi_dir: Path = Path("/sys/class/dmi/id")) -> str | None:
    """The cloud this machine runs on, from its DMI vendor strings; None off-cloud or unreadable."""
    for name in ("sys_vendor", "board_vendor", "bios_vendor"):
        try:
            text = (dmi_dir / name).read_text(encoding="utf-8", errors="replace").lower()
        except OSError:
            continue
        for needle, cloud in DMI_VENDORS.items():
            if needle in text:
                return cloud
    return None


def poller_for(config: AgentConfig, dmi_dir: Path = Path("/sys/class/dmi/id")) -> NoticePoller | None:
    """The one poller for the cloud the job runs on, or None (standalone, off-cloud, ``none``)."""
    cloud = config.cloud
    if cloud == "none":
        return None
    if cloud is None and config.notice_file:
        cloud = "local"
    if cloud is None:
        cloud = detect_cloud(dmi_dir)
    if cloud == "local":
        return LocalNoticePoller(config.notice_file) if config.notice_file else None
    if cloud is None:
        return None
    url = config.metadata_urls.get(cloud, DEFAULT_URLS[cloud])
    pollers: dict[str, Callable[[str], NoticePoller]] = {
        "aws": AwsImdsPoller,
        "gcp": GcpMetadataPoller,
        "azure": AzureScheduledEventsPoller,
    }
    return pollers[cloud](url)
