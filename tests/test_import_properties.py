"""Property tests of the importers: any malformed input is an ``InputError`` naming the file (and
the item and field) or a clean rejection; valid input round-trips through the history into
``prices_at``.

The properties are checked on the readers and on ``run_ingest`` directly: driving the whole CLI
per example cost ~3 s of every 4. A few example-based tests keep the CLI-level promises (exit 2,
the error on stderr, the database unchanged) on SQLite and PostgreSQL.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from spotopt.db.engine import Database, make_engine
from spotopt.db.models import UTCDateTime
from spotopt.db.queries import MarketFilter, prices_at
from spotopt.errors import InputError
from spotopt.history.importers.cloud_dumps import read_retail_pages, read_spot_history
from spotopt.history.importers.csv_prices import read_price_csv
from spotopt.history.ingest import run_ingest, sqlite_utc_text
from spotopt.types import PriceObservation, Rejection
from tests.import_helpers import EXAMPLES, counts, run_cli

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# Reader properties need no database, so they afford more examples in a fraction of the time.
READER_SETTINGS = settings(SETTINGS, max_examples=150)
READERS: dict[str, Callable[..., Iterator[PriceObservation | Rejection]]] = {
    "aws-spot-history": read_spot_history,
    "azure-retail": read_retail_pages,
    "csv": read_price_csv,
}
COMMANDS = tuple(READERS)
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


def read(command: str, path: Path) -> list[PriceObservation | Rejection] | InputError:
    """Everything ``command``'s reader yields for ``path``, or the ``InputError`` it raised (any
    other exception fails the test: that would be a traceback for the user)."""
    try:
        return list(READERS[command](path, None))
    except InputError as exc:
        return exc


def _check_reader(path: Path, command: str) -> None:
    outcome = read(command, path)
    if isinstance(outcome, InputError):
        assert path.name in str(outcome), outcome
    else:
        assert all(isinstance(r, (PriceObservation, Rejection)) for r in outcome)


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


@READER_SETTINGS
@given(data=st.binary(max_size=400), command=st.sampled_from(COMMANDS))
def test_garbage_bytes_are_rejected_cleanly(tmp_path: Path, data: bytes, command: str) -> None:
    path = tmp_path / "garbage.dat"
    path.write_bytes(data)
    _check_reader(path, command)


@READER_SETTINGS
@given(
    text=st.text(
        alphabet=st.sampled_from('{}[]",:0123456789.-eE ntrufalsSpotPriceHistoryItems\n'), max_size=200
    ),
    command=st.sampled_from(COMMANDS[:2]),
)
def test_json_like_noise_is_rejected_cleanly(tmp_path: Path, text: str, command: str) -> None:
    path = tmp_path / "noise.json"
    path.write_text(text)
    _check_reader(path, command)


@READER_SETTINGS
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
    outcome = read("aws-spot-history", path)
    if isinstance(outcome, InputError):
        where = f"line {index + 1}: {field}" if lines else f"SpotPriceHistory[{index}].{field}"
        if "not valid JSON" in str(outcome):  # the parser itself failed (e.g. 2**63): the field it read
            where = f"in field '{field}"  # the path starts with the item's field
        assert where in str(outcome) and "spot.json" in str(outcome), outcome
    else:
        assert len(outcome) == len(items)  # every item is a price or a counted rejection


@READER_SETTINGS
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
def test_one_corrupted_azure_field_fails_naming_it_or_rejects(tmp_path: Path, field: str, value: Any) -> None:
    page = json.loads((EXAMPLES / "azure-retail-prices.json").read_text())
    page["Items"][1][field] = value
    path = tmp_path / "page.json"
    path.write_text(json.dumps(page))
    outcome = read("azure-retail", path)
    if isinstance(outcome, InputError):
        assert "page.json: line 1: " in str(outcome)  # a one-line document
        assert f"Items[1].{field}" in str(outcome)
    else:  # every item is a price or a counted rejection
        assert len(outcome) == len(page["Items"])


@READER_SETTINGS
@given(
    column=st.integers(0, 6),
    value=st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=20),
)
def test_one_corrupted_csv_cell_fails_naming_it_or_imports(tmp_path: Path, column: int, value: str) -> None:
    lines = (EXAMPLES / "prices.csv").read_text().splitlines()
    cells = lines[3].split(",")
    cells[column] = '"' + value.replace('"', '""') + '"'
    lines[3] = ",".join(cells)
    path = tmp_path / "p.csv"
    path.write_text("\n".join(lines) + "\n")
    outcome = read("csv", path)
    if isinstance(outcome, InputError):
        assert "p.csv: line 4" in str(outcome), outcome
    else:
        assert len(outcome) == len(lines) - 1


def _expected_prices(items: list[dict[str, Any]]) -> dict[tuple[str, str, datetime], float]:
    """(zone, type, time) → the Linux price in effect then (first item wins on an exact tie)."""
    expected: dict[tuple[str, str, datetime], float] = {}
    for item in items:
        if item["ProductDescription"] == "Windows":
            continue
        key = (item["AvailabilityZone"], item["InstanceType"], datetime.fromisoformat(item["Timestamp"]))
        expected.setdefault(key, float(item["SpotPrice"]))
    return expected


def _assert_round_trip(db: Database, items: list[dict[str, Any]], path: Path) -> None:
    """Import ``items`` as the CLI does (reader → ``run_ingest``) and find every Linux price again."""
    path.write_text(json.dumps({"SpotPriceHistory": items}))
    first = run_ingest(db, "aws-spot-history", path.name, read_spot_history(path))
    expected = _expected_prices(items)
    assert first.stats.inserted == len(expected)
    with db.session() as session:
        for (zone, name, at), price in expected.items():
            flt = MarketFilter(zones=[zone], instance_types=[name], include_unknown_gpu=True)
            quotes = [q for q in prices_at(session, at, flt) if q.source == "aws-spot-history"]
            assert [(q.usd_per_hour, q.observed_at) for q in quotes] == [(price, at)]
    again = run_ingest(db, "aws-spot-history", path.name, read_spot_history(path))
    assert (again.stats.inserted, again.stats.duplicate) == (0, len(expected))


_TAGS = itertools.count(1)


def _tagged(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each example gets its own instance types, so earlier examples (or a replay of the same
    example, which hypothesis does) do not shadow its prices."""
    tag = str(next(_TAGS))
    for item in items:
        item["InstanceType"] = item["InstanceType"].replace(".", f"{tag}.")
    return items


