"""Azure Retail Prices API: one price item → a record.

``parse_retail_item`` is the single interpretation of an item, used by the dump importer and by
the live Azure collector (which pages through https://prices.azure.com/api/retail/prices). Azure
lists a VM size's pay-as-you-go price (on-demand), its Spot price (``skuName`` ends in " Spot")
and variants spotopt does not compare: Windows (licence included), Low Priority (the retired
Batch/scale-set discount), reservations and dev/test rates. Those are counted ``Rejection``s, as
are items of other services, so a dump of the whole price list imports cleanly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spotopt.collectors import fields
from spotopt.errors import InputError
from spotopt.types import MarketKey, MarketKind, PriceObservation, Rejection

SPOT_SUFFIX = " Spot"
LOW_PRIORITY_SUFFIX = " Low Priority"


def parse_retail_item(item: Mapping[str, Any], where: str) -> PriceObservation | Rejection:
    """Interpret one ``Items`` element; ``where`` locates it in error messages.

    Returns the Linux spot or on-demand price of a VM size in a region (``observed_at`` =
    ``effectiveStartDate``; Azure prices are regional, so the market has no zone), or a
    ``Rejection`` saying why the item is not such a price. Raises ``InputError`` naming ``where``
    and the field when a field the decision needs is missing, mistyped or unparsable.
    """
    if not isinstance(item, Mapping):
        raise InputError(f"{where}: {type(item).__name__} is not an object (a retail price item)")
    if fields.optional_text(item, "serviceName", where) != "Virtual Machines":
        return Rejection(where, "not a Virtual Machines price")
    price_type = fields.text(item, "type", where)
    if price_type != "Consumption":
        return Rejection(where, f"price type {price_type[:30]} (only Consumption is a pay-as-you-go price)")
    sku = fields.text(item, "skuName", where)
    product = fields.text(item, "productName", where)
    if "Windows" in product:
        return Rejection(where, "Windows (licence included)")
    if sku.endswith(LOW_PRIORITY_SUFFIX):
        return Rejection(where, "Low Priority")
    unit = fields.text(item, "unitOfMeasure", where)
    if unit != "1 Hour":
        return Rejection(where, f"unit {unit[:20]!r} is not '1 Hour'")
    currency = fields.text(item, "currencyCode", where)
    if currency != "USD":
        return Rejection(where, f"currency {currency[:10]} is not USD")
    if item.get("isPrimaryMeterRegion") is False:
        return Rejection(where, "not the primary meter region (a duplicate listing)")
    name = fields.text(item, "armSkuName", where)
    if not name:
        return Rejection(where, "no armSkuName (not a VM size)")
    fields.instance_type(name, where, "armSkuName")
    region = fields.text(item, "armRegionName", where)
    if not region:
        return Rejection(where, "no armRegionName (not a regional price)")
    fields.place(region, where, "armRegionName")
    observed_at = fields.timestamp(
        fields.required(item, "effectiveStartDate", where), where, "effectiveStartDate"
    )
    usd_per_hour = fields.price(fields.required(item, "retailPrice", where), where, "retailPrice")
    if usd_per_hour == 0:
        return Rejection(where, "price is zero")
    kind = MarketKind.SPOT if sku.endswith(SPOT_SUFFIX) else MarketKind.ON_DEMAND
    market = MarketKey(cloud="azure", region=region, zone=None, instance_type=name, kind=kind)
    return PriceObservation(market=market, observed_at=observed_at, usd_per_hour=usd_per_hour)
