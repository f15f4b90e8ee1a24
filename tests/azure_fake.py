"""A stateful fake of Azure Resource Manager (VMs and NICs) behind ``responses``, for the Azure provider.

Shapes follow the ARM REST reference (Virtual Machines - Create Or Update / Get / Delete / List,
Network Interfaces - Create Or Update / Delete) and the long-running-operation protocol: a PUT
answers 201 with ``provisioningState`` ``Creating`` and an ``Azure-AsyncOperation`` URL whose
status is ``InProgress`` on the first poll and ``Succeeded`` (or ``Failed`` with the ARM error)
on the next; the poller then GETs the resource. DELETE answers 202 with the same protocol, or
404 ``ResourceNotFound`` for a resource that does not exist. ``customData`` is write-only, as
in ARM: kept by the fake, never returned. A VM's ``instanceView`` (its power state) is only in
a GET with ``$expand=instanceView``, as in ARM (a list or plain GET leaves it out).

What the documentation says Azure does, and the fake does too:

- ``SshPublicKey.keyData`` "needs to be at least 2048-bit and in ssh-rsa format" (Compute REST
  reference); the SSH key guide also lists ED25519 keys. Any other key is refused with 400
  ``InvalidParameter`` naming the field.
- Spot errors ("Error messages for Azure Spot Virtual Machines and scale sets"): a Spot VM whose
  ``billingProfile.maxPrice`` is below the current Spot price (``spot_price``) is refused with
  ``SpotPriceGreaterThanProvidedMaxPrice``; a size in ``no_spot_sizes`` with
  ``AzureSpotIsNotSupportedForThisVMSize``.
- Eviction with ``evictionPolicy=Delete``: "the evicted VMs are deleted together with their
  underlying disks" (Azure Spot Virtual Machines); nothing is said of the NIC, which the fake
  keeps, with its subnet address.
- Deleting a VM deletes its OS disk and NIC only when their ``deleteOption`` is ``Delete``.
- A VM the guest powered off is ``PowerState/stopped``: still allocated and billed as running
  until deallocated or deleted ("States and billing status of Azure Virtual Machines").
  ``billing()`` lists what of ours costs money: VMs, OS disks and NICs.

References: https://learn.microsoft.com/en-us/rest/api/compute/virtual-machines/create-or-update
(and ``…/get``, ``/delete``, ``/list``), https://learn.microsoft.com/en-us/rest/api/virtualnetwork/network-interfaces/create-or-update,
https://learn.microsoft.com/en-us/azure/azure-resource-manager/management/async-operations,
https://learn.microsoft.com/en-us/azure/virtual-machines/error-codes-spot,
https://learn.microsoft.com/en-us/azure/virtual-machines/states-billing.
"""

from __future__ import annotations

import base64
import copy
import functools
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
MIN_RSA_BITS = 2048


