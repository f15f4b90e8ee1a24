"""AWS collectors: GPU catalog, spot price history, on-demand prices, placement scores.

The Spot Instance Advisor (a public JSON document) lives in ``advisor``. Every EC2 call is
regional, so these collectors run one scope per region; the region list comes from
``DescribeRegions`` unless ``--region`` narrows it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from spotopt.catalog import canonical_gpu
from spotopt.clouds.aws.spot_history import parse_spot_price
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

NEEDS = "AWS credentials (aws configure, AWS_PROFILE or an instance role)"
# AWS keeps 90 days of spot price history; a first run backfills all of it.
SPOT_HISTORY_DAYS = 90
# Later runs start a little before the watermark: prices AWS publishes late still land, and the
# overlap costs nothing (duplicates are ignored on insert).
WATERMARK_OVERLAP = timedelta(hours=1)


class AwsCollector(Collector):
    cloud = "aws"
    needs = NEEDS

    @classmethod
    def default_regions(cls, clients: Any, ctx: Context) -> list[str]:
        ec2 = clients.ec2(clients.home_region())
        reply = ctx.retry.run(ec2.describe_regions, "aws", "ec2:DescribeRegions", None)
        return sorted(r["RegionName"] for r in reply.get("Regions", []))

    def gpu_types(self) -> list[dict[str, Any]]:
        """The region's instance types that have GPUs (``DescribeInstanceTypes``, all pages).

        AWS offers no server-side GPU filter, so all types are listed and filtered here; the
        result is memoised on the client factory so the collectors of one run share it.
        """
        return self.memo(("aws-gpu-types", self.scope), self._list_gpu_types)

    def _list_gpu_types(self) -> list[dict[str, Any]]:
        ec2 = self.clients.ec2(self.scope)
        found: list[dict[str, Any]] = []
        token, seen = "", set[str]()
        while True:
            kwargs: dict[str, Any] = {"MaxResults": 100}
            if token:
                kwargs["NextToken"] = token
            page = self.call("ec2:DescribeInstanceTypes", ec2.describe_instance_types, **kwargs)
            found += [t for t in page.get("InstanceTypes", []) if isinstance(t, dict) and "GpuInfo" in t]
            token = self.next_token("ec2:DescribeInstanceTypes", seen, page.get("NextToken")) or ""
            if not token:
                return found

    def wanted_type_names(self) -> list[str]:
        """The region's well-formed GPU types within ``--gpu`` (bundled catalog facts first)."""
        specs = [s for s in map(spec_of, self.gpu_types()) if isinstance(s, InstanceTypeSpec)]
        return [
            s.name
            for s in specs
            if not self.ctx.gpus or self.ctx.wants_gpu(self.ctx.catalog.get(s.name, s).gpu_model)
        ]


def spec_of(item: Mapping[str, Any]) -> InstanceTypeSpec | Rejection:
    """One ``DescribeInstanceTypes`` item with ``GpuInfo`` → its spec (GPU name made canonical)."""
    name = item.get("InstanceType")
    where = f"DescribeInstanceTypes {name or '?'}"
    try:
        gpus = item["GpuInfo"]["Gpus"]
        first = gpus[0]
        raw = " ".join(p for p in (first.get("Manufacturer"), first["Name"]) if p and p != "NVIDIA")
        count = float(sum(int(g["Count"]) for g in gpus))
        per_gpu_gib = float(first["MemoryInfo"]["SizeInMiB"]) / 1024
        total_mib = item["GpuInfo"].get("TotalGpuMemoryInMiB")
        spec = InstanceTypeSpec(
            cloud="aws",
            name=fields.instance_type(str(name), where, "InstanceType"),
            gpu_model=canonical_gpu(first["Name"], per_gpu_gib) or canonical_gpu(raw, per_gpu_gib),
            gpu_count=count,
            gpu_memory_gib=float(total_mib) / 1024 if total_mib else per_gpu_gib * count,
            vcpus=int(item["VCpuInfo"]["DefaultVCpus"]),
            memory_gib=float(item["MemoryInfo"]["SizeInMiB"]) / 1024,
        )
    except (KeyError, IndexError, TypeError, ValueError, InputError) as exc:
        return Rejection(f"{where}: {type(exc).__name__} {exc}"[:300], "malformed item")
    if spec.gpu_model is None:  # kept verbatim so the report can name it
        return replace(spec, gpu_name_raw=f"{first.get('Manufacturer', '')} {first['Name']}".strip())
    return spec


