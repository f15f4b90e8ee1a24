"""``spotopt import availability``: CSV and spot-traces JSON into capacity observations, on both
databases; idempotent, transactional, bad input named with the database unchanged."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from spotopt.cli.imports import AVAILABILITY_SOURCE
from spotopt.db.engine import Database
from spotopt.errors import InputError
from spotopt.history.ingest import run_ingest
from spotopt.types import AvailabilityObservation, MarketKey, MarketKind
from tests.import_helpers import counts, import_json, run_cli, runs
from tests.traces import (
    AVAILABILITY_HEADER,
    TRACE_MARKET,
    spot_trace,
    stored_capacity,
    write_csv,
)

START = datetime(2022, 10, 26, 22, 5, 4, tzinfo=UTC)
SRC = AVAILABILITY_SOURCE


def at(minutes: float) -> datetime:
    return START + timedelta(minutes=minutes)


def test_csv_rows_become_observations_and_reimport_inserts_nothing(db_url: str, tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "a.csv",
        AVAILABILITY_HEADER + ",launched,requested",
        [
            "2022-10-26T22:05:04Z,aws,us-west-2,us-west-2a,p3.2xlarge,1,1,1",
            "2022-10-27T00:15:04+02:00,aws,us-west-2,us-west-2a,p3.2xlarge,false,0,1",
            "2022-10-26T22:25:04Z,aws,us-west-2,us-west-2b,p3.2xlarge,TRUE,,",
            "2022-10-26T22:35:04Z,gcp,us-central1,,a2-highgpu-1g,0,,8",
        ],
    )
    first = import_json(db_url, "availability", path)
    assert (first["inserted"], first["duplicate"], first["source"]) == (4, 0, SRC)
    assert stored_capacity(db_url) == [
        ("", at(30), SRC, False, None, 8),
        ("us-west-2a", at(0), SRC, True, 1, 1),
        ("us-west-2a", at(10), SRC, False, 0, 1),
        ("us-west-2b", at(20), SRC, True, None, None),
    ]
    second = import_json(db_url, "availability", path)
    assert (second["inserted"], second["duplicate"], second["conflicting"]) == (0, 4, 0)
    assert len(stored_capacity(db_url)) == 4


def test_a_trace_becomes_one_observation_per_probe(db_url: str, tmp_path: Path) -> None:
    trace = spot_trace(tmp_path / "us-west-2a_v100_1.json", 600, [1, 1, 0, 0, 1])
    args = ("--start", "2022-10-26T22:05:04Z", *TRACE_MARKET)
    first = import_json(db_url, "availability", trace, *args)
    assert first["inserted"] == 5
    expected = [True, True, False, False, True]
    assert stored_capacity(db_url) == [
        ("us-west-2a", at(10 * i), SRC, up, int(up), 1) for i, up in enumerate(expected)
    ]
    assert import_json(db_url, "availability", trace, *args)["inserted"] == 0


def test_a_multi_node_trace_keeps_launched_of_requested(db_url: str, tmp_path: Path) -> None:
    trace = spot_trace(tmp_path / "t.json.gz", 300, [])
    trace.write_bytes(
        gzip.compress(json.dumps({"metadata": {"gap_seconds": 300}, "data": [4, 2, 0]}).encode())
    )
    import_json(
        db_url, "availability", trace, "--start", "2022-10-26T22:05:04Z", *TRACE_MARKET, "--requested", "4"
    )
    # available = at least one instance launched: 2 of 4 is available (for a one-instance job).
    assert [(t, up, n, of) for _z, t, _s, up, n, of in stored_capacity(db_url)] == [
        (at(0), True, 4, 4),
        (at(5), True, 2, 4),
        (at(10), False, 0, 4),
    ]


def test_csv_and_a_trace_in_one_command(db_url: str, tmp_path: Path) -> None:
    csv = write_csv(
        tmp_path / "b.csv",
        AVAILABILITY_HEADER,
        ["2022-10-26T22:05:04Z,aws,us-west-2,us-west-2b,p3.2xlarge,0"],
    )
    trace = spot_trace(tmp_path / "a.json", 600, [1, 0])
    summary = import_json(
        db_url, "availability", csv, trace, "--start", "2022-10-26T22:05:04Z", *TRACE_MARKET
    )
    assert summary["inserted"] == 3
    assert {z for z, *_ in stored_capacity(db_url)} == {"us-west-2a", "us-west-2b"}


def test_a_changed_reobservation_is_counted_and_the_first_kept(db_url: str, tmp_path: Path) -> None:
    row = "2022-10-26T22:05:04Z,aws,us-west-2,us-west-2a,p3.2xlarge,"
    import_json(db_url, "availability", write_csv(tmp_path / "a.csv", AVAILABILITY_HEADER, [row + "1"]))
    again = import_json(
        db_url, "availability", write_csv(tmp_path / "b.csv", AVAILABILITY_HEADER, [row + "0"])
    )
    assert (again["inserted"], again["conflicting"], again["duplicate"]) == (0, 1, 0)
    assert [up for *_, up, _n, _of in stored_capacity(db_url)] == [True]


def test_an_unknown_instance_type_is_imported_and_listed(db_url: str, tmp_path: Path) -> None:
    """The upstream trace names K80 types p2.2xlarge, which AWS never sold: kept, GPU unknown."""
    trace = spot_trace(tmp_path / "us-west-2a_k80_1.json", 600, [1])
    market = (*TRACE_MARKET[:-1], "p2.2xlarge")
    summary = import_json(db_url, "availability", trace, "--start", "2022-10-26T22:05:04Z", *market)
    assert summary["inserted"] == 1 and summary["unknown_instance_types"] == ["aws:p2.2xlarge"]


def test_a_bad_second_file_leaves_the_history_unchanged(db_url: str, tmp_path: Path) -> None:
    good = write_csv(
        tmp_path / "good.csv",
        AVAILABILITY_HEADER,
        ["2022-10-26T22:05:04Z,aws,us-west-2,us-west-2a,p3.2xlarge,1"],
    )
    bad = write_csv(
        tmp_path / "bad.csv",
        AVAILABILITY_HEADER,
        [
            "2022-10-26T22:05:04Z,aws,us-west-2,us-west-2b,p3.2xlarge,1",
            "2022-10-26T22:15:04Z,aws,us-west-2,us-west-2b,p3.2xlarge,2",
        ],
    )
    before = counts(db_url)
    result = run_cli(db_url, "import", "availability", good, bad)
    assert result.exit_code == 2
    assert "bad.csv: line 3: available: '2' is not 1/0 or true/false" in result.stderr
    assert counts(db_url) == before
    assert runs(db_url)[-1][:2] == (SRC, "failed")


ROW = "2022-10-26T22:05:04Z,aws,us-west-2,us-west-2a,p3.2xlarge"


@pytest.mark.parametrize(
    ("header", "row", "message"),
    [
        ("timestamp,cloud,region,zone,instance_type", ROW, "a.csv: line 1: the header lacks available"),
        (AVAILABILITY_HEADER, ROW + ",maybe", "a.csv: line 2: available: 'maybe' is not 1/0 or true/false"),
        (AVAILABILITY_HEADER, ROW, "a.csv: line 2: too few fields (no available)"),
        (
            AVAILABILITY_HEADER + ",launched,requested",
            ROW + ",1,3,2",
            "line 2: launched: 3 is more than the 2 requested",
        ),
        (
            AVAILABILITY_HEADER + ",launched,requested",
            ROW + ",0,2,16",
            "line 2: available: 0 with 2 launched; available means at least one instance launched",
        ),
        (
            AVAILABILITY_HEADER + ",launched",
            ROW + ",1,-1",
            "line 2: launched: '-1' is not a number of instances",
        ),
        (
            AVAILABILITY_HEADER + ",requested",
            ROW + ",1,0",
            "line 2: requested: 0; a probe asks for at least 1",
        ),
        (
            AVAILABILITY_HEADER + ",market",
            ROW + ",1,on-demand",
            "line 2: market: 'on-demand': availability is recorded for spot markets only",
        ),
        (
            AVAILABILITY_HEADER,
            "yesterday,aws,us-west-2,us-west-2a,p3.2xlarge,1",
            "line 2: timestamp: 'yesterday' is not an ISO 8601 time",
        ),
        (
            AVAILABILITY_HEADER,
            "2022-10-26T22:05:04Z,aws,us-east-1,us-west-2a,p3.2xlarge,1",
            "line 2: zone: 'us-west-2a' lies in us-west-2, not in region 'us-east-1'",
        ),
    ],
)
def test_bad_csv_is_named_and_changes_nothing(
    db_url: str, tmp_path: Path, header: str, row: str, message: str
) -> None:
    path = write_csv(tmp_path / "a.csv", header, [row])
    before = counts(db_url)
    result = run_cli(db_url, "import", "availability", path)
    assert result.exit_code == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert counts(db_url) == before


START_ARGS = ("--start", "2022-10-26T22:05:04Z")


@pytest.mark.parametrize(
    ("document", "args", "message"),
    [
        (
            {"metadata": {}, "data": [1]},
            (*START_ARGS, *TRACE_MARKET),
            "t.json: metadata.gap_seconds: None is not a positive",
        ),
        (
            {"metadata": {"gap_seconds": 600}, "data": [1, "x"]},
            (*START_ARGS, *TRACE_MARKET),
            "t.json: data[1]: 'x' is not a number of instances",
        ),
        (
            {"metadata": {"gap_seconds": 600}, "data": [1, 0.5]},
            (*START_ARGS, *TRACE_MARKET),
            "t.json: data[1]: 0.5 is not a number",
        ),
        (
            {"metadata": {"gap_seconds": 600}, "data": [1, 16]},
            (*START_ARGS, *TRACE_MARKET),
            "t.json: data[1]: 16 instances, more than the 1 requested; pass --requested N",
        ),
        ({"metadata": {"gap_seconds": 600}}, (*START_ARGS, *TRACE_MARKET), "t.json: no 'data' array"),
        (
            {"metadata": {"gap_seconds": 600}, "data": [1]},
            TRACE_MARKET,
            "t.json: a spot-traces file holds no times and no market; give --start",
        ),
        (
            {"metadata": {"gap_seconds": 600}, "data": [1]},
            START_ARGS,
            "give --cloud, --region, --instance-type (e.g. --start",
        ),
        (
            {"metadata": {"gap_seconds": 600}, "data": [1]},
            ("--start", "soon", *TRACE_MARKET),
            "command line: --start: 'soon' is not an ISO 8601 time",
        ),
        (
            {"metadata": {"gap_seconds": 600}, "data": [1]},
            (*START_ARGS, *TRACE_MARKET, "--requested", "0"),
            "--requested 0: a probe asks for 1 to 100,000 instances",
        ),
        (
            {"metadata": {"gap_seconds": 600}, "data": [1]},
            (
                *START_ARGS,
                "--cloud",
                "aws",
                "--region",
                "us-west-2",
                "--zone",
                "us-east-1a",
                "--instance-type",
                "p3.2xlarge",
            ),
            "zone: 'us-east-1a' lies in us-east-1, not in region 'us-west-2'",
        ),
    ],
)
def test_bad_traces_and_options_are_named_and_change_nothing(
    db_url: str, tmp_path: Path, document: dict[str, object], args: tuple[str, ...], message: str
) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(document))
    before = counts(db_url)
    result = run_cli(db_url, "import", "availability", path, *args)
    assert result.exit_code == 2, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr
    assert counts(db_url) == before


def test_options_without_a_trace_and_two_traces_are_refused(db_url: str, tmp_path: Path) -> None:
    csv = write_csv(tmp_path / "a.csv", AVAILABILITY_HEADER, [ROW + ",1"])
    result = run_cli(db_url, "import", "availability", csv, *START_ARGS)
    assert (
        result.exit_code == 2 and "--start: only for a spot-traces JSON file; a.csv is CSV" in result.stderr
    )
    one, two = spot_trace(tmp_path / "one.json", 600, [1]), spot_trace(tmp_path / "two.json", 600, [1])
    result = run_cli(db_url, "import", "availability", one, two, *START_ARGS, *TRACE_MARKET)
    assert result.exit_code == 2 and "two.json: one spot-traces JSON file per command" in result.stderr
    assert stored_capacity(db_url) == []


def test_the_ingestor_refuses_on_demand_capacity(db: Database) -> None:
    record = AvailabilityObservation(
        MarketKey("aws", "us-west-2", None, "p3.2xlarge", MarketKind.ON_DEMAND), START, False
    )
    with pytest.raises(InputError, match="capacity observations are recorded for spot markets only"):
        run_ingest(db, "test", "test", [record])


def test_the_console_script_prints_json_for_scripts(tmp_path: Path) -> None:
    """What users pipe goes through the installed ``spotopt`` script, not CliRunner's capture."""
    script = Path(sys.executable).with_name("spotopt")
    assert script.exists(), f"{script}: install the package (pip install -e .) into this interpreter's env"
    db = f"sqlite:///{tmp_path / 'h.sqlite'}"
    trace = spot_trace(tmp_path / "us-west-2a_v100_1.json", 600, [1, 0, 0, 1])
    imported = subprocess.run(
        [
            str(script),
            "--db",
            db,
            "import",
            "availability",
            str(trace),
            *START_ARGS,
            *TRACE_MARKET,
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(imported.stdout)["inserted"] == 4
    report = subprocess.run(
        [
            str(script),
            "--db",
            db,
            "report",
            "run",
            "availability",
            "-p",
            "since=2022-10-26T22:05:04Z",
            "-p",
            "until=2022-10-26T22:45:04Z",
            "-f",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    (market,) = json.loads(report.stdout)["markets"]
    # Probes every 10 min over 40 min: up 10, down 20, up 10 -> half the time, one 20-min outage.
    assert (market["available_share"], market["outages"], market["max_outage_hours"]) == (0.5, 1, 1 / 3)
