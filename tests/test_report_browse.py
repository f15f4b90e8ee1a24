"""``spotopt report browse``: Datasette serves the history with every report's SQL as a canned
query (a real Datasette process, each query fetched and compared with running its SQL)."""

from __future__ import annotations

import json
import sqlite3
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote

from spotopt.db.engine import Database, sqlite_path
from spotopt.reports.registry import REPORTS
from tests.helpers import cli, counts
from tests.servers import free_port, spotopt_server
from tests.ui_fleet import fill

GPU = "V100-16GB"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as answer:
        return json.loads(answer.read())


def test_browse_serves_each_report_as_a_canned_query(sqlite_db: Database, tmp_path: Path) -> None:
    fill(sqlite_db, tmp_path)
    url = str(sqlite_db.engine.url)
    path = sqlite_path(url)
    assert path is not None
    port = free_port()
    base = f"http://127.0.0.1:{port}/{path.stem}"
    args = ["--db", url, "report", "browse", "--port", str(port), "-p", f"gpu={GPU}"]
    with spotopt_server(args, base + ".json", tmp_path / "browse.log"):
        listed = {q["name"]: q for q in _get(base + ".json")["queries"]}
        expected = set()
        for report in REPORTS.values():
            params = {p.name for p in report.params}
            args_ = report.parse({"gpu": GPU} if "gpu" in params else {})
            expected |= {f"{report.name}-{name}" for name in report.statements(args_)}
        assert set(listed) == expected
        with sqlite3.connect(path) as direct:
            for name, query in listed.items():
                got = _get(f"{base}/{quote(name)}.json?_shape=objects&_size=max")
                assert got["ok"] is True, name
                rows = direct.execute(query["sql"]).fetchall()
                assert len(got["rows"]) == len(rows), name
        board = _get(f"{base}/price-board-board.json?_shape=objects")["rows"]
        assert {r["gpu_model"] for r in board} == {GPU} and len(board) > 3


def test_browse_refuses_postgresql_and_leaves_it_unchanged(pg_url: str) -> None:
    from spotopt.history.setup import open_history

    db = open_history(pg_url)
    before = counts(db)
    code, _, err = cli("--db", pg_url, "report", "browse")
    assert code == 2
    assert "SQLite" in err and "report sql" in err
    assert counts(db) == before
    db.dispose()


def test_browse_refuses_an_unknown_parameter_and_a_public_host(sqlite_db: Database) -> None:
    url = str(sqlite_db.engine.url)
    code, _, err = cli("--db", url, "report", "browse", "-p", "colour=red")
    assert code == 2 and "--param colour" in err
    code, _, err = cli("--db", url, "report", "browse", "--host", "0.0.0.0")
    assert code == 2 and "--host" in err