@register_collector
class AwsCatalog(AwsCollector):
    """GPU instance types of the region and its zone IDs (AZ names are shuffled per account)."""

    name = "aws-catalog"
    collects = "the GPU instance catalog"

    def collect(self, since: datetime | None) -> Iterator[Record]:
        ec2 = self.clients.ec2(self.scope)
        zones = self.call("ec2:DescribeAvailabilityZones", ec2.describe_availability_zones)
        for zone in zones.get("AvailabilityZones", []):
            if zone.get("ZoneName") and zone.get("ZoneId"):
                self.zone_ids[(self.scope, zone["ZoneName"])] = zone["ZoneId"]
        for item in self.gpu_types():
            spec = spec_of(item)
            if isinstance(spec, Rejection) or self.ctx.wants_gpu(spec.gpu_model) or not self.ctx.gpus:
                yield spec


@register_collector
class AwsSpotPrices(AwsCollector):
    """Spot price history (Linux/UNIX) of the region's GPU types, per availability zone.

    The watermark is kept per instance type (scope ``<region>/<type>``): a ``--gpu`` run covers
    only some types, and AWS adds types over time; either way a type never collected before gets
    its 90-day backfill, while the others start at their own watermark.
    """

    name = "aws-spot-prices"
    collects = "spot price history"
    keyed_watermarks = True

    def collect(self, since: datetime | None) -> Iterator[Record]:
        end = self.ctx.now
        oldest = end - timedelta(days=SPOT_HISTORY_DAYS)
        types = self.wanted_type_names()
        if not types:
            self.notes.append(f"{self.scope}: no GPU instance types offered")
            return
        # Types sharing a start time share requests: usually one group, plus the new types.
        groups: dict[datetime, list[str]] = {}
        for name in types:
            mark = since or self.since_by_key.get(name)
            start = oldest if mark is None else max(oldest, mark - WATERMARK_OVERLAP)
            groups.setdefault(start, []).append(name)
        page_no = 0
        for start, names in sorted(groups.items()):
            for page in self._history_pages(start, end, names):
                for i, item in enumerate(page.get("SpotPriceHistory", [])):
                    where = f"{self.scope} DescribeSpotPriceHistory page {page_no} SpotPriceHistory[{i}]"
                    record = self.parsed(parse_spot_price, item, where)
                    if isinstance(record, PriceObservation) and isinstance(
                        item.get("AvailabilityZoneId"), str
                    ):
                        self.zone_ids[(record.market.region, record.market.zone or "")] = item[
                            "AvailabilityZoneId"
                        ]
                    yield record
                page_no += 1
        self.until_by_key = dict.fromkeys(types, end)
        if self.ctx.gpus:  # only some types were asked for: the region as a whole is not done
            self.until = None

    def _history_pages(self, start: datetime, end: datetime, types: list[str]) -> Iterator[dict[str, Any]]:
        """Every page of ``DescribeSpotPriceHistory`` for ``types`` over [start, end]."""
        ec2 = self.clients.ec2(self.scope)
        token, seen = "", set[str]()
        while True:
            kwargs: dict[str, Any] = {
                "StartTime": start,
                "EndTime": end,
                "InstanceTypes": types,
                "ProductDescriptions": ["Linux/UNIX"],
                "MaxResults": 1000,
            }
            if token:
                kwargs["NextToken"] = token
            page = self.call("ec2:DescribeSpotPriceHistory", ec2.describe_spot_price_history, **kwargs)
            yield page
            token = self.next_token("ec2:DescribeSpotPriceHistory", seen, page.get("NextToken")) or ""
            if not token:
                return


# The Price List filters that leave one product per instance type: shared-tenancy Linux without
# pre-installed software or licence, the capacity that is actually sold ("Used").
_PRICE_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
    "productFamily": "Compute Instance",
}


