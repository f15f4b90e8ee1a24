"""GCP preemption and host-maintenance notices: the agent's poller of the metadata server."""

from __future__ import annotations

from spotopt.clouds.common.notices import TIMEOUT_S, Notice, NoticeKind, expect, request


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
        status, body = request(url, headers={"Metadata-Flavor": "Google"}, timeout_s=self.timeout_s)
        expect("gcp", url.rsplit("/", 1)[1], status, body, (200,))
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
