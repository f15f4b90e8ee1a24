"""Issue 36 items 15, 20 and 21: bad input refused in one line naming the field and the fix,
with the history unchanged, through the installed ``spotopt`` script as users run it.

Each case failed on the code before the fix: a traceback (``OverflowError``, PostgreSQL's
``NumericValueOutOfRange`` and ``DataError``), or the input accepted (times past 2200, a key
given twice, a bare-number deadline, a truncated row, a damaged page read as fewer rows, a GCP
price filed under a zone).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import func, select

from spotopt.db.engine import make_engine
from spotopt.db.models import ManagedJob
from spotopt.errors import InputError
from spotopt.files import check_text
from spotopt.jobspec import read_yaml
from tests.helpers import console
from tests.import_helpers import EXAMPLES, counts
from tests.traces import TRACE_MARKET

TRACE_OPTIONS = ("--start", "2022-10-26T22:05:04Z", *TRACE_MARKET)
AVAILABILITY_HEADER = "timestamp,cloud,region,zone,instance_type,available,launched,requested\n"
LIFETIMES_HEADER = "cloud,region,zone,instance_type,instance_id,launched_at,ended_at,end_reason\n"
PRICE_HEADER = "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n"
MANAGED_JOB = """\
jobs:
  - name: resnet
    throughput: {{V100: 2.4}}
    work: {{steps: 9850}}
    run: {run}
    checkpoint: {{uri: ckpt, every: 10m}}
    budget_usd: 50
"""


def spotopt(db_url: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return console(db_url, *args, columns=120)


def refused(db_url: str, *args: str | Path) -> str:
    """Run a command that must be refused: exit 2, no output, one line on stderr (returned)."""
    done = spotopt(db_url, *args)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def jobs(db_url: str) -> int:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return conn.scalar(select(func.count()).select_from(ManagedJob)) or 0
    finally:
        engine.dispose()


def trace(path: Path, gap: float, data: list[int]) -> Path:
    path.write_text(json.dumps({"metadata": {"gap_seconds": gap}, "data": data}))
    return path


# Item 20: tracebacks where a one-line error belongs.


@pytest.mark.parametrize("gap", [1e300, 1e15])
@pytest.mark.parametrize("command", ["availability", "lifetimes"])
def test_a_trace_gap_beyond_100_years_is_refused(
    sqlite_url: str, tmp_path: Path, command: str, gap: float
) -> None:
    before = counts(sqlite_url)
    line = refused(sqlite_url, "import", command, trace(tmp_path / "t.json", gap, [1, 0, 1]), *TRACE_OPTIONS)
    assert f"t.json: metadata.gap_seconds: {gap!r} is more than 100 years between probes" in line
    assert "give the time between two probes in seconds" in line
    assert counts(sqlite_url) == before


def test_a_huge_requested_count_is_refused_on_both_backends(db_url: str, tmp_path: Path) -> None:
    """One bound for the option and the CSV column (100,000); PostgreSQL refused it only at insert."""
    before = counts(db_url)
    line = refused(
        db_url,
        "import",
        "availability",
        trace(tmp_path / "t.json", 600, [1, 0, 1]),
        *TRACE_OPTIONS,
        "--requested",
        "99999999999999999999",
    )
    assert "--requested 99999999999999999999: a probe asks for 1 to 100,000 instances" in line
    assert counts(db_url) == before


def test_a_nul_in_a_lifetime_instance_id_is_refused_on_both_backends(db_url: str, tmp_path: Path) -> None:
    path = tmp_path / "l.csv"
    path.write_text(
        LIFETIMES_HEADER
        + "aws,us-east-1,us-east-1a,p3.2xlarge,i-1,2020-02-01T00:00:00Z,2020-02-01T05:00:00Z,preempted\n"
        + "aws,us-east-1,us-east-1a,p3.2xlarge,i-\x002,2020-02-01T00:00:00Z,,\n"
    )
    before = counts(db_url)
    line = refused(db_url, "import", "lifetimes", path)
    assert "l.csv: line 3: instance_id: 'i-\\x002' contains a NUL character (\\x00); remove it" in line
    assert counts(db_url) == before


def test_a_nul_in_a_job_command_is_refused_on_both_backends(db_url: str, tmp_path: Path) -> None:
    """YAML's "\\0" escape is the way a NUL gets into a job spec (a raw one is not YAML)."""
    spec = tmp_path / "job.yaml"
    spec.write_text(MANAGED_JOB.format(run='"python train.py\\0"'))
    line = refused(db_url, "jobs", "submit", spec)
    assert "jobs[0] (resnet).run: 'python train.py\\x00' contains a NUL character (\\x00)" in line
    assert jobs(db_url) == 0


