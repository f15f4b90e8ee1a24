"""Dumps of the clouds' own price APIs, read into records by the parsers their collectors use.

``aws ec2 describe-spot-price-history`` output and Azure Retail Prices API pages: the one
interpretation of an item is the collector's (``spotopt.clouds.aws.spot_history``,
``spotopt.clouds.azure.retail``), so a dump imports exactly as a live collection would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from spotopt.clouds.aws.spot_history import parse_spot_price
from spotopt.clouds.azure.retail import parse_retail_item
from spotopt.files import AWS_SPOT_HISTORY, AZURE_RETAIL, iter_json_items
from spotopt.types import PriceObservation, Rejection


def read_spot_history(
    path: Path, on_bytes: Callable[[int], None] | None = None
) -> Iterator[PriceObservation | Rejection]:
    """Stream the records of a dump: ``aws ec2 describe-spot-price-history`` output, JSON Lines of its
    items (or of whole responses), or a bare array of items (``--query SpotPriceHistory``); ``.gz`` too.

    ``on_bytes`` is called with the number of file bytes consumed, for a progress bar.
    """
    for where, item in iter_json_items(path, AWS_SPOT_HISTORY, on_bytes):
        yield parse_spot_price(item, where)


def read_retail_pages(
    path: Path, on_bytes: Callable[[int], None] | None = None
) -> Iterator[PriceObservation | Rejection]:
    """Stream the records of dumped API pages: one page object per file, pages concatenated or as
    JSON Lines, or JSON Lines of bare items; ``.gz`` too. ``on_bytes`` drives a progress bar.
    """
    for where, item in iter_json_items(path, AZURE_RETAIL, on_bytes):
        yield parse_retail_item(item, where)
