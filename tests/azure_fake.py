"""A stateful fake of Azure Resource Manager (VMs and NICs) behind ``responses``, for the Azure provider.

Shapes follow the ARM REST reference (Virtual Machines - Create Or Update / Get / Delete / List,
Network Interfaces - Create Or Update / Delete) and the long-running-operation protocol: a PUT
answers 201 with ``provisioningState`` ``Creating`` and an ``Azure-AsyncOperation`` URL whose
status is ``InProgress`` on the first poll and ``Succeeded`` (or ``Failed`` with the ARM error)
on the next; the poller then GETs the resource. DELETE answers 202 with the same protocol, or
404 ``ResourceNotFound`` for a resource that does not exist. ``customData`` is write-only, as
in ARM: kept by the fake, never returned. A VM's ``instanceView`` (its power state) is only in
a GET with ``$expand=instanceView``, as in ARM (a list or plain GET leaves it out).

References: https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/create-or-update
(and ``…/get``, ``/delete``, ``/list``), https://learn.microsoft.com/en-us/rest/api/virtualnetwork/network-interfaces/create-or-update,
https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/async-operations.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import responses

SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
GROUP = "rg-spot"
ARM = "https://management.azure.com"
RG = f"{ARM}/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}"
Reply = tuple[int, dict[str, str], str]
PATHS = {"vm": "Microsoft.Compute/virtualMachines", "nic": "Microsoft.Network/networkInterfaces"}


def _error(status: int, code: str, message: str) -> Reply:
    return status, {}, json.dumps({"error": {"code": code, "message": message}})


def _without_instance_view(resource: dict[str, Any]) -> dict[str, Any]:
    """A resource as ARM answers a GET or list without ``$expand=instanceView``."""
    shown = copy.deepcopy(resource)
    shown["properties"].pop("instanceView", None)
    return shown


@dataclass(frozen=True)
class Exchange:
    """One request and the fake's answer (azure-core streams responses, so ``responses``' own
    record of a response body is consumed by the time a test looks)."""

    method: str
    url: str
    body: Any
    status: int
    answer: Any


@dataclass
class AzureArmFake:
    """VMs and NICs of one resource group; register with ``install(rsps)``."""

    sync_error: tuple[int, str] | None = None
    """(HTTP status, ARM code) the next VM PUT answers at once (e.g. 409 SkuNotAvailable)."""
    async_error: str | None = None
    """ARM code the next VM PUT's asynchronous operation ends with (e.g. AllocationFailed)."""
    ends_by_itself: Callable[[str], bool] = lambda script: False
    """A start-up script for which the VM's job ends at once (the guest powers the VM off)."""
    resources: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    custom_data: dict[str, str] = field(default_factory=dict)
    operations: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    """Operation id → the statuses its polls answer, in order (the last one repeats)."""
    faults: list[int] = field(default_factory=list)
    """HTTP statuses the next requests answer (whatever they ask) before the fake serves again."""
    broken_deletes: bool = False
    """Every DELETE answers 500 (an ARM outage while a failed launch is cleaned up)."""
    log: list[Exchange] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def install(self, rsps: responses.RequestsMock) -> None:
        self.rsps = rsps
        for kind, path in PATHS.items():
            url = re.compile(rf"{re.escape(RG)}/providers/{path}/(?P<name>[^/?]+)(\?.*)?$")
            for method in ("PUT", "GET", "DELETE"):
                handler = self._logged(self._route(url, method, kind))
                rsps.add_callback(method, url, callback=handler, content_type="application/json")
        vms = re.compile(rf"{re.escape(RG)}/providers/{PATHS['vm']}(\?.*)?$")
        rsps.add_callback("GET", vms, callback=self._logged(self._list), content_type="application/json")
        ops = re.compile(
            rf"{re.escape(ARM)}/subscriptions/{SUBSCRIPTION}/providers/[\w.]+/locations/\w+/operations/(?P<op>[\w-]+)"
        )
        poll = self._logged(lambda r: self._poll(r.url.split("/operations/")[1].split("?")[0]))
        rsps.add_callback("GET", ops, callback=poll, content_type="application/json")

    def calls(self, method: str, pattern: str) -> list[Exchange]:
        return [c for c in self.log if c.method == method and re.search(pattern, c.url)]

    def _logged(self, handler: Callable[[Any], Reply]) -> Callable[[Any], Reply]:
        def reply(request: Any) -> Reply:
            if self.faults:
                status, headers, text = _error(self.faults.pop(0), "TooManyRequests", "scripted fault")
            else:
                status, headers, text = handler(request)
            body = json.loads(request.body) if request.body else None
            self.log.append(
                Exchange(request.method, request.url, body, status, json.loads(text) if text else None)
            )
            return status, headers, text

        return reply

    def vm(self, name: str) -> dict[str, Any] | None:
        return self.resources.get(("vm", name))

    def evict(self, name: str) -> None:
        """A Spot eviction with eviction policy Delete: the VM, its NIC and disk are deleted."""
        del self.resources[("vm", name)]
        self.resources.pop(("nic", f"{name}-nic"), None)

    # -- handlers ------------------------------------------------------------------------------

    def _route(self, url: re.Pattern[str], method: str, kind: str) -> Callable[[Any], Reply]:
        def reply(request: Any) -> Reply:
            match = url.match(request.url)
            assert match is not None and "api-version=" in request.url
            name = match["name"]
            if method == "PUT":
                return self._put(kind, name, json.loads(request.body))
            if method == "DELETE":
                return (
                    _error(500, "InternalServerError", "outage")
                    if self.broken_deletes
                    else self._delete(kind, name)
                )
            return self._get(kind, name, expand="expand=instanceView" in request.url)

        return reply

    def _operation(self, location: str, namespace: str, final: dict[str, Any]) -> dict[str, str]:
        op = f"op-{next(self._ids)}"
        self.operations[op] = [
            {"name": op, "status": "InProgress", "startTime": "2026-11-22T18:00:00Z"},
            {"name": op, "startTime": "2026-11-22T18:00:00Z", "endTime": "2026-11-22T18:01:00Z", **final},
        ]
        where = f"{ARM}/subscriptions/{SUBSCRIPTION}/providers/{namespace}/locations/{location}"
        url = f"{where}/operations/{op}?api-version=2024-07-01"
        return {"Azure-AsyncOperation": url, "Retry-After": "0"}

    def _poll(self, op: str) -> Reply:
        statuses = self.operations[op]
        status = statuses.pop(0) if len(statuses) > 1 else statuses[0]
        return 200, {}, json.dumps(status)

    def _put(self, kind: str, name: str, body: dict[str, Any]) -> Reply:
        namespace = PATHS[kind].split("/")[0]
        if kind == "vm" and self.sync_error is not None:
            status, code = self.sync_error
            self.sync_error = None
            size, location = body["properties"]["hardwareProfile"]["vmSize"], body["location"]
            message = f"The requested VM size {size} is currently not available in location '{location}'."
            return _error(status, code, message)
        resource = copy.deepcopy(body)
        resource.update(
            name=name,
            id=f"/subscriptions/{SUBSCRIPTION}/resourceGroups/{GROUP}/providers/{PATHS[kind]}/{name}",
            type=PATHS[kind],
        )
        resource["properties"]["provisioningState"] = "Succeeded"
        if kind == "vm":
            script = base64.b64decode(resource["properties"]["osProfile"].pop("customData")).decode()
            self.custom_data[name] = script
            power = "PowerState/stopped" if self.ends_by_itself(script) else "PowerState/running"
            resource["properties"]["instanceView"] = {
                "statuses": [
                    {"code": "ProvisioningState/succeeded", "level": "Info"},
                    {"code": power, "level": "Info"},
                ]
            }
            resource["properties"]["vmId"] = f"vm-{next(self._ids)}"
        final: dict[str, Any] = {"status": "Succeeded"}
        if kind == "vm" and self.async_error is not None:
            final = {
                "status": "Failed",
                "error": {
                    "code": self.async_error,
                    "message": "Allocation failed. We do not have sufficient capacity for the requested VM "
                    "size in this region.",
                },
            }
            self.async_error = None
            resource["properties"]["provisioningState"] = "Failed"
            resource["properties"]["instanceView"] = {
                "statuses": [{"code": "ProvisioningState/failed/AllocationFailed", "level": "Error"}]
            }
        created = (kind, name) not in self.resources
        self.resources[(kind, name)] = resource
        answer = copy.deepcopy(resource)
        answer["properties"]["provisioningState"] = "Creating" if created else "Updating"
        answer["properties"].pop("instanceView", None)
        return (
            201 if created else 200,
            self._operation(body["location"], namespace, final),
            json.dumps(answer),
        )

    def _get(self, kind: str, name: str, expand: bool = False) -> Reply:
        """The resource; a VM's ``instanceView`` (its power state) only with ``$expand=instanceView``."""
        resource = self.resources.get((kind, name))
        if resource is not None and not expand:
            resource = _without_instance_view(resource)
        if resource is None:
            return _error(
                404,
                "ResourceNotFound",
                f"The Resource '{PATHS[kind]}/{name}' under resource group '{GROUP}' was not found.",
            )
        return 200, {}, json.dumps(resource)

    def _delete(self, kind: str, name: str) -> Reply:
        resource = self.resources.pop((kind, name), None)
        if resource is None:
            return self._get(kind, name)
        if kind == "vm":  # deleteOption=Delete on the NIC reference: the NIC goes with the VM
            for nic in resource["properties"]["networkProfile"]["networkInterfaces"]:
                if nic["properties"]["deleteOption"] == "Delete":
                    self.resources.pop(("nic", nic["id"].rsplit("/", 1)[-1]), None)
        return (
            202,
            self._operation(resource["location"], PATHS[kind].split("/")[0], {"status": "Succeeded"}),
            "",
        )

    def _list(self, request: Any) -> Reply:
        value = [_without_instance_view(r) for (kind, _), r in sorted(self.resources.items()) if kind == "vm"]
        return 200, {}, json.dumps({"value": value})
