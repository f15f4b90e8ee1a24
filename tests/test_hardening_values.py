"""Issue 14: values that must be refused or bounded, and files of the wrong format."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spotopt.errors import InputError
from spotopt.history.importers.cloud_dumps import read_retail_pages, read_spot_history
from spotopt.jobspec import parse_jobs
from tests.import_helpers import EXAMPLES, counts, run_cli

INF = float("inf")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"work": {"steps": INF}}, "work.steps: must be a finite number"),
        ({"work": {"steps": 1e300}}, "work.steps: must be <= 1e+15"),
        ({"throughput": {"V100": INF}}, "throughput.V100: must be a finite number"),
        ({"throughput": {"V100": 1e-300}}, "throughput.V100: must be >= 1e-06"),
        ({"throughput": {"V100": {0: 2.4}}}, "throughput.V100.0: must be >= 1"),
        ({"checkpoint_gb": INF}, "checkpoint_gb: must be a finite number"),
        ({"restart_s": INF}, "restart_s: must be a finite number"),
        ({"restart_s": 1e9}, "restart_s: must be <= 604800"),
        ({"scaling": {"comm_ratio": INF}}, "scaling.comm_ratio: must be a finite number"),
        (
            {"dataset": {"gb": INF, "cloud": "aws", "region": "us-east-1"}},
            "dataset.gb: must be a finite number",
        ),
        ({"gpus": 100000}, "gpus: must be <= 1024"),
    ],
)
def test_job_specs_refuse_infinite_and_absurd_values(fields: dict[str, Any], message: str) -> None:
    job = {"name": "a", "throughput": {"V100": 1.0}, "work": {"steps": 100}} | fields
    with pytest.raises(InputError) as info:
        parse_jobs({"jobs": [job]})
    assert f"jobs[0] (a).{message}" in str(info.value)


def test_the_planner_refuses_an_infinite_job_before_solving(db_url: str, tmp_path: Path) -> None:
    spec = tmp_path / "jobs.yaml"
    spec.write_text("jobs:\n  - name: a\n    throughput: {V100: .inf}\n    work: {steps: 1000}\n")
    result = run_cli(db_url, "plan", spec)
    assert result.exit_code == 2 and "throughput.V100: must be a finite number" in result.stderr


@pytest.mark.parametrize("usd", ["1e308", "10000.01"])
def test_absurd_csv_prices_are_refused(db_url: str, tmp_path: Path, usd: str) -> None:
    path = tmp_path / "p.csv"
    path.write_text(
        "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n"
        f"2024-05-01T00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,{usd}\n"
    )
    before = counts(db_url)
    result = run_cli(db_url, "import", "csv", path)
    assert result.exit_code == 2
    assert f"p.csv: line 2: usd_per_hour: '{usd}' is above 10,000 USD per hour" in result.stderr
    assert counts(db_url) == before


def test_csv_times_out_of_range_are_refused(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(
        "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n"
        "9999-12-31T23:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,1\n"
    )
    result = run_cli(db_url, "import", "csv", path)
    assert result.exit_code == 2 and "timestamp: '9999-12-31T23:00Z' is outside 1970-01-01" in result.stderr


@pytest.mark.parametrize(
    ("command", "example", "looks_like"),
    [
        ("azure-retail", "aws-spot-price-history.json", "an AWS describe-spot-price-history answer"),
        ("aws-spot-history", "azure-retail-prices.json", "an Azure Retail Prices API page"),
    ],
)
def test_a_dump_of_the_other_format_says_what_it_is(
    db_url: str, command: str, example: str, looks_like: str
) -> None:
    before = counts(db_url)
    result = run_cli(db_url, "import", command, EXAMPLES / example)
    assert result.exit_code == 2 and f"this looks like {looks_like}" in result.stderr
    assert "spotopt import" in result.stderr
    assert counts(db_url) == before


@pytest.mark.parametrize("reader", [read_spot_history, read_retail_pages])
@pytest.mark.parametrize("text", ['{"foo": 1}', '{\n"foo": 1\n}', '[{"foo": 1}]'])
def test_an_unrelated_json_file_is_not_a_dump(tmp_path: Path, reader: Any, text: str) -> None:
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(InputError, match="this looks like an object with the keys foo"):
        list(reader(path, None))


def test_one_page_of_a_longer_answer_is_flagged(db_url: str, tmp_path: Path) -> None:
    document = json.loads((EXAMPLES / "aws-spot-price-history.json").read_text())
    path = tmp_path / "page.json"
    flagged = "NextToken is set in the last document: this dump is one page of a longer answer"
    for token, indent in (("abc", 1), ("abc", None), ("", 1), (None, None)):
        path.write_text(json.dumps(document | {"NextToken": token}, indent=indent))
        result = run_cli(db_url, "import", "aws-spot-history", path, "--format", "json")
        assert result.exit_code == 0
        assert (flagged in result.stderr) == bool(token)


def test_a_huge_integer_names_its_field(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    item = (
        '{"AvailabilityZone": "us-east-1a", "InstanceType": "p3.2xlarge", "ProductDescription": '
        '"Linux/UNIX", "Timestamp": "2024-01-01T00:00:00Z", "SpotPrice": 9223372036854775808}'
    )
    path.write_text('{"SpotPriceHistory": [\n' + item + "\n]}\n")
    with pytest.raises(InputError, match="not valid JSON in field 'SpotPrice'"):
        list(read_spot_history(path, None))
    path.write_text('{"SpotPriceHistory": [' + item + "]}\n")  # one line: Python's json reads it
    with pytest.raises(InputError, match=r"SpotPrice: 9223372036854775808 is above 10,000 USD per hour"):
        list(read_spot_history(path, None))


@pytest.mark.parametrize(
    ("deadline", "message"),
    [
        ("9999-12-31T00:00Z", "deadline: 9999-12-31T00:00:00+00:00 is outside 1970-01-01..2200-01-01"),
        ("99999999w", "deadline: '99999999w' is longer than 100 years"),
    ],
)
def test_job_deadlines_are_bounded(deadline: str, message: str) -> None:
    job = {"name": "a", "throughput": {"V100": 1.0}, "work": {"steps": 100}, "deadline": deadline}
    with pytest.raises(InputError) as info:
        parse_jobs({"jobs": [job]})
    assert f"jobs[0] (a).{message}" in str(info.value)
