"""``spotopt import azure-retail``: API pages, what is kept and what is rejected, errors."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from spotopt.clouds.azure.retail import parse_retail_item
from spotopt.errors import InputError
from spotopt.types import MarketKind, PriceObservation, Rejection
from tests.import_helpers import EXAMPLES, counts, import_json, quotes_at, run_cli

EXAMPLE = EXAMPLES / "azure-retail-prices.json"


def _page() -> dict[str, Any]:
    page: dict[str, Any] = json.loads(EXAMPLE.read_text())
    return page


def _spot_item() -> dict[str, Any]:
    return next(
        i for i in _page()["Items"] if i["skuName"] == "NC6s v3 Spot" and "Windows" not in i["productName"]
    )


def test_spot_and_on_demand_items() -> None:
    spot = parse_retail_item(_spot_item(), "p: Items[1]")
    assert isinstance(spot, PriceObservation)
    assert spot.market.kind is MarketKind.SPOT
    assert (spot.market.cloud, spot.market.region, spot.market.zone) == ("azure", "eastus", None)
    assert spot.market.instance_type == "Standard_NC6s_v3"
    assert spot.observed_at == datetime(2024, 4, 1, tzinfo=UTC)
    on_demand = parse_retail_item(_spot_item() | {"skuName": "NC6s v3", "meterName": "NC6s v3"}, "p")
    assert isinstance(on_demand, PriceObservation)
    assert on_demand.market.kind is MarketKind.ON_DEMAND


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"productName": "Virtual Machines NCSv3 Series Windows"}, "Windows"),
        ({"skuName": "NC6s v3 Low Priority"}, "Low Priority"),
        ({"type": "Reservation"}, "price type Reservation"),
        ({"type": "DevTestConsumption"}, "price type DevTestConsumption"),
        ({"unitOfMeasure": "1/Month"}, "unit '1/Month'"),
        ({"currencyCode": "EUR"}, "currency EUR"),
        ({"serviceName": "Storage"}, "not a Virtual Machines price"),
        ({"isPrimaryMeterRegion": False}, "not the primary meter region"),
        ({"retailPrice": 0}, "price is zero"),
    ],
)
def test_rejections_say_why(change: dict[str, Any], reason: str) -> None:
    record = parse_retail_item(_spot_item() | change, "p: Items[4]")
    assert isinstance(record, Rejection)
    assert reason in record.reason
    assert record.where == "p: Items[4]"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"retailPrice": "cheap"}, "Items[4].retailPrice: 'cheap' is not a number"),
        ({"retailPrice": -1.0}, "Items[4].retailPrice: -1.0 is negative"),
        (
            {"effectiveStartDate": "01/04/2024"},
            "Items[4].effectiveStartDate: '01/04/2024' is not an ISO 8601",
        ),
        ({"armSkuName": 42}, "Items[4].armSkuName: 42 is not a string"),
        ({"armRegionName": "East US"}, "Items[4].armRegionName: 'East US' is not a region"),
        ({"skuName": None}, "Items[4].skuName: missing"),
    ],
)
def test_malformed_items_name_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_retail_item(_spot_item() | change, "p: Items[4]")
    assert message in str(caught.value)


def test_import_example_then_reimport(db_url: str) -> None:
    items = _page()["Items"]
    before = counts(db_url)
    first = import_json(db_url, "azure-retail", EXAMPLE)
    assert first["inserted"] == 18
    assert first["rejections"] == {
        "Windows (licence included)": 9,
        "Low Priority": 3,
        "price type Reservation (only Consumption is a pay-as-you-go price)": 1,
        "not a Virtual Machines price": 1,
    }
    assert first["inserted"] + first["rejected"] == len(items)
    assert counts(db_url)["price_points"] == before["price_points"] + 18
    second = import_json(db_url, "azure-retail", EXAMPLE)
    assert (second["inserted"], second["duplicate"]) == (0, 18)
    spot = _spot_item()
    quotes = quotes_at(
        db_url,
        datetime(2024, 5, 1, tzinfo=UTC),
        "azure-retail",
        regions=["eastus"],
        instance_types=["Standard_NC6s_v3"],
        kinds=["spot"],
    )
    assert [q.usd_per_hour for q in quotes] == [spot["retailPrice"]]


def test_json_lines_of_pages_and_concatenated_pages(db_url: str, tmp_path: Path) -> None:
    items = _page()["Items"]
    half = len(items) // 2
    pages = [
        {"Items": items[:half], "NextPageLink": "https://prices.azure.com/next", "Count": half},
        {"Items": items[half:], "NextPageLink": None, "Count": len(items) - half},
    ]
    lines = tmp_path / "pages.jsonl"
    lines.write_text("".join(json.dumps(p) + "\n" for p in pages))
    summary = import_json(db_url, "azure-retail", lines)
    assert (summary["inserted"], summary["rejected"]) == (18, 14)
    concatenated = tmp_path / "pages.json"
    concatenated.write_text("\n".join(json.dumps(p, indent=1) for p in pages))
    again = import_json(db_url, "azure-retail", concatenated)
    assert (again["inserted"], again["duplicate"], again["rejected"]) == (0, 18, 14)


def test_malformed_item_in_second_page_names_page_and_field(db_url: str, tmp_path: Path) -> None:
    items = _page()["Items"]
    items[3]["effectiveStartDate"] = "soon"
    pages = [{"Items": items[:2]}, {"Items": items[2:]}]
    path = tmp_path / "pages.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pages))
    before = counts(db_url)
    result = run_cli(db_url, "import", "azure-retail", path)
    assert result.exit_code == InputError.exit_code
    assert "pages.jsonl: line 2: Items[1].effectiveStartDate: 'soon' is not an ISO 8601 time" in result.stderr
    assert counts(db_url) == before