@SETTINGS
@given(items=aws_items())
def test_valid_items_round_trip(sqlite_db: Database, tmp_path: Path, items: list[dict[str, Any]]) -> None:
    _assert_round_trip(sqlite_db, _tagged(items), tmp_path / "valid.json")


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=aws_items())
@pytest.mark.postgres
def test_postgresql_round_trip(pg_url: str, tmp_path: Path, items: list[dict[str, Any]]) -> None:
    db = Database(make_engine(pg_url))
    try:
        _assert_round_trip(db, _tagged(items), tmp_path / "valid.json")
    finally:
        db.dispose()


# --- the CLI-level promises, on both databases -------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_garbage_through_the_cli_exits_2_naming_the_file_and_writes_nothing(
    db_url: str, tmp_path: Path, command: str
) -> None:
    path = tmp_path / "garbage.json"
    path.write_bytes(b'{"SpotPriceHistory": [{"InstanceType": \x00')
    assert _check_failure_or_success(db_url, path, command) == InputError.exit_code


def test_a_corrupted_field_through_the_cli_names_it_and_writes_nothing(db_url: str, tmp_path: Path) -> None:
    items = [
        {
            "AvailabilityZone": "us-east-1a",
            "InstanceType": "p3.2xlarge",
            "ProductDescription": "Linux/UNIX",
            "SpotPrice": price,
            "Timestamp": f"2023-01-01T0{i}:00:00+00:00",
        }
        for i, price in enumerate(["0.9", "0.95", "-1"])
    ]
    path = tmp_path / "spot.json"
    path.write_text(json.dumps({"SpotPriceHistory": items}))
    before = counts(db_url)
    result = run_cli(db_url, "import", "aws-spot-history", path)
    assert result.exit_code == InputError.exit_code, result.output
    assert "spot.json" in result.stderr and "SpotPriceHistory[2].SpotPrice" in result.stderr
    assert counts(db_url) == before


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
