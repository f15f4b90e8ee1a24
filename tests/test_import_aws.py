"""``spotopt import aws-spot-history``: the aws CLI's JSON, JSON Lines, gzip; errors; idempotency."""

from __future__ import annotations

import gzip
import itertools
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from spotopt.clouds.aws.spot_history import parse_spot_price, region_of_zone
from spotopt.errors import InputError
from spotopt.types import MarketKind, PriceObservation, Rejection
from tests.import_helpers import EXAMPLES, counts, import_json, quotes_at, run_cli, runs

EXAMPLE = EXAMPLES / "aws-spot-price-history.json"


def _items() -> list[dict[str, str]]:
    items: list[dict[str, str]] = json.loads(EXAMPLE.read_text())["SpotPriceHistory"]
    return items


def _linux(items: list[dict[str, str]]) -> list[dict[str, str]]:
    return [i for i in items if i["ProductDescription"].startswith("Linux/UNIX")]


@pytest.mark.parametrize(
    ("zone", "region"),
    [
        ("us-east-1a", "us-east-1"),
        ("eu-central-2c", "eu-central-2"),
        ("us-gov-west-1b", "us-gov-west-1"),
        ("cn-northwest-1a", "cn-northwest-1"),
        ("us-west-2-lax-1a", "us-west-2"),
        ("us-east-1-bos-1a", "us-east-1"),
        ("us-east-1-wl1-bos-wlz-1", "us-east-1"),
        ("ap-northeast-1-wl1-kix-wlz-1", "ap-northeast-1"),
        ("us-east-1", None),
        ("eastus", None),
        ("", None),
    ],
)
def test_region_of_zone(zone: str, region: str | None) -> None:
    assert region_of_zone(zone) == region


def test_boto3_datetime_and_cli_string_give_the_same_record() -> None:
    item = {
        "AvailabilityZone": "us-west-2-lax-1a",
        "InstanceType": "g5.xlarge",
        "ProductDescription": "Linux/UNIX (Amazon VPC)",
        "SpotPrice": "0.4012",
        "Timestamp": "2024-05-01T12:00:00Z",
    }
    from_cli = parse_spot_price(item, "x")
    from_boto3 = parse_spot_price(item | {"Timestamp": datetime(2024, 5, 1, 12, tzinfo=UTC)}, "x")
    assert from_cli == from_boto3
    assert isinstance(from_cli, PriceObservation)
    assert (from_cli.market.region, from_cli.market.zone) == ("us-west-2", "us-west-2-lax-1a")
    assert from_cli.market.kind is MarketKind.SPOT
    assert from_cli.usd_per_hour == 0.4012


@pytest.mark.parametrize("product", ["Windows", "SUSE Linux (Amazon VPC)", "Red Hat Enterprise Linux"])
def test_non_linux_products_are_rejections(product: str) -> None:
    item = {
        "AvailabilityZone": "us-east-1a",
        "InstanceType": "p3.2xlarge",
        "ProductDescription": product,
        "SpotPrice": "1.2",
        "Timestamp": "2024-05-01T12:00:00+00:00",
    }
    record = parse_spot_price(item, "f.json: SpotPriceHistory[3]")
    assert isinstance(record, Rejection)
    assert product in record.reason
    assert record.where == "f.json: SpotPriceHistory[3]"


def test_import_example_then_reimport_inserts_nothing(db_url: str) -> None:
    items = _items()
    linux = _linux(items)
    before = counts(db_url)
    first = import_json(db_url, "aws-spot-history", EXAMPLE)
    assert first["inserted"] == len(linux)
    assert first["rejected"] == len(items) - len(linux) == 2
    assert first["rejections"] == {
        "not a Linux/UNIX price (Windows)": 1,
        "not a Linux/UNIX price (Red Hat Enterprise Linux)": 1,
    }
    assert first["unknown_instance_types"] == []
    after_first = counts(db_url)
    assert after_first["price_points"] == before["price_points"] + len(linux)

    second = import_json(db_url, "aws-spot-history", EXAMPLE)
    assert (second["inserted"], second["duplicate"]) == (0, len(linux))
    assert counts(db_url) == after_first
    assert [status for source, status, _ in runs(db_url) if source == "aws-spot-history"] == ["ok", "ok"]


def test_price_at_t_is_the_last_point_at_or_before_t(db_url: str) -> None:
    import_json(db_url, "aws-spot-history", EXAMPLE)
    series = sorted(
        (i["Timestamp"], float(i["SpotPrice"]))
        for i in _linux(_items())
        if i["InstanceType"] == "p3.2xlarge" and i["AvailabilityZone"] == "us-east-1b"
    )
    for (start, price), (end, _) in itertools.pairwise(series):
        t0, t1 = datetime.fromisoformat(start), datetime.fromisoformat(end)
        middle = t0 + (t1 - t0) / 2
        for at in (t0, middle):
            quotes = quotes_at(
                db_url, at, "aws-spot-history", zones=["us-east-1b"], instance_types=["p3.2xlarge"]
            )
            assert [(q.usd_per_hour, q.observed_at) for q in quotes] == [(price, t0)]


