"""The ``azure`` provider: Azure VMs (Spot or regular) that run the job's agent.

One launch creates two resources in the resource group ``azure_resource_group``: a NIC in the
subnet ``azure_subnet_id`` (no public IP), then the VM. Both are ARM PUTs, and a PUT of the same
resource name is idempotent by design (create or update), so the VM name, derived from the
idempotency key, is what makes a retried launch land on the same VM; the launch reads the VM
first and returns it when it exists, so a retry never re-sends a body to a running VM.

- Spot markets: ``priority=Spot``, ``evictionPolicy=Delete`` ("the evicted VMs are deleted
  together with their underlying disks": Azure docs, "Azure Spot Virtual Machines"; the next
  placement resumes from the store), ``billingProfile.maxPrice``: the job's cap
  (``LaunchSpec.max_usd_per_instance_hour`` as ``base.price_cap`` rounds it) when it has a
  ``max_usd_per_hour``, else -1 (pay up to the on-demand price: evicted for capacity, never for
  price). maxPrice "is in US Dollars", Azure evicts the VM "if the current Azure Spot price goes
  beyond the maxPrice" (azure-mgmt-compute ``BillingProfile.max_price``), and a create while the
  price is above it fails with ``SpotPriceGreaterThanProvidedMaxPrice`` ("Error messages for
  Azure Spot Virtual Machines and scale sets"): the market is out of reach at this cap, a
  ``CapacityUnavailableError`` like a capacity shortfall. Other markets: ``priority=Regular``.
- The NIC reference and the OS disk have ``deleteOption=Delete``, so deleting the VM deletes
  them; ``terminate`` also deletes the NIC explicitly, whether or not the VM is still there: an
  eviction deletes the VM and its disks, and the docs promise nothing for the NIC, which keeps
  an address of the subnet; a NIC left by a failed create must not outlive the placement either.
  ``list_instances`` lists such orphan NICs (tagged like their VM) as instances of their own.
- The throwaway admin key is ssh-rsa of 3072 bits: ``SshPublicKey.keyData`` "needs to be at
  least 2048-bit and in ssh-rsa format" (Azure Compute REST reference).
- ``customData`` is the base64 of the start-up script (a ``#!`` script cloud-init runs at first
  boot); the VM runs as the user-assigned identity ``azure_identity_id``, which is the agent's
  only credential for the store.
- Tags (names may contain ``:``; ``<>%&\\?/`` are not allowed and become ``_``):
  ``spotopt:job``, ``spotopt:epoch``, ``spotopt:key``, ``spotopt:market``, ``spotopt:launched``,
  ``spotopt:tags`` (the spec's tags as JSON, exact), ``spotopt:move`` (when the spec's tags carry
  ``move``) and the spec's tags themselves.

Capacity and price errors (``CAPACITY_CODES``: ``SkuNotAvailable``,
``OverconstrainedAllocationRequest``, ``ZonalAllocationFailed``, ``AllocationFailed``, the Spot
codes ``SpotPriceGreaterThanProvidedMaxPrice`` and ``AzureSpotIsNotSupportedForThisVMSize``, …)
become ``CapacityUnavailableError`` after the NIC (and a VM left in a failed state) is deleted;
a launch that fails for any other reason is cleaned up the same way.

Status and eviction: with ``evictionPolicy=Delete`` an evicted VM disappears, so absence alone
cannot tell eviction from our own delete. The rule: a VM this provider object deleted is
``TERMINATED``; a Spot VM it launched (or listed, or saw live) that is ``Deleting`` or gone
without our delete was evicted: ``PREEMPTED``; any other unknown name is ``GONE`` (after a
daemon restart the journal knows what it launched and terminated: a journaled live instance
reported ``GONE`` was lost, the same as preempted).

Billing (Azure docs, "States and billing status of Azure Virtual Machines"): a VM the guest
powered off is ``PowerState/stopped``, still allocated and billed as running, until it is
deallocated or deleted; a deallocated VM bills its disks. So an ended VM that exists bills
``COMPUTE`` (stopped) or ``STORAGE`` (deallocated, failed), and a NIC without its VM
``STORAGE``: ``terminate`` deletes them all.

SDK versions: the bodies sent are the ARM REST JSON (the msrest serializer of the older
azure-mgmt-compute/-network accepts them as it accepts models, the TypeSpec models of the newer
ones are that JSON), and every answer is read as REST JSON through ``AzureClients`` (which
converts either kind of model), so the code runs on every version the ``azure`` extra allows;
CI runs these tests on the floor versions (``.ci/sdk-floors``).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import partial
from typing import Any

from spotopt.cloud_calls import Retry
from spotopt.clouds.azure.adaptor import AzureClients
from spotopt.clouds.common.base import (
    Billing,
    Instance,
    InstanceState,
    InstanceStatus,
    LaunchSpec,
    market_label,
    matches,
    price_cap,
    sorted_instances,
)
from spotopt.clouds.common.bootstrap import render_script
from spotopt.clouds.common.calls import ScriptRenderer, after_delete, none_if_missing, provider_call
from spotopt.clouds.common.naming import resource_name
from spotopt.errors import ConfigError, ProviderError
from spotopt.settings import Settings
from spotopt.types import MarketKey, MarketKind

CAPACITY_CODES = frozenset(
    {
        "SkuNotAvailable",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "ZonalAllocationFailed",
        "AllocationFailed",
        "SpotPriceGreaterThanProvidedMaxPrice",
        "AzureSpotIsNotSupportedForThisVMSize",
    }
)
"""ARM error codes meaning "not this market for this launch now": no capacity for the size
here, or (the two Spot codes of "Error messages for Azure Spot Virtual Machines and scale
sets") a Spot price above the job's cap, a size that takes no Spot VM."""
RSA_BITS = 3072
"""The throwaway key's size: ssh-rsa of at least 2048 bits is what the API reference asks."""
TAG = "spotopt:"
NIC_SUFFIX = "-nic"
"""A VM's NIC is named after it: ``<vm>-nic``."""
TAG_VALUE_MAX = 256
_BAD_TAG_NAME = re.compile(r"[<>%&\\?/]")
POWER = {
    "PowerState/starting": InstanceState.PENDING,
    "PowerState/running": InstanceState.RUNNING,
}
"""Power states of a live VM; stopping/stopped (the guest powered off after the job) and
deallocating/deallocated are a VM whose job ended."""
ALLOCATED = frozenset({"PowerState/stopping", "PowerState/stopped"})
"""Power states of an ended VM that is still allocated, so billed as running (module doc)."""
URN = re.compile(r"(?P<publisher>[^:\s]+):(?P<offer>[^:\s]+):(?P<sku>[^:\s]+):(?P<version>[^:\s]+)")


def _capacity_code(exc: BaseException) -> str | None:
    """The capacity code of an ARM error (``error.code`` or one of ``error.details[].code``);
    an LRO that failed carries it in the status body, which azure-core puts in the message."""
    error = getattr(exc, "error", None)
    codes = [getattr(error, "code", None)]
    codes += [getattr(d, "code", None) for d in getattr(error, "details", None) or []]
    for code in codes:
        if code in CAPACITY_CODES:
            return str(code)
    text = str(exc)
    return next((code for code in sorted(CAPACITY_CODES) if code in text), None)


def _image_reference(image: str) -> dict[str, str]:
    if image.startswith("/"):
        return {"id": image}
    urn = URN.fullmatch(image)
    if urn is None:
        raise ConfigError(
            f"azure_image {image!r} is neither a URN (publisher:offer:sku:version) nor a resource id; "
            "fix SPOTOPT_AZURE_IMAGE"
        )
    return urn.groupdict()


def _throwaway_ssh_key() -> str:
    """An OpenSSH ssh-rsa public key whose private half is never kept: Azure wants a key when
    password login is off, and nobody needs to log in to a worker (set ``azure_ssh_public_key``
    to). RSA of ``RSA_BITS``: the format and size the API reference asks for (module doc)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    public = rsa.generate_private_key(public_exponent=65537, key_size=RSA_BITS).public_key()
    raw = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return raw.decode() + " spotopt-throwaway"


class AzureProvider:
    """Launches, watches and deletes Azure VMs; see the module docstring.

    ``clients``, ``script`` and ``retry`` are the seams tests replace; ``poll_s`` is the
    long-running operations' polling interval (0 in tests).
    """

    name = "azure"
    runs_on_market = True

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        script: ScriptRenderer | None = None,
        clients: AzureClients | None = None,
        retry: Retry | None = None,
        poll_s: float = 5.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        settings = settings or Settings()
        self.group = settings.require("azure_resource_group", "the resource group VMs are created in")
        self.subnet_id = settings.require("azure_subnet_id", "the resource id of the subnet VMs join")
        self.image = _image_reference(
            settings.require("azure_image", "an image URN (publisher:offer:sku:version) or resource id")
        )
        self.identity_id = settings.require(
            "azure_identity_id", "the resource id of the user-assigned managed identity VMs run as"
        )
        self.admin = settings.azure_admin_username
        self.ssh_key = settings.azure_ssh_public_key
        self.clients = clients or AzureClients()
        self.script = script or partial(render_script, settings=settings)
        self.retry = retry or Retry()
        self.poll_s = poll_s
        self.now = now
        self._spot: set[str] = set()
        """Spot VMs seen by this object: their disappearance without our delete is an eviction."""
        self._terminated: set[str] = set()
        self._ended: dict[str, InstanceStatus] = {}

    # -- Provider ---------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        if not spec.command:
            raise ProviderError(f"job {spec.job}: the launch spec has no command")
        name = resource_name(idempotency_key)
        existing = self._get(name)
        if existing is not None:
            instance = self._instance(existing)
            if instance is None or instance.idempotency_key != idempotency_key:
                raise ProviderError(f"azure: VM {name} exists and was not launched for this key")
            return instance
        label = market_label(market)
        tags = self._tags(spec, market, idempotency_key)
        try:
            nic = self._call(
                "networkInterfaces.createOrUpdate",
                lambda: self.clients.create_nic(
                    self.group, name + NIC_SUFFIX, self._nic(market, tags), self.poll_s
                ),
            )
            body = self._vm(spec, market, name, tags, nic["id"])
            vm = provider_call(
                self.retry,
                "azure",
                "virtualMachines.createOrUpdate",
                lambda: self.clients.create_vm(self.group, name, body, self.poll_s),
                _capacity_code,
                label,
            )
        except Exception as exc:  # a ProviderError, or anything else: the NIC must not stay
            try:  # no NIC (or failed VM) outlives a launch that did not happen
                self._delete(name)
            except ProviderError as cleanup:  # keep the launch's error (capacity stays capacity)
                exc.add_note(f"and cleaning up {name} failed: {cleanup}")
            raise
        if market.kind is MarketKind.SPOT:
            self._spot.add(name)
        instance = self._instance(vm)
        assert instance is not None, "the VM was created with spotopt's tags"
        return instance

    def status(self, instance_id: str) -> InstanceStatus:
        vm = self._get(instance_id)
        if vm is None:
            return self._absent(instance_id)
        instance = self._instance(vm)
        if instance is None:
            return InstanceStatus(None, instance_id, InstanceState.GONE, detail="not launched by spotopt")
        props = vm["properties"]
        spot = props.get("priority") == "Spot"
        if spot:
            self._spot.add(instance_id)
        provisioning = props.get("provisioningState", "")
        statuses = [s.get("code", "") for s in (props.get("instanceView") or {}).get("statuses", [])]
        power = next((c for c in statuses if c.startswith("PowerState/")), "")
        detail = f"{provisioning} {power}".strip()
        if provisioning == "Deleting":  # by us, or Azure evicting a Spot VM (eviction policy Delete)
            if instance_id in self._terminated or not spot:
                return InstanceStatus(instance, instance_id, InstanceState.TERMINATED, detail=detail)
            return InstanceStatus(instance, instance_id, InstanceState.PREEMPTED, detail=detail)
        left = Billing.COMPUTE if power in ALLOCATED else Billing.STORAGE  # module doc: billing
        if provisioning == "Failed":
            return InstanceStatus(instance, instance_id, InstanceState.EXITED, detail=detail, leftover=left)
        if not power or power in POWER:  # no power state yet: still being created
            return InstanceStatus(
                instance, instance_id, POWER.get(power, InstanceState.PENDING), detail=detail
            )
        return InstanceStatus(instance, instance_id, InstanceState.EXITED, detail=detail, leftover=left)

    def terminate(self, instance_id: str) -> InstanceStatus:
        """Delete the VM (its NIC and OS disk go with it), then the NIC explicitly, also when the
        VM is gone already (evicted: its NIC stays); idempotent. A VM whose job had ended keeps
        the state it ended in. A VM or NIC spotopt did not launch is left alone."""
        before = self.status(instance_id)
        if before.instance is None:
            return before
        self._terminated.add(instance_id)
        self._delete(instance_id)
        return after_delete(before, self._ended)

    def check(self) -> None:
        """The subscription, checked without an API call (the settings were checked when this
        was built): ``MissingCredentials`` says what to configure. ``DefaultAzureCredential``
        only tries its sources at the first call, so bad credentials show up there."""
        self.clients.subscription()

    def list_instances(self, job: str | None = None, tags: Mapping[str, str] | None = None) -> list[Instance]:
        """The resource group's VMs that carry spotopt's key tag, and the NICs so tagged whose VM
        is gone (an eviction leaves them), filtered by job and tags."""
        vms = self._call("virtualMachines.list", lambda: self.clients.list_vms(self.group))
        found: dict[str, Instance] = {}
        for vm in vms:
            instance = self._instance(vm)
            if instance is not None:
                if (vm.get("properties") or {}).get("priority") == "Spot":
                    self._spot.add(instance.instance_id)
                found[instance.instance_id] = instance
        nics = self._call("networkInterfaces.list", lambda: self.clients.list_nics(self.group))
        for nic in nics:
            orphan = self._instance(nic, str(nic["name"]).removesuffix(NIC_SUFFIX))
            if orphan is not None and orphan.instance_id not in found:
                found[orphan.instance_id] = orphan
        return sorted_instances([i for i in found.values() if matches(i, job, tags)])

    # -- internals -----------------------------------------------------------------------------

    def _call(self, api: str, fn: Callable[[], Any]) -> Any:
        return provider_call(self.retry, "azure", api, fn)

    def _get(self, name: str) -> Any | None:
        return self._call(
            "virtualMachines.get",
            lambda: none_if_missing(lambda: self.clients.get_vm(self.group, name)),
        )

    def _delete(self, name: str) -> None:
        self._call(
            "virtualMachines.delete",
            lambda: none_if_missing(lambda: self.clients.delete_vm(self.group, name, self.poll_s)),
        )
        self._call(
            "networkInterfaces.delete",
            lambda: none_if_missing(
                lambda: self.clients.delete_nic(self.group, name + NIC_SUFFIX, self.poll_s)
            ),
        )

    def _absent(self, name: str) -> InstanceStatus:
        """A VM name the group has no VM of: how it ended, and whether its NIC is still there."""
        nic = self._call(
            "networkInterfaces.get",
            lambda: none_if_missing(lambda: self.clients.get_nic(self.group, name + NIC_SUFFIX)),
        )
        orphan = self._instance(nic, name) if nic is not None else None
        if orphan is not None:
            self._terminated.discard(name)  # our delete did not finish: it is to be done again
            self._ended.pop(name, None)
            left = Billing.STORAGE
        else:
            left = Billing.NONE
        if name in self._ended:
            return self._ended[name]
        if name in self._terminated:
            return InstanceStatus(None, name, InstanceState.TERMINATED, detail="deleted")
        if name in self._spot:
            detail = "evicted (Spot VM deleted)" + (", its NIC left" if orphan else "")
            return InstanceStatus(orphan, name, InstanceState.PREEMPTED, detail=detail, leftover=left)
        if orphan is not None:
            return InstanceStatus(
                orphan, name, InstanceState.GONE, detail="no VM, its NIC left", leftover=left
            )
        return InstanceStatus(None, name, InstanceState.GONE, detail="no such Azure VM")

    def _tags(self, spec: LaunchSpec, market: MarketKey, key: str) -> dict[str, str]:
        tags = {_BAD_TAG_NAME.sub("_", k): v for k, v in spec.tags.items()}
        tags |= {
            f"{TAG}job": spec.job,
            f"{TAG}epoch": str(spec.epoch),
            f"{TAG}key": key,
            f"{TAG}market": market_label(market),
            f"{TAG}launched": self.now().isoformat(),
            f"{TAG}tags": json.dumps(dict(spec.tags), sort_keys=True),
        }
        if "move" in spec.tags:  # the daemon's move id, tagged like on AWS and GCP
            tags[f"{TAG}move"] = spec.tags["move"]
        for name, value in tags.items():
            if len(value) > TAG_VALUE_MAX:
                raise ProviderError(
                    f"azure: tag {name} is {len(value)} characters; Azure allows {TAG_VALUE_MAX}"
                )
        return tags

    def _nic(self, market: MarketKey, tags: dict[str, str]) -> dict[str, Any]:
        config = {"subnet": {"id": self.subnet_id}, "privateIPAllocationMethod": "Dynamic"}
        return {
            "location": market.region,
            "tags": tags,
            "properties": {"ipConfigurations": [{"name": "ipconfig1", "properties": config}]},
        }

    def _vm(
        self, spec: LaunchSpec, market: MarketKey, name: str, tags: dict[str, str], nic_id: str
    ) -> dict[str, Any]:
        script = self.script(spec, market).encode()
        key = self.ssh_key or _throwaway_ssh_key()
        props: dict[str, Any] = {
            "hardwareProfile": {"vmSize": market.instance_type},
            "priority": "Regular",
            "storageProfile": {
                "imageReference": self.image,
                "osDisk": {"createOption": "FromImage", "deleteOption": "Delete"},
            },
            "osProfile": {
                "computerName": name,
                "adminUsername": self.admin,
                "customData": base64.b64encode(script).decode(),
                "linuxConfiguration": {
                    "disablePasswordAuthentication": True,
                    "ssh": {
                        "publicKeys": [{"path": f"/home/{self.admin}/.ssh/authorized_keys", "keyData": key}]
                    },
                },
            },
            "networkProfile": {
                "networkInterfaces": [
                    {"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}
                ]
            },
        }
        if market.kind is MarketKind.SPOT:
            cap = price_cap(spec)
            billing = {"maxPrice": float(cap) if cap is not None else -1}
            props |= {"priority": "Spot", "evictionPolicy": "Delete", "billingProfile": billing}
        body: dict[str, Any] = {
            "location": market.region,
            "tags": tags,
            "identity": {"type": "UserAssigned", "userAssignedIdentities": {self.identity_id: {}}},
            "properties": props,
        }
        if market.zone:
            body["zones"] = [market.zone]
        return body

    @staticmethod
    def _instance(resource: Any, name: str | None = None) -> Instance | None:
        """The spotopt instance a VM (or its NIC, carrying the same tags: ``name`` is then the
        VM's) is, from its tags; None for a resource spotopt did not launch."""
        tags = resource.get("tags") or {}
        if f"{TAG}key" not in tags:
            return None
        return Instance(
            instance_id=name or resource["name"],
            provider="azure",
            job=tags[f"{TAG}job"],
            epoch=int(tags[f"{TAG}epoch"]),
            market=tags[f"{TAG}market"],
            idempotency_key=tags[f"{TAG}key"],
            launched_at=datetime.fromisoformat(tags[f"{TAG}launched"]),
            tags=json.loads(tags.get(f"{TAG}tags", "{}")),
        )
