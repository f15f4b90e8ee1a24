"""The ``gcp`` provider: Compute Engine instances (Spot or standard) that run the job's agent.

One launch is one ``instances.insert``:

- Spot markets set ``scheduling.provisioning_model=SPOT`` with
  ``instance_termination_action=DELETE``: a preempted VM is deleted rather than stopped, so no
  boot disk of a dead placement is left to pay for (the next placement starts from the store's
  checkpoint, never from the old disk). ``LaunchSpec.max_usd_per_instance_hour`` is ignored:
  ``Scheduling`` has no price cap (GCP Spot prices change at most once per 30 days), so the
  daemon's budget checks are the cap. ``on_host_maintenance=TERMINATE`` and
  ``automatic_restart=False`` for every market: GPU VMs cannot live-migrate, and a VM that
  restarts by itself would run a second agent for an epoch the daemon may have moved on from.
- N1 types carry their GPUs as guest accelerators (the catalog names them
  ``n1-standard-8+1xnvidia-tesla-v100``); A2/A3/G2 types have them built in.
- The instance name derives from the idempotency key and ``requestId`` is a uuid5 of (key, zone),
  so a retried insert is ignored by GCP or answered 409 ``alreadyExists``: both return the
  instance that exists. Before inserting, the key's label is looked up across zones, so a retry
  after a zone fallback finds the instance wherever it went.
- Labels (``spotopt-job``, ``spotopt-epoch``, ``spotopt-key``, ``spotopt-move`` when the spec's
  tags carry ``move``, and the spec's tags, sanitised to
  GCP's label rules) serve the server-side filter; metadata keeps the exact values, and
  ``startup-script`` holds the start-up script that bootstraps the agent.

Markets are region-wide (GCP prices are per region): without a zone, the provider tries the
region's zones that offer the machine (or accelerator) type, in name order, and falls through
to the next zone on ``ZONE_RESOURCE_POOL_EXHAUSTED``; only when every zone is out of capacity
(or a quota is exceeded, which holds in every zone) does it raise ``CapacityUnavailableError``.
A ``rateLimitExceeded`` (HTTP 403) is neither: it is the API's request-rate limit, retried with
backoff ("wait until some requests complete and try your request again": Compute Engine docs,
"Troubleshooting bulk instance creation"; ``spotopt.cloud_calls.TRANSIENT_CODES``).

The instance id is ``ZONE/NAME``. ``status`` reads the instance; once it is deleted, the zone's
operations tell why: a ``compute.instances.preempted`` operation means ``PREEMPTED``, a delete
means ``TERMINATED``, neither means ``GONE`` (GCP keeps operations for a limited time). The
operations are asked for with the documented filter syntax only (``zoneOperations.list``
``filter``: a field, one of ``= != > < <= >=``, a value; several expressions each in
parentheses, joined by ``AND``/``OR``): ``(operationType = "compute.instances.preempted") OR
(operationType = "delete")``, and the target link is compared exactly here. The reference
documents ``:`` only as ``:*`` (is the key set), not as the substring match the official sample
relies on.

Billing (Compute Engine docs, "Stop and start a compute instance"): a stopped instance (status
``TERMINATED``, what the guest's power-off at the end of the job leaves) is not charged for
its vCPUs and memory, but its disks (and a static IP) are: an ended VM that still exists bills
``STORAGE`` until ``terminate`` deletes it, with its boot disk (``autoDelete``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from functools import partial
from typing import Any

from spotopt.catalog import GCP_ATTACHED_GPUS
from spotopt.cloud_calls import Retry
from spotopt.clouds.common.base import (
    Billing,
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    market_label,
    matches,
    sorted_instances,
)
from spotopt.clouds.common.bootstrap import render_script
from spotopt.clouds.common.calls import ScriptRenderer, after_delete, none_if_missing, provider_call
from spotopt.clouds.common.naming import label_key, label_value, request_uuid, resource_name
from spotopt.clouds.gcp.adaptor import GcpClients
from spotopt.errors import CapacityUnavailableError, ProviderError
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind

ZONE_EXHAUSTED = frozenset({"ZONE_RESOURCE_POOL_EXHAUSTED", "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS"})
"""Operation error codes that mean "this zone has no capacity now": try the region's next zone."""
QUOTA = frozenset({"QUOTA_EXCEEDED", "QUOTAEXCEEDED"})
"""Quota errors (the operation's ``QUOTA_EXCEEDED``, the HTTP 403 reason ``quotaExceeded``):
capacity is unavailable to us in every zone of the region. Not ``rateLimitExceeded``: that is a
request rate, retried (module doc)."""
LIVE = {"PROVISIONING": InstanceState.PENDING, "STAGING": InstanceState.PENDING}
LIVE |= {"REPAIRING": InstanceState.PENDING, "RUNNING": InstanceState.RUNNING}
"""Instance statuses of a live VM; every other status (STOPPING, TERMINATED, SUSPENDING,
SUSPENDED) is a VM that stopped: preempted if GCP says so, else the job ended and shut it down."""
PREEMPTED_OP = "compute.instances.preempted"
ENDING_OPS = f'(operationType = "{PREEMPTED_OP}") OR (operationType = "delete")'
"""The ``zoneOperations.list`` filter of the operations that tell how an instance ended."""
META = "spotopt-"
"""Prefix of the metadata keys holding the exact job, epoch, key, market and tags."""