def test_json_lines_gzip_and_bare_array_match_the_document(db_url: str, tmp_path: Path) -> None:
    items = _items()
    jsonl = tmp_path / "history.jsonl"
    jsonl.write_text("".join(json.dumps(i) + "\n" for i in items))
    gz = tmp_path / "history.json.gz"
    gz.write_bytes(gzip.compress(EXAMPLE.read_bytes()))
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(items, indent=2))
    summary = import_json(db_url, "aws-spot-history", jsonl, gz, bare)
    linux = len(_linux(items))
    assert (summary["inserted"], summary["duplicate"], summary["rejected"]) == (linux, 2 * linux, 6)
    again = import_json(db_url, "aws-spot-history", EXAMPLE)
    assert (again["inserted"], again["duplicate"]) == (0, linux)


def test_unknown_instance_type_is_imported_and_reported(db_url: str, tmp_path: Path) -> None:
    item = {
        "AvailabilityZone": "us-east-1c",
        "InstanceType": "zz9.hyperlarge",
        "ProductDescription": "Linux/UNIX",
        "SpotPrice": "1.5",
        "Timestamp": "2024-05-01T00:00:00.000Z",
    }
    path = tmp_path / "one.json"
    path.write_text(json.dumps({"SpotPriceHistory": [item], "NextToken": None}))
    summary = import_json(db_url, "aws-spot-history", path)
    assert summary["inserted"] == 1
    assert summary["unknown_instance_types"] == ["aws:zz9.hyperlarge"]
    quotes = quotes_at(db_url, datetime(2024, 6, 1, tzinfo=UTC), "aws-spot-history")
    assert [(q.instance_type, q.gpu, q.usd_per_hour) for q in quotes] == [("zz9.hyperlarge", None, 1.5)]
    table = run_cli(db_url, "import", "aws-spot-history", path)
    assert table.exit_code == 0
    assert "zz9.hyperlarge" in table.stdout


def test_malformed_item_names_file_index_and_field_and_changes_nothing(db_url: str, tmp_path: Path) -> None:
    items = _items()
    items[17]["SpotPrice"] = "abc"
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"SpotPriceHistory": items}, indent=4))
    before = counts(db_url)
    result = run_cli(db_url, "import", "aws-spot-history", EXAMPLE, path)  # the good file is undone too
    assert result.exit_code == InputError.exit_code
    assert "prices.json: SpotPriceHistory[17].SpotPrice: 'abc' is not a number" in result.stderr
    assert counts(db_url) == before
    source, status, error = runs(db_url)[-1]
    assert (source, status) == ("aws-spot-history", "failed")
    assert error is not None and "SpotPriceHistory[17]" in error


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"SpotPriceHistory": [{"AvailabilityZone": "us-east-1a"', "truncated"),
        ('{"SpotPriceHistory": 7}', "SpotPriceHistory: expected an array"),
        ('{"SpotPriceHistory": [17]}', "SpotPriceHistory[0]: int is not an object"),
        (
            '{"AvailabilityZone": "us-east-1a", "InstanceType": "p3.2xlarge", "SpotPrice": "1"}\n',
            "line 1: ProductDescription: missing",
        ),
        ("\n\n" + json.dumps({"SpotPriceHistory": []}) + "\n[1, 2\n", "line 4: not valid JSON"),
        ('"just a string"', "line 1: str is not an object"),
        ('[\n  "a",\n  7\n', "[0]: str is not an object"),
    ],
)
def test_malformed_files(db_url: str, tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    before = counts(db_url)
    result = run_cli(db_url, "import", "aws-spot-history", path)
    assert result.exit_code == InputError.exit_code, result.output
    assert "bad.json" in result.stderr
    assert message in result.stderr
    assert counts(db_url) == before


def test_bad_timestamp_and_zone_name_the_field(tmp_path: Path) -> None:
    item = {
        "AvailabilityZone": "us-east-1a",
        "InstanceType": "p3.2xlarge",
        "ProductDescription": "Linux/UNIX",
        "SpotPrice": "1",
        "Timestamp": "yesterday",
    }
    with pytest.raises(InputError, match=r"f: SpotPriceHistory\[2\]\.Timestamp: 'yesterday' is not an ISO"):
        parse_spot_price(item, "f: SpotPriceHistory[2]")
    with pytest.raises(InputError, match=r"AvailabilityZone: 'Moon' is not an availability zone"):
        parse_spot_price(item | {"Timestamp": "2024-01-01T00:00Z", "AvailabilityZone": "Moon"}, "f")


def test_missing_file_is_a_clear_error_before_anything_runs(db_url: str, tmp_path: Path) -> None:
    before_runs = runs(db_url)
    result = run_cli(db_url, "import", "aws-spot-history", EXAMPLE, tmp_path / "absent.json")
    assert result.exit_code == InputError.exit_code
    assert "absent.json: no such file" in result.stderr
    assert runs(db_url) == before_runs
