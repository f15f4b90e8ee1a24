"""The foundation's CLI: settings precedence, db, catalog and prices commands, error mapping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from spotopt.cli.app import app
from spotopt.history.setup import open_history
from tests.helpers import counts, ingest, price

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_db_current_and_upgrade(db_url: str) -> None:
    code, out, _ = run("--db", db_url, "db", "current")
    assert code == 0 and "up to date" in out
    code, out, _ = run("--db", db_url, "db", "upgrade")
    assert code == 0 and "already at" in out


def test_db_flag_beats_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env_db, flag_db = tmp_path / "env.sqlite", tmp_path / "flag.sqlite"
    monkeypatch.setenv("SPOTOPT_DB_URL", f"sqlite:///{env_db}")
    assert run("--db", f"sqlite:///{flag_db}", "catalog", "list", "--cloud", "aws")[0] == 0
    assert flag_db.exists() and not env_db.exists()
    assert run("catalog", "list", "--cloud", "gcp")[0] == 0
    assert env_db.exists()


def test_default_is_a_sqlite_file_in_the_user_data_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPOTOPT_DB_URL")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert run("catalog", "list", "--gpu", "H100")[0] == 0
    assert (tmp_path / "xdg" / "spotopt" / "spotopt.sqlite").exists()


def test_catalog_list_filters(db_url: str) -> None:
    code, out, _ = run(
        "--db", db_url, "catalog", "list", "--cloud", "azure", "--gpu", "V100", "--format", "json"
    )
    assert code == 0
    rows = json.loads(out)
    assert rows and {r["cloud"] for r in rows} == {"azure"}
    assert all(r["gpu"].startswith("V100-") for r in rows)
    assert "Standard_NC6s_v3" in {r["instance_type"] for r in rows}


def test_prices_cheapest_json(db_url: str) -> None:
    db = open_history(db_url)
    ingest(
        db,
        [
            price("p3.2xlarge", "2024-01-01 00:00", 0.9),
            price("p3.8xlarge", "2024-01-01 00:00", 3.2, zone="us-east-1b"),
            price("p3.2xlarge", "2024-01-02 00:00", 1.2),
        ],
    )
    db.dispose()
    code, out, err = run(
        "--db",
        db_url,
        "prices",
        "cheapest",
        "--gpu",
        "v100",
        "--at",
        "2024-01-01T12:00Z",
        "--market",
        "spot",
        "--format",
        "json",
    )
    assert code == 0, err
    rows = json.loads(out)
    keys = {
        "cloud",
        "region",
        "zone",
        "instance_type",
        "market",
        "gpu",
        "gpu_count",
        "usd_per_hour",
        "usd_per_gpu_hour",
        "observed_at",
    }
    assert all(keys <= set(r) for r in rows)
    assert [(r["instance_type"], r["usd_per_gpu_hour"]) for r in rows] == [
        ("p3.8xlarge", 0.8),
        ("p3.2xlarge", 0.9),
    ]
    assert rows[0]["observed_at"] == "2024-01-01T00:00:00Z"


def test_prices_show_csv(db_url: str) -> None:
    db = open_history(db_url)
    ingest(db, [price("g5.xlarge", f"2024-03-0{d} 00:00", 0.3 + d / 100) for d in range(1, 4)])
    db.dispose()
    code, out, _ = run(
        "--db",
        db_url,
        "prices",
        "show",
        "--instance-type",
        "g5.xlarge",
        "--market",
        "spot",
        "--since",
        "2024-03-02",
        "--format",
        "csv",
    )
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("observed_at,cloud,region")
    assert len(lines) == 3 and lines[1].startswith(
        "2024-03-02T00:00:00Z,aws,us-east-1,us-east-1a,g5.xlarge,spot"
    )


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["prices", "cheapest", "--gpu", "Z999"], "--gpu"),
        (["prices", "cheapest", "--gpu", "V100", "--market", "reserved"], "--market"),
        (["prices", "cheapest", "--gpu", "V100", "--at", "yesterday-ish"], "--at"),
        (["prices", "show", "--cloud", "oracle"], "--cloud"),
        (["prices", "show", "--since", "2024-02-01", "--until", "2024-01-01"], "--since"),
    ],
)
def test_bad_input_names_the_field_and_changes_nothing(db_url: str, args: list[str], field: str) -> None:
    db = open_history(db_url)
    before = counts(db)
    code, _, err = run("--db", db_url, *args)
    assert code == 2
    assert field in err and "error:" in err
    assert counts(db) == before
    db.dispose()


def test_unreachable_database_is_a_clear_error(tmp_path: Path) -> None:
    code, _, err = run("--db", "postgresql://nobody@/nodb?host=" + str(tmp_path), "catalog", "list")
    assert code == 2 and "cannot connect" in err


@pytest.mark.parametrize(
    "packages",
    [
        ("boto3", "botocore", "google", "azure"),  # the cloud SDKs: only the provider in use
        ("matplotlib", "scipy"),  # only to draw (--plot) and to forecast prices: 0.5 s a command
    ],
)
def test_importing_spotopt_imports_none_of(packages: tuple[str, ...]) -> None:
    probe = (
        "import sys, spotopt, spotopt.cli.app, spotopt.db.queries;"
        f"bad=[m for m in sys.modules if m.split('.')[0] in {packages!r}];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


@pytest.mark.parametrize("command", [["db", "current"], ["db", "upgrade"]])
def test_db_commands_on_unreachable_database(tmp_path: Path, command: list[str]) -> None:
    code, _, err = run("--db", "postgresql://nobody@/nodb?host=" + str(tmp_path), *command)
    assert code == 2 and "cannot connect" in err