def _capacity_code(exc: BaseException) -> str | None:
    """The capacity or quota reason of a synchronous HTTP error (``google.api_core`` keeps the JSON
    ``error.errors[].reason`` in ``errors``), or None."""
    for error in getattr(exc, "errors", None) or []:
        reason = str(error.get("reason", "")) if isinstance(error, Mapping) else ""
        if reason.upper() in QUOTA | ZONE_EXHAUSTED:
            return reason
    return None


def _status_name(op: Any) -> str:
    status = op.status
    return str(getattr(status, "name", status))


class GcpProvider:
    """Launches, watches and deletes Compute Engine instances; see the module docstring.

    ``clients``, ``script``, ``retry`` and ``sleep`` are the seams tests replace: ``script``
    renders the start-up script (default: ``bootstrap.render_script`` with these settings,
    for the market's cloud), ``sleep`` paces operation polling (``poll_s`` apart).
    """

    name = "gcp"
    runs_on_market = True

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        script: ScriptRenderer | None = None,
        clients: GcpClients | None = None,
        retry: Retry | None = None,
        poll_s: float = 1.0,
        operation_timeout_s: float = 900.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        settings = settings or Settings()
        self.image = settings.require("gcp_image", "the boot image (projects/P/global/images/family/F)")
        self.service_account = settings.require(
            "gcp_service_account", "the email of the service account the instances run as"
        )
        self.network = settings.gcp_network
        self.subnetwork = settings.gcp_subnetwork
        self.external_ip = settings.gcp_external_ip
        self.clients = clients or GcpClients(project=settings.gcp_project)
        self.script = script or partial(render_script, settings=settings)
        self.retry = retry or Retry()
        self.poll_s = poll_s
        self.operation_timeout_s = operation_timeout_s
        self.sleep = sleep
        self._ended: dict[str, InstanceStatus] = {}
        """How instances we deleted after they ended had ended (status is then kept for them)."""

    # -- Provider ---------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        if not spec.command:
            raise ProviderError(f"job {spec.job}: the launch spec has no command")
        found = self._list(f'labels.{META}key = "{label_value(idempotency_key)}"')
        for instance in found:
            if instance.idempotency_key == idempotency_key:
                return instance
        name = resource_name(idempotency_key)
        label = market_label(market)
        exhausted = []
        for zone in self._zones(market):
            body = self._body(spec, market, idempotency_key, name, zone)
            launched = self._insert(zone, name, body, request_uuid(idempotency_key, zone), label)
            if launched is None:
                exhausted.append(zone)
                continue
            return launched
        raise CapacityUnavailableError(
            f"{label}: no capacity (ZONE_RESOURCE_POOL_EXHAUSTED in {', '.join(exhausted)})"
        )

    def status(self, instance_id: str) -> InstanceStatus:
        zone, _, name = instance_id.partition("/")
        if not zone or not name or "/" in name:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="not a GCP ZONE/NAME id")
        vm = self._get(zone, name)
        if vm is None:
            gone = "no such instance (now)"
            return self._ended.get(instance_id) or self._stopped(None, zone, name, instance_id, gone)
        instance = self._instance(vm, zone)
        if instance is None:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="not launched by spotopt")
        state = LIVE.get(vm.status)
        if state is not None:
            return InstanceStatus(instance, instance_id, state, detail=vm.status)
        return self._stopped(instance, zone, name, instance_id, vm.status)

    def terminate(self, instance_id: str) -> InstanceStatus:
        """Delete the instance (and with it its boot disk) and wait for the deletion.

        Idempotent: an instance already deleted is left alone. An instance that had ended by
        itself (job exit, preemption) is deleted too, so its disk stops costing, and keeps the
        state it ended in."""
        before = self.status(instance_id)
        if before.state is InstanceState.GONE or before.instance is None:
            return before
        zone, _, name = instance_id.partition("/")
        request = request_uuid("delete", instance_id, before.instance.idempotency_key)
        op = provider_call(
            self.retry,
            "gcp",
            "instances.delete",
            lambda: none_if_missing(lambda: self.clients.delete_instance(zone, name, request)),
        )
        if op is not None and (errors := self._wait(zone, op, "instances.delete")):
            raise ProviderError(f"gcp: instances.delete of {instance_id} failed: {errors}")
        return after_delete(before, self._ended)

    def check(self) -> None:
        """Credentials and a project, checked without an API call (the settings were checked
        when this was built): ``MissingCredentials`` says what to configure."""
        self.clients.project()

    def list_instances(self, job: str | None = None, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """Instances spotopt launched in the project: the label narrows, exact values decide."""
        flt = f'labels.{META}job = "{label_value(job)}"' if job is not None else ""
        return sorted_instances([i for i in self._list(flt) if matches(i, job, tags)])

    # -- launch --------------------------------------------------------------------------------

    def _body(self, spec: LaunchSpec, market: MarketKey, key: str, name: str, zone: str) -> dict[str, Any]:
        attached = GCP_ATTACHED_GPUS.fullmatch(market.instance_type)
        machine = attached["machine"] if attached else market.instance_type
        labels = {label_key(k): label_value(v) for k, v in spec.tags.items()}
        labels |= {
            f"{META}job": label_value(spec.job),
            f"{META}epoch": str(spec.epoch),
            f"{META}key": label_value(key),
        }
        if "move" in spec.tags:  # the daemon's move id, labelled like on AWS and Azure
            labels[f"{META}move"] = label_value(spec.tags["move"])
        metadata = {
            f"{META}job": spec.job,
            f"{META}epoch": str(spec.epoch),
            f"{META}key": key,
            f"{META}market": market_label(market),
            f"{META}tags": json.dumps(dict(spec.tags), sort_keys=True),
            "startup-script": self.script(spec, market),
        }
        interface: dict[str, Any] = {"network": self.network or "global/networks/default"}
        if self.subnetwork:
            interface["subnetwork"] = self.subnetwork
        if self.external_ip:
            interface["access_configs"] = [{"name": "external-nat", "type": "ONE_TO_ONE_NAT"}]
        scheduling: dict[str, Any] = {"on_host_maintenance": "TERMINATE", "automatic_restart": False}
        if market.kind is MarketKind.SPOT:
            scheduling |= {"provisioning_model": "SPOT", "instance_termination_action": "DELETE"}
        else:
            scheduling["provisioning_model"] = "STANDARD"
        body: dict[str, Any] = {
            "name": name,
            "machine_type": f"zones/{zone}/machineTypes/{machine}",
            "scheduling": scheduling,
            "disks": [{"boot": True, "auto_delete": True, "initialize_params": {"source_image": self.image}}],
            "network_interfaces": [interface],
            "service_accounts": [
                {"email": self.service_account, "scopes": ["https://www.googleapis.com/auth/cloud-platform"]}
            ],
            "labels": labels,
            "metadata": {"items": [{"key": k, "value": v} for k, v in metadata.items()]},
        }
        if attached:
            body["guest_accelerators"] = [
                {
                    "accelerator_type": f"zones/{zone}/acceleratorTypes/{attached['accel']}",
                    "accelerator_count": int(attached["count"]),
                }
            ]
        return body

    def _insert(
        self, zone: str, name: str, body: dict[str, Any], request: str, label: str
    ) -> Instance | None:
        """Insert and wait; the instance, or None when the zone is out of capacity."""

        def insert() -> Any:
            from google.api_core.exceptions import Conflict

            try:
                return self.clients.insert_instance(zone, body, request)
            except Conflict:  # 409 alreadyExists: this key's instance is there already
                return None

        op = provider_call(self.retry, "gcp", "instances.insert", insert, _capacity_code, label)
        if op is not None:
            errors = self._wait(zone, op, "instances.insert")
            codes = [code for code, _ in errors]
            if any(code in ZONE_EXHAUSTED for code in codes):
                return None
            if quota := [c for c in codes if c.upper() in QUOTA]:
                raise CapacityUnavailableError(f"{label}: no capacity ({quota[0]}) in {zone}: {errors}")
            if errors:
                raise ProviderError(f"gcp: instances.insert of {name} in {zone} failed: {errors}")
        vm = self._get(zone, name)
        if vm is None:
            raise ProviderError(
                f"gcp: {zone}/{name} was launched for this idempotency key and is gone "
                "(preempted or deleted); a new placement needs a new key"
            )
        return self._instance(vm, zone)

    def _zones(self, market: MarketKey) -> list[str]:
        """The zone of a zonal market, else the region's zones offering its type, by name."""
        if market.zone:
            return [market.zone]
        attached = GCP_ATTACHED_GPUS.fullmatch(market.instance_type)
        kind, wanted = ("accel", attached["accel"]) if attached else ("machine", market.instance_type)
        zones: set[str] = set()
        for page in self._pages(
            "acceleratorTypes.aggregatedList" if attached else "machineTypes.aggregatedList",
            lambda token: self.clients.offering_page(kind, f'name = "{wanted}"', token),
        ):
            for scope, scoped in page.items.items():
                listed = scoped.accelerator_types if attached else scoped.machine_types
                zone = scope.rsplit("/", 1)[-1]
                if zone.rsplit("-", 1)[0] == market.region and any(t.name == wanted for t in listed):
                    zones.add(zone)
        if not zones:
            raise CapacityUnavailableError(
                f"{market_label(market)}: no zone of {market.region} offers {wanted}"
            )
        return sorted(zones)

    def _wait(self, zone: str, op: Any, api: str) -> list[tuple[str, str]]:
        """Wait for a zone operation to be DONE; its errors as (code, message) pairs."""
        deadline = time.monotonic() + self.operation_timeout_s
        while _status_name(op) != "DONE":
            if time.monotonic() > deadline:
                raise ProviderError(f"gcp: {api} operation {op.name} in {zone} not done after the timeout")
            self.sleep(self.poll_s)
            wait = partial(self.clients.wait_operation, zone, op.name)
            op = provider_call(self.retry, "gcp", "zoneOperations.wait", wait)
        return [(e.code, e.message) for e in op.error.errors]

    # -- reading -------------------------------------------------------------------------------

    def _get(self, zone: str, name: str) -> Any | None:
        return provider_call(
            self.retry,
            "gcp",
            "instances.get",
            lambda: none_if_missing(lambda: self.clients.get_instance(zone, name)),
        )

    def _pages(self, api: str, page: Callable[[str], Any]) -> Iterator[Any]:
        """Every page of a list call, following ``next_page_token``."""
        token = ""
        while True:
            response = provider_call(self.retry, "gcp", api, partial(page, token))
            yield response
            token = response.next_page_token
            if not token:
                return

    def _list(self, flt: str) -> list[Instance]:
        found = []
        for page in self._pages(
            "instances.aggregatedList", lambda token: self.clients.instances_page(flt, token)
        ):
            for scope, scoped in page.items.items():
                zone = scope.rsplit("/", 1)[-1]
                found += [i for vm in scoped.instances if (i := self._instance(vm, zone)) is not None]
        return found

    def _history(self, zone: str, name: str) -> set[str]:
        """The ending operations (``ENDING_OPS``) GCP still keeps for this instance, by type; the
        target link is compared by its path, whatever host the API writes in it."""
        kinds = set()
        target = f"/projects/{self.clients.project()}/zones/{zone}/instances/{name}"
        for page in self._pages(
            "zoneOperations.list", lambda token: self.clients.zone_operations_page(zone, ENDING_OPS, token)
        ):
            kinds |= {op.operation_type for op in page.items if op.target_link.endswith(target)}
        return kinds

    def _stopped(
        self, instance: Instance | None, zone: str, name: str, instance_id: str, detail: str
    ) -> InstanceStatus:
        """A stopped or deleted instance (``instance`` None once deleted): the zone's operations
        say whether it was preempted or deleted; a stopped one otherwise ended by itself (the
        start-up script powers it off after the job), a deleted one is unknown. One that still
        exists bills its disks (module doc)."""
        kinds = self._history(zone, name)
        left = Billing.STORAGE if instance is not None else Billing.NONE
        if PREEMPTED_OP in kinds:
            return InstanceStatus(
                instance, instance_id, InstanceState.PREEMPTED, detail=detail, leftover=left
            )
        if "delete" in kinds:
            return InstanceStatus(
                instance, instance_id, InstanceState.TERMINATED, detail=detail, leftover=left
            )
        if instance is None:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail=detail)
        return InstanceStatus(instance, instance_id, InstanceState.EXITED, detail=detail, leftover=left)

    @staticmethod
    def _instance(vm: Any, zone: str) -> Instance | None:
        """The spotopt instance a VM is, from its metadata; None for a VM spotopt did not launch."""
        meta = {item.key: item.value for item in vm.metadata.items}
        if f"{META}key" not in meta:
            return None
        return Instance(
            instance_id=f"{zone}/{vm.name}",
            provider="gcp",
            job=meta[f"{META}job"],
            epoch=int(meta[f"{META}epoch"]),
            market=meta[f"{META}market"],
            idempotency_key=meta[f"{META}key"],
            launched_at=datetime.fromisoformat(vm.creation_timestamp),
            tags=json.loads(meta.get(f"{META}tags", "{}")),
        )