@functools.cache
def admin_key() -> str:
    """A real ed25519 OpenSSH public key for test settings (``azure_ssh_public_key``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    public = ed25519.Ed25519PrivateKey.generate().public_key()
    raw = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return raw.decode() + " ops@example"


def key_refusal(key: str) -> str:
    """Why Azure refuses ``key`` as ``keyData`` ('' when it takes it: module doc)."""
    from cryptography.hazmat.primitives.asymmetric import ed25519, rsa
    from cryptography.hazmat.primitives.serialization import load_ssh_public_key

    try:
        public = load_ssh_public_key(key.encode())
    except (ValueError, TypeError):
        return "not an OpenSSH public key"
    if isinstance(public, rsa.RSAPublicKey):
        return "" if public.key_size >= MIN_RSA_BITS else f"an RSA key of {public.key_size} bits"
    return "" if isinstance(public, ed25519.Ed25519PublicKey) else f"a {type(public).__name__}"


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
    spot_price: float = 0.2
    """The current Spot price (USD/h): a lower ``maxPrice`` (but -1) is refused (module doc)."""
    no_spot_sizes: set[str] = field(default_factory=set)
    """VM sizes that take no Spot VM."""
    log: list[Exchange] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def install(self, rsps: responses.RequestsMock) -> None:
        self.rsps = rsps
        for kind, path in PATHS.items():
            url = re.compile(rf"{re.escape(RG)}/providers/{path}/(?P<name>[^/?]+)(\?.*)?$")
            for method in ("PUT", "GET", "DELETE"):
                handler = self._logged(self._route(url, method, kind))
                rsps.add_callback(method, url, callback=handler, content_type="application/json")
        for kind, path in PATHS.items():
            listing = re.compile(rf"{re.escape(RG)}/providers/{path}(\?.*)?$")
            handler = self._logged(lambda request, kind=kind: self._list(kind))
            rsps.add_callback("GET", listing, callback=handler, content_type="application/json")
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
        """A Spot eviction with eviction policy Delete: the VM and its disk are deleted, its NIC
        stays (module doc)."""
        del self.resources[("vm", name)]
        self.resources.pop(("disk", f"{name}-osdisk"), None)

    def power_off(self, name: str) -> None:
        """The guest shut down: ``PowerState/stopped``, still allocated (module doc)."""
        statuses = self.resources[("vm", name)]["properties"]["instanceView"]["statuses"]
        for status in statuses:
            if status["code"].startswith("PowerState/"):
                status["code"] = "PowerState/stopped"

    def billing(self) -> list[str]:
        """What of ours costs money: every VM (running or stopped: allocated), disk and NIC."""
        return [f"{kind} {name}" for kind, name in sorted(self.resources)]

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

    def _refusal(self, body: dict[str, Any]) -> Reply | None:
        """The documented refusal of a VM body (module doc), or None."""
        props = body["properties"]
        size, location = props["hardwareProfile"]["vmSize"], body["location"]
        if self.sync_error is not None:
            status, code = self.sync_error
            self.sync_error = None
            message = f"The requested VM size {size} is currently not available in location '{location}'."
            return _error(status, code, message)
        for key in props["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"]:
            if why := key_refusal(key["keyData"]):
                message = (
                    f"The value of parameter linuxConfiguration.ssh.publicKeys.keyData is invalid ({why})."
                )
                return _error(400, "InvalidParameter", message)
        if props.get("priority") != "Spot":
            return None
        if size in self.no_spot_sizes:
            return _error(
                409,
                "AzureSpotIsNotSupportedForThisVMSize",
                f"This VM size {size} is not supported for Azure Spot Virtual Machine.",
            )
        cap = props.get("billingProfile", {}).get("maxPrice", -1)
        if cap != -1 and cap < self.spot_price:
            return _error(
                409,
                "SpotPriceGreaterThanProvidedMaxPrice",
                f"Unable to perform operation 'Create VM' since the provided max price '{cap} USD' is lower "
                f"than the current spot price '{self.spot_price} USD' for Azure Spot VM size '{size}'.",
            )
        return None

    def _put(self, kind: str, name: str, body: dict[str, Any]) -> Reply:
        namespace = PATHS[kind].split("/")[0]
        if kind == "vm" and (refused := self._refusal(body)) is not None:
            return refused
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
        if kind == "vm":  # its OS disk, a resource of its own
            self.resources[("disk", f"{name}-osdisk")] = {"name": f"{name}-osdisk", "properties": {}}
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
        if kind == "vm":  # deleteOption=Delete: the NIC and the OS disk go with the VM
            for nic in resource["properties"]["networkProfile"]["networkInterfaces"]:
                if nic.get("properties", {}).get("deleteOption") == "Delete":
                    self.resources.pop(("nic", nic["id"].rsplit("/", 1)[-1]), None)
            os_disk = resource["properties"].get("storageProfile", {}).get("osDisk", {})
            if os_disk.get("deleteOption") == "Delete":
                self.resources.pop(("disk", f"{name}-osdisk"), None)
        return (
            202,
            self._operation(resource["location"], PATHS[kind].split("/")[0], {"status": "Succeeded"}),
            "",
        )

    def _list(self, kind: str) -> Reply:
        value = [_without_instance_view(r) for (k, _), r in sorted(self.resources.items()) if k == kind]
        return 200, {}, json.dumps({"value": value})
