"""``spotopt import csv``: the documented columns, time zones, errors naming line and column."""

from __future__ import annotations

import csv
import gzip
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from spotopt.errors import InputError
from spotopt.history.importers.csv_prices import COLUMNS, read_price_csv
from spotopt.types import MarketKind, PriceObservation
from tests.import_helpers import EXAMPLES, counts, import_json, quotes_at, run_cli

EXAMPLE = EXAMPLES / "prices.csv"
HEADER = ",".join(COLUMNS) + "\n"


def _example_rows() -> list[dict[str, str]]:
    with EXAMPLE.open(newline="") as f:
        return list(csv.DictReader(f))


def test_rows_become_prices(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(
        HEADER
        + "2024-05-02T08:30:00+02:00,aws,eu-west-1,eu-west-1a,g5.xlarge,spot,0.3912\n"
        + "2024-05-02 06:30,gcp,us-central1,,g2-standard-4,on-demand,0.7068\n"
    )
    aws, gcp = list(read_price_csv(path))
    assert isinstance(aws, PriceObservation) and isinstance(gcp, PriceObservation)
    assert aws.observed_at == gcp.observed_at == datetime(2024, 5, 2, 6, 30, tzinfo=UTC)
    assert (aws.market.zone, aws.market.kind) == ("eu-west-1a", MarketKind.SPOT)
    assert (gcp.market.zone, gcp.market.kind) == (None, MarketKind.ON_DEMAND)


def test_the_catalogs_gcp_names_with_attached_gpus_are_accepted(tmp_path: Path) -> None:
    """``plan`` prints GCP machine types with attached GPUs by the catalog's names; import takes them."""
    path = tmp_path / "p.csv"
    path.write_text(
        HEADER + "2024-05-02T06:30:00Z,gcp,us-central1,,n1-standard-8+1xnvidia-tesla-v100,spot,0.74\n"
    )
    (row,) = list(read_price_csv(path))
    assert (
        isinstance(row, PriceObservation) and row.market.instance_type == "n1-standard-8+1xnvidia-tesla-v100"
    )


def test_import_example_then_reimport(db_url: str) -> None:
    rows = _example_rows()
    before = counts(db_url)
    first = import_json(db_url, "csv", EXAMPLE)
    assert (first["inserted"], first["rejected"]) == (len(rows), 0)
    assert counts(db_url)["price_points"] == before["price_points"] + len(rows)
    second = import_json(db_url, "csv", EXAMPLE)
    assert (second["inserted"], second["duplicate"]) == (0, len(rows))
    at = datetime(2024, 4, 15, tzinfo=UTC)
    quotes = quotes_at(db_url, at, "csv", regions=["us-central1"], kinds=["spot"])
    expected = sorted(
        (r["instance_type"], float(r["usd_per_hour"]))
        for r in rows
        if r["region"] == "us-central1" and r["market"] == "spot" and r["timestamp"].startswith("2024-04-01")
    )
    assert sorted((q.instance_type, q.usd_per_hour) for q in quotes) == expected


def test_gzip_and_extra_columns(db_url: str, tmp_path: Path) -> None:
    text = EXAMPLE.read_text().splitlines()
    widened = [text[0] + ",note"] + [line + ",from a spreadsheet" for line in text[1:]]
    path = tmp_path / "prices.csv.gz"
    path.write_bytes(gzip.compress(("\n".join(widened) + "\n").encode()))
    summary = import_json(db_url, "csv", path)
    assert summary["inserted"] == len(text) - 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "2024-05-01,aws,us-east-1,,p3.2xlarge,spot,abc\n",
            "p.csv: line 3: usd_per_hour: 'abc' is not a number",
        ),
        ("2024-05-01,aws,us-east-1,,p3.2xlarge,spot,-1\n", "line 3: usd_per_hour: '-1' is negative"),
        (
            "2024-05-01,aws,us-east-1,,p3.2xlarge,spot,nan\n",
            "line 3: usd_per_hour: 'nan' is not a finite",
        ),
        (
            "May 1st,aws,us-east-1,,p3.2xlarge,spot,1\n",
            "line 3: timestamp: 'May 1st' is not an ISO 8601 time",
        ),
        ("2024-05-01T00:00Z,ibm,us-east-1,,p3.2xlarge,spot,1\n", "line 3: cloud: 'ibm' is not a cloud"),
        (
            "2024-05-01T00:00Z,aws,us-east-1,,p3.2xlarge,reserved,1\n",
            "line 3: market: 'reserved' is not a market",
        ),
        ("2024-05-01T00:00Z,aws,US East,,p3.2xlarge,spot,1\n", "line 3: region: 'US East' is not a region"),
        (
            "2024-05-01T00:00Z,aws,us-east-1,,p3 2xlarge,spot,1\n",
            "line 3: instance_type: 'p3 2xlarge' is not",
        ),
        ("\n2024-05-01T00:00Z,aws,us-east-1\n", "line 4: too few fields (no zone, instance_type"),
        (
            "2024-05-01T00:00Z,aws,us-east-1,us-west-2a,p3.2xlarge,spot,1\n",
            "zone: 'us-west-2a' lies in us-west-2, not in region 'us-east-1'; use a zone of us-east-1",
        ),
        (
            "2024-05-01T00:00Z,aws,us-east-1,east,p3.2xlarge,spot,1\n",
            "line 3: zone: 'east' is no zone name, not in region 'us-east-1'",
        ),
        (
            "2024-05-01T00:00Z,gcp,us-central1,europe-west4-a,a2-highgpu-1g,spot,1\n",
            "line 3: zone: 'europe-west4-a' lies in europe-west4, not in region 'us-central1'",
        ),
        (
            "2024-05-01T00:00Z,gcp,us-central1,us-central1,a2-highgpu-1g,spot,1\n",
            "line 3: zone: 'us-central1' is no zone name",
        ),
        (
            "2024-05-01T00:00Z,azure,eastus,eastus-1,Standard_NC6s_v3,spot,1\n",
            "line 3: zone: 'eastus-1' is not an Azure availability zone; use 1, 2 or 3",
        ),
    ],
)
def test_malformed_rows_name_line_and_column(db_url: str, tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "p.csv"
    path.write_text(HEADER + "2024-05-01T00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.9\n" + body)
    before = counts(db_url)
    result = run_cli(db_url, "import", "csv", path)
    assert result.exit_code == InputError.exit_code
    assert message in result.stderr
    assert counts(db_url) == before


def test_zones_of_the_row_region_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(
        HEADER
        + "2024-05-01T00:00Z,aws,us-west-2,us-west-2-lax-1a,g5.xlarge,spot,0.5\n"
        + "2024-05-01T00:00Z,gcp,europe-west4,europe-west4-b,a2-highgpu-1g,spot,1.1\n"
        + "2024-05-01T00:00Z,azure,eastus,2,Standard_NC6s_v3,spot,0.9\n"
    )
    assert [r.market.zone for r in read_price_csv(path) if isinstance(r, PriceObservation)] == [
        "us-west-2-lax-1a",
        None,  # checked, then stored as the region's price: GCP prices are per region
        "2",
    ]


def test_header_must_have_the_columns(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text("time,cloud,region,zone,instance_type,market,price\n2024-05-01,aws,x,,y,spot,1\n")
    with pytest.raises(InputError, match=r"p.csv: line 1: the header lacks timestamp, usd_per_hour"):
        list(read_price_csv(path))


def test_not_utf8_text_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_bytes(HEADER.encode() + b"\xff\xfe\x00garbage\n")
    with pytest.raises(InputError, match=r"p.csv: cannot read it"):
        list(read_price_csv(path))


def test_offsets_are_converted_to_utc(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    local = datetime(2024, 5, 1, 9, 0, tzinfo=timezone(timedelta(hours=-7)))
    path.write_text(HEADER + f"{local.isoformat()},aws,us-west-2,us-west-2a,g5.xlarge,spot,0.5\n")
    (record,) = list(read_price_csv(path))
    assert isinstance(record, PriceObservation)
    assert record.observed_at == datetime(2024, 5, 1, 16, 0, tzinfo=UTC)
