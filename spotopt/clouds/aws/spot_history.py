"""AWS spot price history: one item of ``DescribeSpotPriceHistory`` → a price record.

``parse_spot_price`` is the single interpretation of an item, used by the dump importer and by the
live AWS collector alike (boto3 hands over ``Timestamp`` as a datetime, the CLI prints a string;
``SpotPrice`` is a decimal string in both). Only Linux prices are kept: spotopt compares clouds on
Linux prices, and a Windows/SUSE/RHEL price includes a licence, so those items become counted
``Rejection``s rather than silently disappearing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from spotopt.collectors import fields
from spotopt.errors import InputError
from spotopt.types import MarketKey, MarketKind, PriceObservation, Rejection

LINUX_PRODUCTS = frozenset({"Linux/UNIX", "Linux/UNIX (Amazon VPC)"})

# A region is <partition prefix>(-<word>)+-<number>: us-east-1, us-gov-west-1, us-isob-east-1.
# Its zones append a letter (us-east-1a), or a Local Zone (us-west-2-lax-1a) or Wavelength Zone
# (us-east-1-wl1-bos-wlz-1) suffix after a dash.
_ZONE = re.compile(r"(?P<region>[a-z]{2}(?:-[a-z]+)+-\d+)(?:[a-z]|-[a-z0-9]+(?:-[a-z0-9]+)*)")


def region_of_zone(zone: str) -> str | None:
    """The region an availability, Local or Wavelength Zone belongs to; None if ``zone`` is no zone name."""
    match = _ZONE.fullmatch(zone)
    return match.group("region") if match else None


def parse_spot_price(item: Mapping[str, Any], where: str) -> PriceObservation | Rejection:
    """Interpret one ``SpotPriceHistory`` item; ``where`` locates it in error messages.

    Returns a Linux spot price of the item's zone, or a ``Rejection`` for non-Linux products and
    zero prices. Raises ``InputError`` naming ``where`` and the field when the item is malformed
    (missing field, wrong type, unparsable time or price, negative price, a zone with no region).
    ``AvailabilityZoneId`` is not needed: prices are keyed by zone name, as AWS reports them.
    """
    if not isinstance(item, Mapping):
        raise InputError(f"{where}: {type(item).__name__} is not an object (a spot price item)")
    product = fields.text(item, "ProductDescription", where)
    zone = fields.text(item, "AvailabilityZone", where)
    name = fields.instance_type(fields.text(item, "InstanceType", where), where, "InstanceType")
    observed_at = fields.timestamp(fields.required(item, "Timestamp", where), where, "Timestamp")
    usd_per_hour = fields.price(fields.required(item, "SpotPrice", where), where, "SpotPrice")
    region = region_of_zone(zone) if len(zone) <= 32 else None
    if region is None:
        raise InputError(
            f"{fields.at(where, 'AvailabilityZone')}: {zone!r} is not an availability zone name "
            "(e.g. us-east-1a, us-west-2-lax-1a)"
        )
    if product not in LINUX_PRODUCTS:
        return Rejection(where, f"not a Linux/UNIX price ({product[:40]})")
    if usd_per_hour == 0:
        return Rejection(where, "price is zero")
    market = MarketKey(cloud="aws", region=region, zone=zone, instance_type=name, kind=MarketKind.SPOT)
    return PriceObservation(market=market, observed_at=observed_at, usd_per_hour=usd_per_hour)
