"""Price CSV files: the format for prices from anywhere else (exports, other tools, spreadsheets).

Columns (a header row is required; extra columns are ignored)::

    timestamp,cloud,region,zone,instance_type,market,usd_per_hour
    2024-05-01T12:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.918

``timestamp`` is ISO 8601 (no offset means UTC), ``cloud`` is aws|gcp|azure, ``zone`` may be empty
(a region-wide price) and otherwise lies in ``region`` (``us-east-1a``, ``us-central1-a``; Azure
zones are ``1``, ``2`` or ``3``; a GCP price is stored as its region's, see ``read_price_csv``),
``market`` is spot|on-demand, ``usd_per_hour`` a non-negative number (Linux, per instance).
Every row is a price; a malformed row is an error, a zero price a rejection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from spotopt.clouds.aws.spot_history import region_of_zone
from spotopt.clouds.registry import MARKET_CLOUDS
from spotopt.collectors import fields
from spotopt.errors import InputError
from spotopt.files import iter_csv_rows
from spotopt.types import MarketKey, MarketKind, PriceObservation, Rejection

COLUMNS = ("timestamp", "cloud", "region", "zone", "instance_type", "market", "usd_per_hour")
_KINDS = {kind.value: kind for kind in MarketKind}
_AZURE_ZONES = frozenset({"1", "2", "3"})
log = logging.getLogger("spotopt")


class Markets:
    """Validates each distinct (cloud, region, zone, type, market) once: a file repeats a few
    markets. Errors name ``where`` and the field (``p.csv: line 4: zone: …``)."""

    def __init__(self) -> None:
        self._known: dict[tuple[str, str, str, str, str], MarketKey] = {}

    def get(
        self, cloud: str, region: str, zone: str, instance_type: str, market: str, where: str
    ) -> MarketKey:
        key = (cloud, region, zone, instance_type, market)
        found = self._known.get(key)
        if found is None:
            found = self._known[key] = _market(key, where)
        return found

    def of_row(self, row: dict[str, str], where: str, market: str) -> MarketKey:
        """The market of a CSV row with the columns cloud, region, zone, instance_type."""
        return self.get(row["cloud"], row["region"], row["zone"], row["instance_type"], market, where)


def _market(key: tuple[str, str, str, str, str], where: str) -> MarketKey:
    cloud, region, zone, name, market = (value.strip() for value in key)
    if cloud not in MARKET_CLOUDS:
        raise InputError(
            f"{fields.at(where, 'cloud')}: {cloud!r} is not a cloud; use {', '.join(MARKET_CLOUDS)}"
        )
    kind = _KINDS.get(market)
    if kind is None:
        raise InputError(f"{fields.at(where, 'market')}: {market!r} is not a market; use spot or on-demand")
    region = fields.place(region, where, "region")
    if zone:
        _check_zone(cloud, region, fields.place(zone, where, "zone"), where)
    return MarketKey(
        cloud=cloud,
        region=region,
        zone=zone or None,
        instance_type=fields.instance_type(name, where, "instance_type"),
        kind=kind,
    )


def _check_zone(cloud: str, region: str, zone: str, where: str) -> None:
    """A zone must lie in the row's region: a price filed under the wrong region would be
    compared with that region's prices and never with its own."""
    if cloud == "azure":
        if zone not in _AZURE_ZONES:
            raise InputError(
                f"{fields.at(where, 'zone')}: {zone!r} is not an Azure availability zone; "
                "use 1, 2 or 3, or leave it empty for a region-wide price"
            )
        return
    zone_region = region_of_zone(zone) if cloud == "aws" else _gcp_region_of_zone(zone)
    if zone_region != region:
        example = f"{region}a" if cloud == "aws" else f"{region}-a"
        found = f"lies in {zone_region}" if zone_region else "is no zone name"
        raise InputError(
            f"{fields.at(where, 'zone')}: {zone!r} {found}, not in region {region!r}; "
            f"use a zone of {region} (e.g. {example}) or fix the region"
        )


def _gcp_region_of_zone(zone: str) -> str | None:
    """``us-central1-a`` → ``us-central1``: a GCP zone is its region, a dash and a letter."""
    region, dash, letter = zone.rpartition("-")
    return region if dash and region and len(letter) == 1 and letter.isalpha() else None


def read_price_csv(
    path: Path, on_bytes: Callable[[int], None] | None = None
) -> Iterator[PriceObservation | Rejection]:
    """Stream the prices of a CSV file (plain or ``.gz``); errors name the file, line and column.

    GCP prices a VM per region, the same in each of its zones, and its markets are region-wide
    (the collector's, the ones ``plan`` ranks and the provider launches in any zone): a GCP row
    that names a zone (as per-zone listings repeat the region's price) is stored as its region's
    price, with a warning, rather than as a zonal market no other price or decision shares.
    """
    markets = Markets()
    name = path.name
    zoned, first_zoned = 0, 0  # GCP rows stored without their zone, and the first one's line
    for line, row in iter_csv_rows(path, COLUMNS, on_bytes):
        where = f"{name}: line {line}"
        market = markets.of_row(row, where, row["market"])
        if market.cloud == "gcp" and market.zone is not None:
            market = replace(market, zone=None)
            zoned, first_zoned = zoned + 1, first_zoned or line
        observed_at = fields.timestamp(row["timestamp"], where, "timestamp")
        usd_per_hour = fields.price(row["usd_per_hour"].strip(), where, "usd_per_hour")
        if usd_per_hour == 0:
            yield Rejection(where, "price is zero")
        else:
            yield PriceObservation(market=market, observed_at=observed_at, usd_per_hour=usd_per_hour)
    if zoned:
        log.warning(
            "%s: %d GCP row(s) name a zone (first: line %d); GCP prices are per region, so they were "
            "stored as their region's prices (leave zone empty for GCP to silence this)",
            name,
            zoned,
            first_zoned,
        )
