"""Property tests of the importers: any malformed input is an ``InputError`` (exit 2, naming the file)
or a clean rejection, and the database is unchanged; valid input round-trips through ``prices_at``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from spotopt.db.engine import Database
from spotopt.db.models import UTCDateTime
from spotopt.errors import InputError
from spotopt.ingest import sqlite_utc_text
from tests.import_helpers import EXAMPLES, counts, import_json, quotes_at, run_cli

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
COMMANDS = ("aws-spot-history", "azure-retail", "csv")
AWS_FIELDS = ("AvailabilityZone", "InstanceType", "ProductDescription", "SpotPrice", "Timestamp")

# Values of any JSON type, including the ones a careless export produces.
json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(["", "NaN", "-1", "1e999", "2024-13-01T00:00:00Z", "0.5", " ", "\x00", "Linux/UNIX"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def _url(db: Database) -> str:
    return db.engine.url.render_as_string(hide_password=False)


def _check_failure_or_success(db_url: str, path: Path, command: str) -> int:
    """Import ``path``; a failure must be a clean InputError naming the file, with nothing written."""
    before = counts(db_url)
    result = run_cli(db_url, "import", command, path)
    assert result.exit_code in (0, InputError.exit_code), (result.output, result.exception)
    if result.exit_code != 0:
        assert isinstance(result.exception, SystemExit)
        assert path.name in result.stderr
        assert counts(db_url) == before
    return result.exit_code


def _aws_item(draw: Callable[..., Any], index: int) -> dict[str, Any]:
    start = datetime(2023, 1, 1, tzinfo=UTC)
    return {
        "AvailabilityZone": draw(st.sampled_from(["us-east-1a", "eu-west-1b", "us-west-2-lax-1a"])),
        "InstanceType": f"zz{draw(st.integers(1, 3))}.xlarge",
        "ProductDescription": draw(st.sampled_from(["Linux/UNIX", "Linux/UNIX (Amazon VPC)", "Windows"])),
        "SpotPrice": f"{draw(st.decimals(min_value='0.0001', max_value='99', places=4))}",
        "Timestamp": (start + timedelta(minutes=index * 7 + draw(st.integers(0, 6)))).isoformat(),
    }


@st.composite
def aws_items(draw: Callable[..., Any]) -> list[dict[str, Any]]:
    return [_aws_item(draw, i) for i in range(draw(st.integers(1, 12)))]


@SETTINGS
@given(data=st.binary(max_size=400), command=st.sampled_from(COMMANDS))
def test_garbage_bytes_are_rejected_cleanly(
    sqlite_db: Database, tmp_path: Path, data: bytes, command: str
) -> None:
    path = tmp_path / "garbage.dat"
    path.write_bytes(data)
    _check_failure_or_success(_url(sqlite_db), path, command)


@SETTINGS
@given(
    text=st.text(
        alphabet=st.sampled_from('{}[]",:0123456789.-eE ntrufalsSpotPriceHistoryItems\n'), max_size=200
    ),
    command=st.sampled_from(COMMANDS[:2]),
)
def test_json_like_noise_is_rejected_cleanly(
    sqlite_db: Database, tmp_path: Path, text: str, command: str
) -> None:
    path = tmp_path / "noise.json"
    path.write_text(text)
    _check_failure_or_success(_url(sqlite_db), path, command)


@SETTINGS
@given(
    items=aws_items(),
    field=st.sampled_from(
        ["AvailabilityZone", "InstanceType", "ProductDescription", "SpotPrice", "Timestamp"]
    ),
    value=json_values,
    delete=st.booleans(),
    lines=st.booleans(),
    which=st.integers(min_value=0),
)
def test_one_corrupted_aws_field_fails_naming_it_or_imports(
    sqlite_db: Database,
    tmp_path: Path,
    items: list[dict[str, Any]],
    field: str,
    value: Any,
    delete: bool,
    lines: bool,
    which: int,
) -> None:
    index = which % len(items)
    if delete:
        del items[index][field]
    else:
        items[index][field] = value
    path = tmp_path / "spot.json"
    if lines:
        path.write_text("".join(json.dumps(i) + "\n" for i in items))
    else:
        path.write_text(json.dumps({"SpotPriceHistory": items, "NextToken": None}, indent=4))
    before_fields = counts(_url(sqlite_db))
    result = run_cli(_url(sqlite_db), "import", "aws-spot-history", path)
    if result.exit_code != 0:
        assert result.exit_code == InputError.exit_code, result.output
        where = f"line {index + 1}: {field}" if lines else f"SpotPriceHistory[{index}].{field}"
        assert where in result.stderr, result.stderr
        assert counts(_url(sqlite_db)) == before_fields


@SETTINGS
@given(
    field=st.sampled_from(
        [
            "serviceName",
            "type",
            "skuName",
            "productName",
            "unitOfMeasure",
            "currencyCode",
            "armSkuName",
            "armRegionName",
            "effectiveStartDate",
            "retailPrice",
        ]
    ),
    value=json_values,
)
def test_one_corrupted_azure_field_fails_naming_it_or_rejects(
    sqlite_db: Database, tmp_path: Path, field: str, value: Any
) -> None:
    page = json.loads((EXAMPLES / "azure-retail-prices.json").read_text())
    page["Items"][1][field] = value
    path = tmp_path / "page.json"
    path.write_text(json.dumps(page))
    url = _url(sqlite_db)
    before = counts(url)
    result = run_cli(url, "import", "azure-retail", path, "--format", "json")
    if result.exit_code == 0:
        summary = json.loads(result.stdout)
        assert summary["inserted"] + summary["duplicate"] + summary["conflicting"] + summary[
            "rejected"
        ] == len(page["Items"])
    else:
        assert result.exit_code == InputError.exit_code, result.output
        assert "page.json: line 1: " in result.stderr  # a one-line document
        assert f"Items[1].{field}" in result.stderr
        assert counts(url) == before


@SETTINGS
@given(
    column=st.integers(0, 6),
    value=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=20),
)
def test_one_corrupted_csv_cell_fails_naming_it_or_imports(
    sqlite_db: Database, tmp_path: Path, column: int, value: str
) -> None:
    lines = (EXAMPLES / "prices.csv").read_text().splitlines()
    cells = lines[3].split(",")
    cells[column] = '"' + value.replace('"', '""') + '"'
    lines[3] = ",".join(cells)
    path = tmp_path / "p.csv"
    path.write_text("\n".join(lines) + "\n")
    url = _url(sqlite_db)
    before = counts(url)
    result = run_cli(url, "import", "csv", path)
    if result.exit_code != 0:
        assert result.exit_code == InputError.exit_code, result.output
        assert "p.csv: line 4" in result.stderr
        assert counts(url) == before


def _expected_prices(items: list[dict[str, Any]]) -> dict[tuple[str, str, datetime], float]:
    """(zone, type, time) → the Linux price in effect then (first item wins on an exact tie)."""
    expected: dict[tuple[str, str, datetime], float] = {}
    for item in items:
        if item["ProductDescription"] == "Windows":
            continue
        key = (item["AvailabilityZone"], item["InstanceType"], datetime.fromisoformat(item["Timestamp"]))
        expected.setdefault(key, float(item["SpotPrice"]))
    return expected


def _assert_round_trip(db_url: str, items: list[dict[str, Any]], path: Path) -> None:
    path.write_text(json.dumps({"SpotPriceHistory": items}))
    summary = import_json(db_url, "aws-spot-history", path)
    expected = _expected_prices(items)
    assert summary["inserted"] == len(expected)
    for (zone, name, at), price in expected.items():
        quotes = quotes_at(db_url, at, "aws-spot-history", zones=[zone], instance_types=[name])
        assert [(q.usd_per_hour, q.observed_at) for q in quotes] == [(price, at)]
    again = import_json(db_url, "aws-spot-history", path)
    assert (again["inserted"], again["duplicate"]) == (0, len(expected))


_TAGS = itertools.count(1)


@SETTINGS
@given(items=aws_items())
def test_valid_items_round_trip(sqlite_db: Database, tmp_path: Path, items: list[dict[str, Any]]) -> None:
    # Each example uses its own instance types so earlier examples (or a replay of the same
    # example, which hypothesis does) do not shadow its prices.
    tag = str(next(_TAGS))
    for item in items:
        item["InstanceType"] = item["InstanceType"].replace(".", f"{tag}.")
    _assert_round_trip(_url(sqlite_db), items, tmp_path / "valid.json")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=aws_items(), data=st.binary(max_size=200))
@pytest.mark.postgres
def test_postgresql_round_trip_and_garbage(
    pg_url: str, tmp_path: Path, items: list[dict[str, Any]], data: bytes
) -> None:
    tag = str(next(_TAGS))
    for item in items:
        item["InstanceType"] = item["InstanceType"].replace(".", f"{tag}.")
    _assert_round_trip(pg_url, items, tmp_path / "valid.json")
    garbage = tmp_path / "garbage.json"
    garbage.write_bytes(data)
    for command in COMMANDS:
        _check_failure_or_success(pg_url, garbage, command)


@settings(max_examples=200, deadline=None)
@given(value=st.datetimes(timezones=st.just(UTC) | st.timezones()))
def test_raw_sqlite_times_match_what_sqlalchemy_writes(value: datetime) -> None:
    """The fast SQLite insert path must store times exactly as ``UTCDateTime`` does, or queries miss them."""
    dialect = sqlite.dialect()
    bind = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    assert bind is not None
    try:
        expected = bind(value)
    except OverflowError:
        return  # not representable in UTC; neither path can store it
    assert sqlite_utc_text(value) == expected
