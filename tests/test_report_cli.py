"""``spotopt report list|run|sql`` through the CLI: formats, plots, runnable SQL, clean failures."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import func, select
from typer.testing import CliRunner

from spotopt.cli.app import app
from spotopt.db.engine import Database
from spotopt.db.models import PricePoint, Run
from spotopt.history.setup import open_history
from spotopt.reports import plots
from spotopt.reports.registry import REPORTS
from tests import report_history as hist
from tests.report_history import iso

runner = CliRunner()
WINDOW = ["-p", f"since={iso(0)}", "-p", f"until={iso(48)}"]


def cli(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def history_url(db_url: str) -> str:
    db = open_history(db_url)
    hist.build(db)
    db.dispose()
    return db_url


@pytest.fixture
def sqlite_history(sqlite_db: Database) -> str:
    hist.build(sqlite_db)
    return sqlite_db.engine.url.render_as_string()


def test_list_names_every_report_and_its_parameters() -> None:
    code, out, _ = cli("report", "list", "--format", "json")
    assert code == 0
    listed = {row["report"]: row for row in json.loads(out)}
    assert set(listed) == set(REPORTS)
    assert "bucket: time bucket" in listed["cheapest"]["parameters"]
    assert listed["spot-discount"]["plot"] == "yes" and listed["coverage"]["plot"] == "no"


@pytest.mark.parametrize("name", [n for n, r in REPORTS.items() if r.plot])
def test_plots_are_pngs_of_the_right_size(history_url: str, tmp_path: Path, name: str) -> None:
    png = tmp_path / f"{name}.png"
    code, out, err = cli(
        "--db", history_url, "report", "run", name, *WINDOW, "-p", "gpu=V100", "-f", "csv", "--plot", str(png)
    )
    assert code == 0, err
    assert "V100-16GB" in out and "plot written" in err
    assert png.stat().st_size > 10_000
    with Image.open(png) as image:
        assert image.format == "PNG"
        assert image.size == (plots.WIDTH_PX, plots.HEIGHT_PX)


def test_csv_and_json_output(sqlite_history: str) -> None:
    code, out, _ = cli(
        "--db", sqlite_history, "report", "run", "spot-discount", *WINDOW, "-p", "gpu=V100", "-f", "csv"
    )
    assert code == 0
    table = {(r["cloud"], r["region"]): r for r in csv.DictReader(io.StringIO(out))}
    assert table[("aws", "us-east-1")]["best_x"] == "6.0"
    assert table[("aws", "us-east-1")]["best_at"] == "2024-05-01T06:00:00Z"
    code, out, _ = cli("--db", sqlite_history, "report", "run", "interruptions", *WINDOW, "-f", "json")
    assert code == 0
    sections = json.loads(out)
    assert set(sections) == {"observations", "survival"}
    assert {r["median_hours"] for r in sections["survival"] if r["zone"] == "us-east-1a"} == {8.0}
    code, out, _ = cli(
        "--db", sqlite_history, "report", "run", "coverage", "-p", f"until={iso(48)}", "-f", "csv"
    )
    assert code == 0 and out.startswith("# section: markets\n") and "\n# section: runs\n" in out


def test_sql_prints_runnable_sql_for_each_dialect(sqlite_history: str) -> None:
    code, out, _ = cli(
        "--db", sqlite_history, "report", "sql", "price-board", "-p", "gpu=V100", "-p", f"at={iso(12)}"
    )
    assert code == 0 and out.startswith("-- price-board: board\n")
    path = sqlite_history.removeprefix("sqlite:///")
    with sqlite3.connect(path) as conn:
        found = conn.execute(out).fetchall()
    assert len(found) == 9  # the eight markets, A twice (two sources at h6): as the report reads it
    code, out, _ = cli("report", "sql", "cheapest", "-p", "gpu=V100", "--dialect", "postgresql")
    assert code == 0 and "LIKE 'V100-%'" in out and "+00:00'" in out
    code, out, _ = cli("report", "sql", "coverage", "--dialect", "sqlite")
    assert code == 0 and "-- coverage: points" in out and "ORDER BY price_points.market_id" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "cheapest", "-p", "bucket=month"], "parameter bucket: 'month' is not valid"),
        (["run", "cheapest", "-p", "gpu"], "--param 'gpu' is not name=value"),
        (["run", "volatility", "-p", "since=soon"], "parameter since: 'soon' is not a time"),
        (["run", "cheapest", "--plot", "OUT"], "write a .png file"),
        (["run", "price-board", "-p", "gpu=V100", "--plot", "OUT.png"], "report price-board has no plot"),
        (["run", "chepest"], "no report 'chepest' (did you mean 'cheapest'?)"),
        (["sql", "coverage", "-p", "gap_hours=zero"], "parameter gap_hours: 'zero' is not a float in (0, "),
    ],
)
def test_bad_input_exits_non_zero_and_leaves_nothing_behind(
    tmp_path: Path, args: list[str], message: str
) -> None:
    args = [str(tmp_path / a) if a.startswith("OUT") else a for a in args]
    code, out, err = cli("--db", f"sqlite:///{tmp_path / 'never-created.sqlite'}", "report", *args)
    assert code == 2
    assert message in err
    assert list(tmp_path.iterdir()) == []  # neither the database nor a plot
    assert out == ""


def _counts(db: Database) -> tuple[int | None, ...]:
    with db.session() as session:
        return tuple(session.scalar(select(func.count()).select_from(t)) for t in (PricePoint, Run))


def test_bad_parameter_leaves_an_existing_history_unchanged(sqlite_history: str, tmp_path: Path) -> None:
    db = open_history(sqlite_history)
    try:
        before = _counts(db)
        plot = tmp_path / "x.png"
        code, _, err = cli(
            "--db", sqlite_history, "report", "run", "cheapest", "-p", "market=reserved", "--plot", str(plot)
        )
        assert code == 2 and "parameter market" in err and "spot, on-demand, all" in err
        assert _counts(db) == before and not plot.exists()
    finally:
        db.dispose()
