"""Preemption notices, polled from inside the instance: AWS IMDSv2, GCP metadata, Azure Scheduled Events.

This module is the agent's side: the local provider's notice file and the choice of the one
poller (what a notice is and the HTTP helpers are ``spotopt.clouds.common.notices``). Each
cloud's poller lives in its folder (``spotopt/clouds/<cloud>/notices.py``), named with its
metadata URL and DMI vendor by the cloud's entry in ``spotopt.clouds.registry``; it is imported
only when chosen, and neither the registry nor a poller imports the database or a cloud SDK.

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

import importlib
from pathlib import Path

from spotopt.agent.config import AgentConfig
from spotopt.clouds.common.notices import Notice, NoticeKind, NoticePoller
from spotopt.clouds.registry import CLOUDS


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
        for cloud, entry in CLOUDS.items():
            if entry.dmi_vendor is not None and entry.dmi_vendor in text:
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
    entry = CLOUDS[cloud]
    if entry.notice_poller is None or entry.metadata_url is None:
        return None
    url = config.metadata_urls.get(cloud, entry.metadata_url)
    module, _, attr = entry.notice_poller.partition(":")
    poller: NoticePoller = getattr(importlib.import_module(module), attr)(url)
    return poller
