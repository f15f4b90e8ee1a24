"""Azure Scheduled Events: the agent's poller for this VM (see ``spotopt.agent.notices``)."""

from __future__ import annotations

import json

from spotopt.clouds.common.notices import TIMEOUT_S, Notice, NoticeKind, expect, request


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
        status, body = request(url, headers={"Metadata": "true"}, timeout_s=self.timeout_s)
        expect("azure", what, status, body, (200,))
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