def on_demand_price(document: str, region: str, where: str) -> PriceObservation | Rejection:
    """One ``PriceList`` entry (a JSON string) → the on-demand price, dated by its term's
    ``effectiveDate`` (so the same list price collected again is the same point)."""
    try:
        product = json.loads(document)
        attributes = product["product"]["attributes"]
        name = fields.instance_type(str(attributes["instanceType"]), where, "instanceType")
        term = next(iter(product["terms"]["OnDemand"].values()))
        dimension = next(iter(term["priceDimensions"].values()))
        if dimension.get("unit") != "Hrs":
            return Rejection(where, f"price unit is {dimension.get('unit')!r}, not Hrs")
        usd = fields.price(dimension["pricePerUnit"]["USD"], where, "pricePerUnit.USD")
        observed_at = fields.timestamp(term["effectiveDate"], where, "effectiveDate")
    except (KeyError, StopIteration, TypeError, ValueError, AttributeError, InputError) as exc:
        return Rejection(f"{where}: {type(exc).__name__} {exc}"[:300], "malformed item")
    if usd == 0:
        return Rejection(where, "price is zero")
    market = MarketKey("aws", region, None, name, MarketKind.ON_DEMAND)
    return PriceObservation(market, observed_at, usd)


@register_collector
class AwsOnDemandPrices(AwsCollector):
    """On-demand Linux prices of the region's GPU types from the Price List Query API."""

    name = "aws-on-demand"
    collects = "on-demand prices"
    only_changes = True

    def collect(self, since: datetime | None) -> Iterator[Record]:
        wanted = set(self.wanted_type_names())
        pricing = self.clients.pricing()
        filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in _PRICE_FILTERS.items()]
        filters.append({"Type": "TERM_MATCH", "Field": "regionCode", "Value": self.scope})
        token, page_no, seen = "", 0, set[str]()
        while True:
            kwargs: dict[str, Any] = {
                "ServiceCode": "AmazonEC2",
                "Filters": filters,
                "FormatVersion": "aws_v1",
                "MaxResults": 100,
            }
            if token:
                kwargs["NextToken"] = token
            page = self.call("pricing:GetProducts", pricing.get_products, **kwargs)
            for i, document in enumerate(page.get("PriceList", [])):
                record = on_demand_price(
                    document, self.scope, f"{self.scope} GetProducts page {page_no} PriceList[{i}]"
                )
                if isinstance(record, Rejection) or record.market.instance_type in wanted:
                    yield record
            token, page_no = (
                self.next_token("pricing:GetProducts", seen, page.get("NextToken")) or "",
                page_no + 1,
            )
            if not token:
                break


@register_collector
class AwsPlacementScores(AwsCollector):
    """Spot placement scores (1–10) per GPU type and zone, if the caller may ask for them.

    AWS scores a *set* of types; asking one type at a time gives per-type scores, which AWS says
    run low for single types. They are stored as they come, labelled ``placement-score``.
    """

    name = "aws-placement-scores"
    collects = "spot placement scores"

    def collect(self, since: datetime | None) -> Iterator[Record]:
        ec2 = self.clients.ec2(self.scope)
        zones = self.call("ec2:DescribeAvailabilityZones", ec2.describe_availability_zones)
        zone_names = {z["ZoneId"]: z["ZoneName"] for z in zones.get("AvailabilityZones", []) if "ZoneId" in z}
        at = hour(self.ctx.now)
        for name in self.wanted_type_names():
            token, seen = "", set[str]()
            while True:
                kwargs: dict[str, Any] = {
                    "InstanceTypes": [name],
                    "TargetCapacity": 1,
                    "SingleAvailabilityZone": True,
                    "RegionNames": [self.scope],
                    "MaxResults": 10,
                }
                if token:
                    kwargs["NextToken"] = token
                page = self.call("ec2:GetSpotPlacementScores", ec2.get_spot_placement_scores, **kwargs)
                for item in page.get("SpotPlacementScores", []):
                    score, zone_id = item.get("Score"), item.get("AvailabilityZoneId")
                    if not isinstance(score, int) or zone_id not in zone_names:
                        yield Rejection(
                            f"{self.scope} GetSpotPlacementScores {name}: {item!r}"[:300], "malformed item"
                        )
                        continue
                    yield InterruptionObservation(
                        "aws",
                        self.scope,
                        zone_names[zone_id],
                        name,
                        at,
                        "placement-score",
                        float(score),
                        str(score),
                    )
                token = self.next_token("ec2:GetSpotPlacementScores", seen, page.get("NextToken")) or ""
                if not token:
                    break
