"""GCP collectors: GPU machine types and accelerators (Compute Engine), prices (Cloud Billing Catalog).

Both APIs answer for every region at once (aggregated lists; one SKU list for the whole
service), so both collectors run one ``global`` scope and keep the requested regions.

GCP sells no "machine type" SKU: a machine's hourly price is
vCPUs × the family's core SKU + GiB × its RAM SKU + GPUs × the GPU SKU, per region and per
usage type (``OnDemand``; ``Preemptible`` is what Spot VMs pay). The catalog answers with the
latest prices only, so the collector is ``only_changes``: a price is stored when it differs from
the last one stored for that market.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from spotopt.catalog import GCP_ATTACHED_GPUS, canonical_gpu, gpu_models
from spotopt.clouds.registry import register_collector
from spotopt.collectors.base import Collector
from spotopt.price import quoted
from spotopt.types import InstanceTypeSpec, MarketKey, MarketKind, PriceObservation, Record, Rejection

NEEDS = "Application Default Credentials (gcloud auth application-default login) and GOOGLE_CLOUD_PROJECT"
# "Spot Preemptible A2 Instance Core running in Americas", "N1 Predefined Instance Ram running in …"
_CORE_RAM = re.compile(
    r"^(?:Spot )?(?:Preemptible )?(?P<family>[A-Z][A-Z0-9]*) (?:Predefined )?Instance (?P<what>Core|Ram)"
    r" running in ",
    re.IGNORECASE,
)
# "Nvidia Tesla V100 GPU running in …", "Spot Preemptible Nvidia L4 GPU running in …",
# "Nvidia Tesla T4 GPU attached to Spot Preemptible VMs running in …" (older naming).
_GPU = re.compile(
    r"^(?:Spot )?(?:Preemptible )?Nvidia (?P<gpu>.+?) GPU(?: attached to (?:Spot )?Preemptible VMs)?"
    r" running in ",
    re.IGNORECASE,
)
_UNITS = {"core": "h", "ram": "GiBy.h", "gpu": "h"}
_USAGE = {"OnDemand": MarketKind.ON_DEMAND, "Preemptible": MarketKind.SPOT}


def gpu_key(name: str) -> frozenset[str]:
    """A GPU's identity across the two APIs' spellings: accelerator type ``nvidia-h100-mega-80gb``
    and SKU text ``H100 80GB Mega`` both give {h100, 80gb, mega}."""
    words = re.split(r"[\s_-]+", name.lower())
    return frozenset(w for w in words if w and w not in ("nvidia", "tesla"))


def region_of(zone: str) -> str:
    """``us-central1-a`` → ``us-central1``; a scope ``zones/us-central1-a`` works too."""
    return zone.rsplit("/", 1)[-1].rsplit("-", 1)[0]


def family_of(machine: str) -> str:
    """``a2-highgpu-1g`` → ``A2`` (the SKU descriptions' family name)."""
    return machine.split("-", 1)[0].upper()


def gpu_spec(accelerator: str, count: float) -> tuple[str | None, float | None, str | None]:
    """(canonical GPU, total GPU memory GiB, raw name if unknown) of ``count`` × ``accelerator``."""
    model = canonical_gpu(accelerator)
    if model is None:
        return None, None, accelerator
    return model, gpu_models()[model].memory_gib * count, None


@dataclass(frozen=True)
class Machine:
    """A priced shape: a machine type, plus attached GPUs for N1 combinations."""

    name: str
    family: str
    vcpus: int
    memory_gib: float
    accelerator: str | None
    gpu_count: int


class GcpCollector(Collector):
    cloud = "gcp"
    needs = NEEDS
    global_scope = True

    def machine_types(self) -> dict[str, dict[str, Any]]:
        """zone → machine name → MachineType, from all pages of ``machineTypes.aggregatedList``."""
        return self.memo(("gcp-machine-types",), lambda: self._aggregated("machine"))

    def accelerator_types(self) -> dict[str, dict[str, Any]]:
        """zone → accelerator name → AcceleratorType."""
        return self.memo(("gcp-accelerator-types",), lambda: self._aggregated("accel"))

    def _aggregated(self, kind: str) -> dict[str, dict[str, Any]]:
        by_zone: dict[str, dict[str, Any]] = defaultdict(dict)
        token, seen = "", set[str]()
        while True:
            if kind == "machine":
                page = self.call(
                    "compute.machineTypes.aggregatedList", self.clients.machine_types_page, token
                )
            else:
                page = self.call(
                    "compute.acceleratorTypes.aggregatedList",
                    self.clients.accelerator_types_page,
                    token,
                )
            for scope, scoped in page.items.items():
                listed = scoped.machine_types if kind == "machine" else scoped.accelerator_types
                zone = scope.rsplit("/", 1)[-1]
                for item in listed:
                    by_zone[zone][item.name] = item
            token = self.next_token(f"aggregatedList {kind}", seen, page.next_page_token) or ""
            if not token:
                return dict(by_zone)


@register_collector
class GcpCatalog(GcpCollector):
    """Machine types with built-in GPUs (A2, A3, G2 …); unknown accelerator names are reported."""

    name = "gcp-catalog"
    collects = "the GPU machine catalog"

    def collect(self, since: datetime | None) -> Iterator[Record]:
        seen: set[str] = set()
        for zone, machines in sorted(self.machine_types().items()):
            if not self.ctx.wants_region(region_of(zone)):
                continue
            for name, machine in sorted(machines.items()):
                if name in seen or not machine.accelerators:
                    continue
                seen.add(name)
                accel = machine.accelerators[0]
                count = float(sum(a.guest_accelerator_count for a in machine.accelerators))
                model, memory, raw = gpu_spec(accel.guest_accelerator_type, count)
                if self.ctx.gpus and not self.ctx.wants_gpu(model):
                    continue
                yield InstanceTypeSpec(
                    cloud="gcp",
                    name=name,
                    gpu_model=model,
                    gpu_count=count,
                    gpu_memory_gib=memory,
                    vcpus=int(machine.guest_cpus),
                    memory_gib=machine.memory_mb / 1024,
                    gpu_name_raw=raw,
                )
        unknown = sorted(
            {
                name
                for zone, accels in self.accelerator_types().items()
                if self.ctx.wants_region(region_of(zone))
                for name in accels
                if canonical_gpu(name) is None
            }
        )
        if unknown:
            self.notes.append(f"accelerator types with no known GPU model: {', '.join(unknown)}")


@dataclass
class _Rate:
    usd: float
    effective: datetime


def _unit_price(sku: Any) -> tuple[float, datetime] | str:
    """The first-tier price of a SKU's latest pricing info and when it took effect, or why the SKU
    is unusable. A SKU without an effective time is refused: dating its price "now" would store a
    new point on every run."""
    if not sku.pricing_info:
        return "unusable price"
    info = sku.pricing_info[-1]
    rates = [r for r in info.pricing_expression.tiered_rates if r.start_usage_amount == 0]
    if not rates:
        return "unusable price"
    effective = info.effective_time
    if not isinstance(effective, datetime):
        return "no effective time"
    price = rates[0].unit_price
    return int(price.units) + price.nanos / 1e9, effective.astimezone(UTC)


RateKey = tuple[str, MarketKind, str, Any]
"""(region, kind, "core"|"ram"|"gpu", family or GPU key)."""


@register_collector
class GcpPrices(GcpCollector):
    """On-demand and spot prices of GPU machines per region, summed from the billing SKUs."""

    name = "gcp-prices"
    collects = "on-demand and spot prices (Cloud Billing Catalog)"
    needs = "Billing Catalog access: SPOTOPT_GCP_API_KEY or Application Default Credentials"
    only_changes = True

    def collect(self, since: datetime | None) -> Iterator[Record]:
        rates, conflicts, rejections = self._rates()
        yield from rejections
        for region, machines in sorted(self._machines_by_region().items()):
            for machine in machines:
                for kind in (MarketKind.ON_DEMAND, MarketKind.SPOT):
                    yield self._price(region, machine, kind, rates, conflicts)

    def _rates(self) -> tuple[dict[RateKey, _Rate], set[RateKey], list[Rejection]]:
        """Price per unit and hour of each ``RateKey``; the keys two SKUs price differently
        (neither can be trusted, so machines that need them are rejected); the rejected SKUs."""
        rates: dict[RateKey, _Rate] = {}
        first_sku: dict[RateKey, str] = {}
        conflicts: set[RateKey] = set()
        rejections: list[Rejection] = []
        token, seen = "", set[str]()
        while True:
            page = self.call("cloudbilling.services.skus.list", self.clients.skus_page, token)
            for sku in page.skus:
                kind = _USAGE.get(sku.category.usage_type)
                if kind is None:
                    continue
                description = sku.description
                if match := _CORE_RAM.match(description):
                    what, key = match["what"].lower(), match["family"].upper()
                elif match := _GPU.match(description):
                    what, key = "gpu", gpu_key(match["gpu"])
                else:
                    continue
                priced = _unit_price(sku)
                unit = sku.pricing_info[-1].pricing_expression.usage_unit if sku.pricing_info else ""
                if isinstance(priced, str) or unit != _UNITS[what]:
                    reason = priced if isinstance(priced, str) else "unusable price"
                    rejections.append(Rejection(f"SKU {sku.sku_id} {description!r}", reason))
                    continue
                rate, clashes = _Rate(*priced), []
                for region in sku.service_regions:
                    rate_key = (region, kind, what, key)
                    if not self.ctx.wants_region(region):
                        continue
                    known = rates.get(rate_key)
                    if known is None:
                        rates[rate_key], first_sku[rate_key] = rate, sku.sku_id
                    elif known.usd != rate.usd:
                        conflicts.add(rate_key)
                        clashes.append(f"{region} (SKU {first_sku[rate_key]})")
                if clashes:
                    rejections.append(
                        Rejection(
                            f"SKU {sku.sku_id} {description!r}: another price for {', '.join(clashes)}"[:300],
                            "conflicting SKU",
                        )
                    )
            token = self.next_token("cloudbilling.services.skus.list", seen, page.next_page_token) or ""
            if not token:
                return rates, conflicts, rejections

    def _machines_by_region(self) -> dict[str, list[Machine]]:
        """The GPU shapes offered in each requested region: machine types with built-in GPUs, and
        the catalog's N1 + attached-GPU combinations where the region offers that GPU."""
        offered: dict[str, dict[str, Machine]] = defaultdict(dict)
        accelerators: dict[str, set[str]] = defaultdict(set)
        for zone, accels in self.accelerator_types().items():
            accelerators[region_of(zone)].update(accels)
        plain: dict[str, dict[str, Any]] = defaultdict(dict)
        for zone, machines in self.machine_types().items():
            region = region_of(zone)
            if not self.ctx.wants_region(region):
                continue
            for name, mt in machines.items():
                plain[region][name] = mt
                if mt.accelerators and self._wanted(name, mt.accelerators[0].guest_accelerator_type):
                    acc = mt.accelerators[0]
                    offered[region][name] = Machine(
                        name,
                        family_of(name),
                        int(mt.guest_cpus),
                        mt.memory_mb / 1024,
                        acc.guest_accelerator_type,
                        int(sum(a.guest_accelerator_count for a in mt.accelerators)),
                    )
        for name in self.ctx.catalog:
            combo = GCP_ATTACHED_GPUS.fullmatch(name)
            if combo is None or not self._wanted(name, combo["accel"]):
                continue
            for region, machines in plain.items():
                base = machines.get(combo["machine"])
                if base is not None and combo["accel"] in accelerators[region]:
                    offered[region][name] = Machine(
                        name,
                        family_of(name),
                        int(base.guest_cpus),
                        base.memory_mb / 1024,
                        combo["accel"],
                        int(combo["count"]),
                    )
        return {region: sorted(m.values(), key=lambda m: m.name) for region, m in offered.items()}

    def _wanted(self, name: str, accelerator: str) -> bool:
        spec = self.ctx.catalog.get(name)
        model = spec.gpu_model if spec is not None else canonical_gpu(accelerator)
        return self.ctx.wants_gpu(model)

    def _price(
        self,
        region: str,
        m: Machine,
        kind: MarketKind,
        rates: dict[RateKey, _Rate],
        conflicts: set[RateKey],
    ) -> PriceObservation | Rejection:
        parts: list[tuple[str, Any, float]] = [("core", m.family, m.vcpus), ("ram", m.family, m.memory_gib)]
        if m.accelerator:
            parts.append(("gpu", gpu_key(m.accelerator), m.gpu_count))
        total, latest = 0.0, None
        for what, key, amount in parts:
            rate = rates.get((region, kind, what, key))
            if rate is None or (region, kind, what, key) in conflicts:
                label = key if isinstance(key, str) else " ".join(sorted(key))
                problem = "no" if rate is None else "conflicting"
                return Rejection(f"{region} {m.name} {kind.value}", f"{problem} {what} SKU for {label}")
            total += rate.usd * amount
            latest = rate.effective if latest is None else max(latest, rate.effective)
        assert latest is not None
        market = MarketKey("gcp", region, None, m.name, kind)
        return PriceObservation(market, latest, quoted(total))
