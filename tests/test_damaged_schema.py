"""A SQLite history whose schema page is damaged is reported in one line by every command that
opens it, naming the file and how to recover it (issue 36 item 21): ``db current`` printed a
traceback and the other commands called it "not a SQLite database"."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import cli as run_cli


@pytest.fixture
def damaged_history(tmp_path: Path) -> Path:
    path = tmp_path / "history.sqlite"
    code, _, err = run_cli("--db", f"sqlite:///{path}", "db", "upgrade")
    assert code == 0, err
    data = bytearray(path.read_bytes())
    at = data.index(b"CREATE TABLE")
    data[at : at + 12] = b"CREATX TABLX"  # a table's definition in sqlite_master, unreadable
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("command", [["db", "current"], ["catalog", "list"]])
def test_a_damaged_schema_is_one_line_naming_the_file_and_the_recovery(
    damaged_history: Path, command: list[str]
) -> None:
    before = damaged_history.read_bytes()
    code, out, err = run_cli("--db", f"sqlite:///{damaged_history}", *command)
    assert code != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"the database {damaged_history} is damaged" in lines[0]
    assert ".recover" in lines[0]
    assert damaged_history.read_bytes() == before
