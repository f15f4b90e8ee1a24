"""Issue 14: bad input that used to end in a traceback ends in one line naming the field, exit 2.

Also: user text is never read as rich markup, and every ``--format json`` is strict JSON.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from spotopt.errors import InputError
from spotopt.history.importers.csv_prices import COLUMNS
from spotopt.history.throughput_store import read_file
from spotopt.jobspec import load_jobs
from spotopt.render import render, to_json
from spotopt.times import parse_time
from tests.helpers import cli, strict_json

HEADER = ",".join(COLUMNS) + "\n"


@pytest.mark.parametrize("text", ["[/x]", "[red]aws[/red]", "[exp1] resnet"])
def test_user_text_in_errors_prints_as_written(text: str) -> None:
    code, out, err = cli("prices", "show", "--since", text)
    assert code == 2 and out == ""
    assert f"--since: {text!r} is not a time" in err


def test_markup_like_csv_cloud_is_named_as_written(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(HEADER + "2024-05-01T00:00Z,[red]aws[/red],us-east-1,,p3.2xlarge,spot,0.9\n")
    code, _, err = cli("--db", db_url, "import", "csv", path)
    assert code == 2 and "'[red]aws[/red]' is not a cloud" in err
    path.write_text(HEADER + "2024-05-01T00:00Z,[/x],us-east-1,,p3.2xlarge,spot,0.9\n")
    code, _, err = cli("--db", db_url, "import", "csv", path)
    assert code == 2 and "'[/x]' is not a cloud" in err


def test_markup_like_names_show_in_tables(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("workload,gpu_model,gpu_count,steps_per_s\n[exp1] resnet,V100,1,2\n[/x],V100,1,3\n")
    assert cli("--db", db_url, "throughput", "import", path)[0] == 0
    code, out, _ = cli("--db", db_url, "throughput", "list")
    assert code == 0 and "[exp1] resnet" in out and "[/x]" in out


def test_render_titles_and_cells_are_plain_text() -> None:
    out = io.StringIO()
    render([{"job": "[exp1] resnet", "cloud": "[red]aws[/red]"}], title="[/x] jobs", out=out)
    text = out.getvalue()
    assert "[exp1] resnet" in text and "[red]aws[/red]" in text and "[/x] jobs" in text


def test_to_json_never_writes_nan_or_infinity() -> None:
    text = to_json([{"a": float("inf"), "b": float("-inf"), "c": float("nan"), "d": 1.5}])
    assert strict_json(text) == [{"a": None, "b": None, "c": None, "d": 1.5}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("-99999999d", "reaches before 1970-01-01"),
        ("9999-12-31T23:00Z", "is outside 1970-01-01..2200-01-01"),
        ("9999-12-31T23:00-05:00", "is outside 1970-01-01..2200-01-01"),
        ("0001-01-01", "is outside 1970-01-01..2200-01-01"),
    ],
)
def test_times_out_of_range_name_the_field(text: str, message: str) -> None:
    with pytest.raises(InputError, match=f"--at: '{text}' {message}"):
        parse_time(text, "--at")


@pytest.mark.parametrize(
    "args",
    [
        ["prices", "show", "--since", "-99999999d"],
        ["prices", "cheapest", "--gpu", "V100", "--at", "9999-12-31T23:00Z"],
        ["report", "run", "cheapest", "-p", "since=0001-01-01", "-p", "bucket=hour"],
    ],
)
def test_far_times_are_refused_by_the_cli(db_url: str, args: list[str]) -> None:
    code, out, err = cli("--db", db_url, *args)
    assert code == 2 and out == "" and "1970-01-01" in err


def test_plan_at_the_end_of_time_is_refused(db_url: str, tmp_path: Path) -> None:
    spec = tmp_path / "jobs.yaml"
    spec.write_text("jobs:\n  - name: a\n    throughput: {V100: 1}\n    work: {steps: 1000}\n")
    code, _, err = cli("--db", db_url, "plan", spec, "--at", "9999-12-31T23:00Z")
    assert code == 2 and "--at: '9999-12-31T23:00Z' is outside" in err


def test_huge_limit_is_a_usage_error(db_url: str) -> None:
    code, _, err = cli("--db", db_url, "prices", "show", "--limit", "99999999999999999999")
    assert code == 2 and "--limit" in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e300", "0"])
def test_report_gap_hours_must_be_finite_and_positive(db_url: str, value: str) -> None:
    code, _, err = cli("--db", db_url, "report", "run", "coverage", "-p", f"gap_hours={value}")
    assert code == 2 and f"parameter gap_hours: '{value}' is not a float in (0, " in err


def test_typer_option_errors_do_not_start_with_value_error() -> None:
    code, _, err = cli("prices", "show", "--format", "xml")
    assert code == 2 and "'xml' is not one of" in err and "Value error" not in err


def test_non_utf8_job_spec_and_throughput_file(tmp_path: Path) -> None:
    spec = tmp_path / "jobs.yaml"
    spec.write_bytes(b"jobs:\n  - name: \xff\xfe\n")
    with pytest.raises(InputError, match=r"jobs.yaml: not UTF-8 text \(byte 0xff at offset 16\)"):
        load_jobs(spec)
    for name in ("t.csv", "t.json"):
        path = tmp_path / name
        path.write_bytes(b"workload,gpu_model,gpu_count,steps_per_s\n\xff,V100,1,2\n")
        with pytest.raises(InputError, match="not UTF-8"):
            read_file(path)


def test_non_utf8_throughput_file_through_the_cli(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"workload,gpu_model,gpu_count,steps_per_s\n\xff,V100,1,2\n")
    code, _, err = cli("--db", db_url, "throughput", "import", path)
    assert code == 2 and "not UTF-8" in err


def test_yaml_errors_name_the_file_and_line(tmp_path: Path) -> None:
    spec = tmp_path / "jobs.yaml"
    spec.write_text("jobs:\n  - name: [x\n    b: 1\n")
    with pytest.raises(InputError) as info:
        load_jobs(spec)
    assert str(info.value).startswith(f"{spec}: not valid YAML: line 3, column 6: ")
    assert "<unicode string>" not in str(info.value)


def test_throughput_rows_are_numbered_like_import(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("workload,gpu_model,gpu_count,steps_per_s\nw,V100,1,2\nw,V100,1,0\n")
    with pytest.raises(InputError, match=r"t\.csv: line 3: steps_per_s '0'"):
        read_file(path)


def test_job_names_that_look_like_markup_show_in_the_plan(db_url: str, tmp_path: Path) -> None:
    """The render path is shared: plan's table prints job names exactly as written."""
    spec = tmp_path / "jobs.yaml"
    spec.write_text(
        'jobs:\n  - name: "[exp1] resnet"\n    throughput: {V100: 2.4}\n    work: {steps: 1000}\n'
        '  - name: "[/x]"\n    throughput: {V100: 2.4}\n    work: {steps: 1000}\n'
    )
    code, out, err = cli("--db", db_url, "plan", spec, "--at", "2024-05-01", "--format", "csv")
    assert code == 0, err
    code, out, err = cli("--db", db_url, "plan", spec, "--at", "2024-05-01")
    assert code == 0, err
    assert "[exp1]" in out and "[/x]" in out
