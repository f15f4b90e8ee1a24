"""Azure collectors: GPU VM sizes (Resource SKUs), retail prices, and Resource Graph spot data.

- ``azure-catalog``: ``resourceSkus.list`` → VM sizes with a ``GPUs`` capability (vCPUs,
  MemoryGB). The API names no GPU model; a name token that is a GPU (``A100``, ``T4``) is
  mapped with ``canonical_gpu``, anything else is kept verbatim and reported.
- ``azure-prices``: the public Retail Prices API (no credentials), one region per scope,
  following ``NextPageLink``; items are interpreted by ``retail.parse_retail_item``.
- ``azure-eviction-rates`` and ``azure-spot-history``: Azure Resource Graph ``SpotResources``
  (credentials with Reader on the subscriptions).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from spotopt.catalog import canonical_gpu, gpu_models
from spotopt.clouds.azure.retail import parse_retail_item
from spotopt.clouds.registry import register_collector
from spotopt.collectors import fields
from spotopt.collectors.base import Collector, Context, hour
from spotopt.errors import InputError
from spotopt.types import (
    InstanceTypeSpec,
    InterruptionObservation,
    MarketKey,
    MarketKind,
    PriceObservation,
    Record,
    Rejection,
)

NEEDS = "Azure credentials (az login or a service principal) and AZURE_SUBSCRIPTION_ID"
# A GPU-looking token of a size name: Standard_NC24ads_A100_v4 → A100, Standard_ND96isr_H200_v5 → H200.
_GPU_TOKEN = re.compile(r"^(?:[A-Z]{1,3}\d{1,4}[A-Z]?|MI\d+X?)$")


def _capabilities(sku: Any) -> dict[str, str]:
    return {str(c.name): str(c.value) for c in (sku.capabilities or [])}


def gpu_of_size(name: str) -> tuple[str | None, str]:
    """(canonical GPU or None, raw GPU name) guessed from a size name, for sizes the bundled
    catalog does not list. The raw name is the GPU token, or the size name when it has none."""
    for token in name.split("_")[2:]:
        if _GPU_TOKEN.match(token):
            return canonical_gpu(token), token
    return None, name


class AzureCollector(Collector):
    cloud = "azure"
    needs = NEEDS

    def gpu_skus(self) -> list[Any]:
        """Every GPU VM size of the subscription's locations (one ``resourceSkus.list`` listing)."""
        return self.memo(("azure-gpu-skus",), self._list_gpu_skus)

    def _list_gpu_skus(self) -> list[Any]:
        found: list[Any] = []
        for location in self.ctx.regions or (None,):
            token: str | None = None
            seen: set[str] = set()
            while True:
                items, next_token = self.call(
                    "compute.resourceSkus.list", self.clients.resource_skus_page, location, token
                )
                token = self.next_token("compute.resourceSkus.list", seen, next_token)
                found += [
                    s for s in items if s.resource_type == "virtualMachines" and "GPUs" in _capabilities(s)
                ]
                if not token:
                    break
        return found

    def gpu_names(self) -> dict[str, str]:
        """lower-case name → ARM name of the GPU sizes spotopt knows, within ``--gpu``."""
        return {
            n.lower(): n
            for n, s in self.ctx.catalog.items()
            if s.gpu_count and (not self.ctx.gpus or self.ctx.wants_gpu(s.gpu_model))
        }


@register_collector
class AzureCatalog(AzureCollector):
    """GPU VM sizes with their vCPUs, memory and GPU count."""

    name = "azure-catalog"
    collects = "the GPU VM size catalog"
    global_scope = True

    def collect(self, since: datetime | None) -> Iterator[Record]:
        seen: set[str] = set()
        for sku in self.gpu_skus():
            if sku.name in seen:
                continue
            seen.add(sku.name)
            spec = self._spec(sku)
            if isinstance(spec, Rejection) or not self.ctx.gpus or self.ctx.wants_gpu(spec.gpu_model):
                yield spec

    def _spec(self, sku: Any) -> InstanceTypeSpec | Rejection:
        where = f"resourceSkus {sku.name}"
        caps = _capabilities(sku)
        try:
            name = fields.instance_type(str(sku.name), where, "name")
            count = float(caps["GPUs"])
            vcpus = int(caps["vCPUs"])
            memory = float(caps["MemoryGB"])
        except (KeyError, ValueError, InputError) as exc:
            return Rejection(f"{where}: {type(exc).__name__} {exc}"[:300], "malformed item")
        known = self.ctx.catalog.get(name)
        model, raw = (known.gpu_model, name) if known and known.gpu_model else gpu_of_size(name)
        memory_gib = gpu_models()[model].memory_gib * count if model else None
        return InstanceTypeSpec(
            cloud="azure",
            name=name,
            gpu_model=model,
            gpu_count=count,
            gpu_memory_gib=memory_gib,
            vcpus=vcpus,
            memory_gib=memory,
            gpu_name_raw=None if model else raw,
        )


