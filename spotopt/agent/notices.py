"""Preemption notices, polled from inside the instance: AWS IMDSv2, GCP metadata, Azure Scheduled Events.

Only the poller of the cloud the job runs on is active (``SPOTOPT_CLOUD``, else detected from
the DMI vendor strings Linux exposes under ``/sys/class/dmi/id``, which costs no network
round-trip). Base URLs can be overridden (``SPOTOPT_<CLOUD>_METADATA_URL``) so tests point them
at a fake metadata server on 127.0.0.1. stdlib ``urllib`` keeps the agent's imports light.

What each cloud says (``/work/shared/notes/cloud-apis.md`` §2.6, §3.5, §4.6):

- AWS: ``PUT /latest/api/token`` (TTL header) → token; ``GET /latest/meta-data/spot/instance-action``
  is 404 until a notice, then ``{"action", "time"}`` ~2 minutes ahead; the rebalance
  recommendation ``/latest/meta-data/events/recommendations/rebalance`` may come earlier.
- GCP: ``GET /computeMetadata/v1/instance/preempted`` with ``Metadata-Flavor: Google`` →
  ``TRUE`` once preempted; ~30 s before the hard stop.
- Azure: ``GET /metadata/scheduledevents?api-version=2020-07-01`` with ``Metadata: true`` → an
  event with ``EventType == "Preempt"``; ~30 s ahead.
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


class NoticePoller(Protocol):
    def poll(self) -> Notice | None:
        """One look at the metadata service: the current notice, or None. Network errors propagate."""
        ...


def _request(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """(status, body); HTTP error statuses are returned, not raised (404 is the normal 'no notice')."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class AwsImdsPoller:
    """IMDSv2: a session token first, then the spot instance-action and the rebalance recommendation."""

    def __init__(self, base_url: str) -> None:
        self.base = base_url.rstrip("/")
        self._token: str | None = None

    def _get(self, path: str) -> tuple[int, bytes]:
        for _ in range(2):
            if self._token is None:
                status, body = _request(
                    f"{self.base}/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "21600"}
                )
                if status != 200:
                    raise OSError(f"IMDSv2 token request answered HTTP {status}")
                self._token = body.decode()
            status, body = _request(f"{self.base}{path}", headers={"X-aws-ec2-metadata-token": self._token})
            if status != 401:
                return status, body
            self._token = None  # expired: fetch a new one once
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
    def __init__(self, base_url: str) -> None:
        self.url = f"{base_url.rstrip('/')}/computeMetadata/v1/instance/preempted"

    def poll(self) -> Notice | None:
        status, body = _request(self.url, headers={"Metadata-Flavor": "Google"})
        if status == 200 and body.strip().upper() == b"TRUE":
            return Notice("gcp", NoticeKind.PREEMPT, "instance/preempted is TRUE")
        return None


class AzureScheduledEventsPoller:
    def __init__(self, base_url: str) -> None:
        self.url = f"{base_url.rstrip('/')}/metadata/scheduledevents?api-version=2020-07-01"

    def poll(self) -> Notice | None:
        status, body = _request(self.url, headers={"Metadata": "true"})
        if status != 200:
            return None
        for event in json.loads(body).get("Events", []):
            if event.get("EventType") == "Preempt":
                return Notice("azure", NoticeKind.PREEMPT, f"Preempt not before {event.get('NotBefore')}")
        return None


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