def test_check_text_passes_text_without_nul() -> None:
    assert check_text("w-1 (résumé) ✓", "workload") == "w-1 (résumé) ✓"
    with pytest.raises(InputError, match=r"^t.csv: line 2: workload: 'a\\x00b' contains a NUL"):
        check_text("a\x00b", "t.csv: line 2: workload")


# Item 21: accepted where it should be refused.


@pytest.mark.parametrize("command", ["availability", "lifetimes"])
def test_trace_probes_past_2200_are_refused(sqlite_url: str, tmp_path: Path, command: str) -> None:
    """A gap of 10^9 s from 2022 puts probe 6 in 2212: past the times spotopt stores."""
    before = counts(sqlite_url)
    path = trace(tmp_path / "t.json", 1e9, [1, 1, 1, 1, 1, 1, 1, 0])
    line = refused(sqlite_url, "import", command, path, *TRACE_OPTIONS)
    assert "t.json: data[6]: 2212-12-14T08:45:04+00:00 is outside 1970-01-01..2200-01-01" in line
    assert "check --start and metadata.gap_seconds" in line
    assert counts(sqlite_url) == before


def test_a_key_given_twice_in_a_job_file_is_refused(sqlite_url: str, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text(MANAGED_JOB.format(run="python train.py") + "    budget_usd: 5000\n")
    line = refused(sqlite_url, "jobs", "submit", spec)
    assert "job.yaml: not valid YAML: line 8, column 5: 'budget_usd' appears twice" in line
    assert "(first on line 7); keep one" in line
    assert jobs(sqlite_url) == 0
    assert "'budget_usd' appears twice" in refused(sqlite_url, "plan", spec)


def test_yaml_merge_keys_may_still_be_overridden() -> None:
    """``<<`` merges keys that the mapping may override, as YAML defines: not a duplicate."""
    text = "base: &b {gpus: 1, restart_s: 10}\njob:\n  <<: *b\n  gpus: 2\n"
    assert read_yaml(text, "x.yaml")["job"] == {"gpus": 2, "restart_s": 10}
    with pytest.raises(InputError, match="line 3, column 3: 'a' appears twice"):
        read_yaml("m:\n  a: 1\n  a: 1\n", "x.yaml")


@pytest.mark.parametrize("deadline", ["12345", "1700000000.5"])
def test_a_bare_number_deadline_is_refused(sqlite_url: str, tmp_path: Path, deadline: str) -> None:
    """12345 was read as seconds since 1970: a deadline long past."""
    spec = tmp_path / "jobs.yaml"
    spec.write_text(
        "jobs:\n  - name: a\n    throughput: {V100: 1}\n    work: {steps: 1000}\n"
        f"    deadline: {deadline}\n"
    )
    done = spotopt(sqlite_url, "plan", spec)
    assert done.returncode == 2 and done.stdout == ""
    assert (
        f"jobs[0] (a).deadline: {deadline} is a bare number; write a duration with its unit "
        "(72h, 3d, 90m) or an ISO 8601 time (2025-06-01T12:00Z)"
    ) in done.stderr


@pytest.mark.parametrize(
    ("row", "lacking"),
    [
        ("2022-10-26T22:05:04Z,aws,us-west-2,us-west-2a,p3.2xlarge,1\n", "launched, requested"),
        ("2022-10-26T22:05:04Z,aws,us-west-2,us-west-2a,p3.2xlarge,1,1\n", "requested"),
        ("2022-10-26T22:15:04Z,aws,us-west-2,us-west-2a,p3.2x", "available, launched, requested"),
    ],
)
def test_availability_rows_cut_short_are_refused(
    sqlite_url: str, tmp_path: Path, row: str, lacking: str
) -> None:
    """The price CSV's rule: every column the header names and the command reads has a cell."""
    path = tmp_path / "a.csv"
    path.write_text(
        AVAILABILITY_HEADER + "2022-10-26T22:00:04Z,aws,us-west-2,us-west-2a,p3.2xlarge,1,1,1\n" + row
    )
    before = counts(sqlite_url)
    line = refused(sqlite_url, "import", "availability", path)
    assert line == f"error: a.csv: line 3: too few fields (no {lacking})"
    assert counts(sqlite_url) == before


def test_empty_optional_cells_are_still_unknown(sqlite_url: str, tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(AVAILABILITY_HEADER + "2022-10-26T22:00:04Z,aws,us-west-2,us-west-2a,p3.2xlarge,1,,\n")
    done = spotopt(sqlite_url, "import", "availability", path, "--format", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["inserted"] == 1


def _damage_price_points(path: Path) -> tuple[int, bytes]:
    """Overwrite the header of ``price_points``' root page as a bad disk would (9 cells said
    where there are more): SQLite then read fewer rows without complaint. Returns the page's
    offset and the bytes it held."""
    with sqlite3.connect(path) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        root = conn.execute("SELECT rootpage FROM sqlite_master WHERE name = 'price_points'").fetchone()[0]
    conn.close()
    offset = (root - 1) * page_size
    with path.open("r+b") as raw:
        raw.seek(offset)
        held = raw.read(5)
        raw.seek(offset)
        raw.write(b"\x0d\x00\x00\x00\x09")
    return offset, held


def test_a_damaged_page_is_reported_not_read_or_written(sqlite_url: str, tmp_path: Path) -> None:
    assert spotopt(sqlite_url, "import", "csv", EXAMPLES / "prices.csv").returncode == 0
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    prices = counts(sqlite_url)["price_points"]
    offset, held = _damage_price_points(path)
    damaged = (
        f"error: the database {path} is damaged (database disk image is malformed); restore it from a backup"
    )
    for args in (("prices", "show"), ("prices", "cheapest", "--gpu", "V100")):
        line = refused(sqlite_url, *args)
        assert line.startswith(damaged) and f"`sqlite3 {path} .recover | sqlite3 NEW.sqlite`" in line
    more = tmp_path / "more.csv"
    more.write_text(PRICE_HEADER + "2025-05-01T00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.9\n")
    assert refused(sqlite_url, "import", "csv", more).startswith(damaged)
    with path.open("r+b") as raw:  # repaired, the table holds what it held: nothing was written
        raw.seek(offset)
        raw.write(held)
    assert counts(sqlite_url)["price_points"] == prices


# Item 15 (part): GCP prices are per region; the import summary names the command.


def test_a_gcp_price_with_a_zone_is_its_region_price(sqlite_url: str, tmp_path: Path) -> None:
    path = tmp_path / "g.csv"
    path.write_text(
        PRICE_HEADER
        + "2024-05-01T00:00Z,gcp,us-central1,,a2-highgpu-1g,spot,1.1\n"
        + "2024-05-01T00:00Z,gcp,us-central1,us-central1-a,a2-highgpu-1g,spot,1.1\n"
        + "2024-05-01T01:00Z,gcp,us-central1,us-central1-b,a2-highgpu-1g,spot,1.2\n"
    )
    done = spotopt(sqlite_url, "import", "csv", path, "--format", "json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["inserted"], summary["duplicate"]) == (2, 1)
    assert done.stderr.strip() == (
        "warning: g.csv: 2 GCP row(s) name a zone (first: line 3); GCP prices are per region, so they "
        "were stored as their region's prices (leave zone empty for GCP to silence this)"
    )
    shown = spotopt(sqlite_url, "prices", "show", "--cloud", "gcp", "--format", "json")
    assert shown.returncode == 0, shown.stderr
    rows = [
        r for r in json.loads(shown.stdout) if r["instance_type"] == "a2-highgpu-1g" and r["market"] == "spot"
    ]
    assert sorted((r["zone"], r["usd_per_hour"]) for r in rows) == [(None, 1.1), (None, 1.2)]
    a_zone = PRICE_HEADER + "2024-05-01T00:00Z,gcp,us-central1,europe-west4-a,a2-highgpu-1g,spot,1.1\n"
    path.write_text(a_zone)  # the zone is still checked against the region
    assert "zone: 'europe-west4-a' lies in europe-west4, not in region 'us-central1'" in refused(
        sqlite_url, "import", "csv", path
    )


def test_the_import_summary_names_the_command(sqlite_url: str, tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text(AVAILABILITY_HEADER + "2022-10-26T22:00:04Z,aws,us-west-2,us-west-2a,p3.2xlarge,1,1,1\n")
    done = spotopt(sqlite_url, "import", "availability", path)
    assert done.returncode == 0, done.stderr
    assert "Import availability (run " in done.stdout and "import-availability" not in done.stdout


@pytest.fixture
def sqlite_url(sqlite_template: Path, tmp_path: Path) -> str:
    """A fresh migrated SQLite history (the items that are not about PostgreSQL)."""
    path = tmp_path / "history.sqlite"
    shutil.copy(sqlite_template, path)
    return f"sqlite:///{path}"