@register_collector
class AzurePrices(AzureCollector):
    """Pay-as-you-go and Spot Linux prices of GPU sizes, per region (Retail Prices API)."""

    name = "azure-prices"
    collects = "on-demand and spot prices (Retail Prices API)"
    needs = "nothing for the prices themselves; --region, or Azure credentials to list the regions"
    only_changes = True

    @classmethod
    def default_regions(cls, clients: Any, ctx: Context) -> list[str]:
        probe = cls(clients, "global", ctx)
        return sorted({loc.lower() for sku in probe.gpu_skus() for loc in (sku.locations or [])})

    def collect(self, since: datetime | None) -> Iterator[Record]:
        names = self.gpu_names()
        flt = (
            f"serviceName eq 'Virtual Machines' and armRegionName eq '{self.scope}' "
            "and priceType eq 'Consumption'"
        )
        url: str | None = None
        page_no, seen = 0, set[str]()
        while True:
            page = self.call("GET retail/prices", self.clients.retail_page, url, flt)
            items = page.get("Items")
            if not isinstance(items, list):
                yield Rejection(f"retail/prices {self.scope} page {page_no}: no Items list", "malformed page")
                return
            for i, item in enumerate(items):
                sku = item.get("armSkuName") if isinstance(item, dict) else None
                if isinstance(sku, str) and sku.lower() not in names:
                    continue  # not a GPU size (the region lists every VM size)
                where = f"retail/prices {self.scope} page {page_no}: Items[{i}]"
                yield self.parsed(parse_retail_item, item, where)
            url = self.next_token("GET retail/prices", seen, str(page.get("NextPageLink") or ""))
            if not url:
                return
            page_no += 1


def _kql_list(values: list[str]) -> str:
    return ", ".join("'" + v.replace("'", "") + "'" for v in values)


class AzureGraphCollector(AzureCollector):
    """Pages through one Resource Graph query restricted to the known GPU sizes."""

    global_scope = True
    resource_type: str

    def rows(self, project: str) -> Iterator[dict[str, Any]]:
        names = sorted(self.gpu_names())
        if not names:
            return
        query = (
            f"SpotResources | where type =~ '{self.resource_type}' | where sku.name in~ ({_kql_list(names)})"
        )
        if self.ctx.regions:
            query += f" | where location in~ ({_kql_list(list(self.ctx.regions))})"
        query += f" | project {project}"
        skip: str | None = None
        seen: set[str] = set()
        while True:
            reply = self.call("resourcegraph.resources", self.clients.resource_graph, query, skip)
            data = reply.data if isinstance(reply.data, list) else []
            yield from (row for row in data if isinstance(row, dict))
            skip = self.next_token("resourcegraph.resources", seen, reply.skip_token)
            if not skip:
                return


def eviction_upper_bound(bucket: str) -> float | None:
    """``0-5`` → 5, ``20+`` → 100 (percent): the bucket's upper bound."""
    text = bucket.strip().rstrip("%")
    if text.endswith("+"):
        return 100.0
    try:
        return float(text.rsplit("-", 1)[-1])
    except ValueError:
        return None


@register_collector
class AzureEvictionRates(AzureGraphCollector):
    """Spot eviction-rate buckets per GPU size and region (Resource Graph ``SpotResources``)."""

    name = "azure-eviction-rates"
    collects = "spot eviction rates"
    resource_type = "microsoft.compute/skuspotevictionrate/location"

    def collect(self, since: datetime | None) -> Iterator[Record]:
        names = self.gpu_names()
        at = hour(self.ctx.now)
        project = "skuName=tostring(sku.name), location, spotEvictionRate=tostring(properties.evictionRate)"
        for row in self.rows(project):
            name = names.get(str(row.get("skuName", "")).lower())
            bucket, location = row.get("spotEvictionRate"), row.get("location")
            value = eviction_upper_bound(bucket) if isinstance(bucket, str) else None
            if name is None or value is None or not isinstance(location, str):
                yield Rejection(f"SpotResources evictionRate {row!r}"[:300], "malformed item")
                continue
            yield InterruptionObservation(
                "azure", location.lower(), None, name, at, "eviction-rate", value, str(bucket)
            )


@register_collector
class AzureSpotHistory(AzureGraphCollector):
    """Spot price history (Linux) per GPU size and region (Resource Graph ``SpotResources``)."""

    name = "azure-spot-history"
    collects = "spot price history (Resource Graph)"
    resource_type = "microsoft.compute/skuspotpricehistory/ostype/location"

    def rows(self, project: str) -> Iterator[dict[str, Any]]:
        # Only Linux prices: Windows spot prices include the licence.
        for row in super().rows(project):
            if str(row.get("osType", "")).lower() == "linux":
                yield row

    def collect(self, since: datetime | None) -> Iterator[Record]:
        names = self.gpu_names()
        project = (
            "skuName=tostring(sku.name), osType=tostring(properties.osType), location, "
            "spotPrices=properties.spotPrices"
        )
        for row in self.rows(project):
            name, location = names.get(str(row.get("skuName", "")).lower()), row.get("location")
            prices = row.get("spotPrices")
            if name is None or not isinstance(location, str) or not isinstance(prices, list):
                yield Rejection(f"SpotResources spotPrices {row!r}"[:300], "malformed item")
                continue
            market = MarketKey("azure", location.lower(), None, name, MarketKind.SPOT)
            for i, point in enumerate(prices):
                where = f"SpotResources {name} {location} spotPrices[{i}]"
                yield self.parsed(_history_point, point, where, market)


def _history_point(point: Any, where: str, market: MarketKey) -> PriceObservation:
    if not isinstance(point, dict):
        raise InputError(f"{where}: {point!r} is not an object")
    # Samples disagree on the time key; accept either.
    key = "effectiveDate" if "effectiveDate" in point else "dateTime"
    observed_at = fields.timestamp(fields.required(point, key, where), where, key)
    usd = fields.price(fields.required(point, "priceUSD", where), where, "priceUSD")
    return PriceObservation(market, observed_at, usd)
