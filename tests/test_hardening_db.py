"""Issue 14: databases that are not what they seem are refused untouched; killed runs are failed."""

from __future__ import annotations

import hashlib
import os
import socket
import sqlite3
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, make_url, select, text

from spotopt.db.engine import Database
from spotopt.db.models import Run
from spotopt.errors import ConfigError
from spotopt.history.setup import open_history
from tests.helpers import cli, ingest, price
from tests.pg import PostgresServer


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_empty_db_url_is_refused_not_the_default(tmp_path: Path) -> None:
    code, out, err = cli("--db", "", "prices", "show")
    assert code == 2 and out == "" and "--db: the URL is empty" in err
    assert not (tmp_path / "default.sqlite").exists()  # $SPOTOPT_DB_URL of the test environment


def test_missing_directory_is_refused_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "dir"
    code, _, err = cli("--db", f"sqlite:///{missing / 'x.db'}", "prices", "show")
    assert code == 2 and f"directory {missing} does not exist" in err
    assert not (tmp_path / "typo").exists()


def test_a_new_database_is_announced(tmp_path: Path) -> None:
    path = tmp_path / "new.sqlite"
    code, _, err = cli("--db", f"sqlite:///{path}", "prices", "show", "--limit", "1")
    assert code == 0 and f"note: created a new, empty history database at {path}" in err
    code, _, err = cli("--db", f"sqlite:///{path}", "prices", "show", "--limit", "1")
    assert code == 0 and "created" not in err


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "prices.csv"
    path.write_text("timestamp,cloud\n" * 200)
    before = digest(path)
    code, out, err = cli("--db", f"sqlite:///{path}", "prices", "show")
    assert code == 2 and out == "" and "is not a SQLite database (file is not a database)" in err
    assert digest(path) == before


@pytest.mark.parametrize("command", [["prices", "show"], ["db", "upgrade"]])
def test_another_applications_sqlite_file_is_left_untouched(tmp_path: Path, command: list[str]) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("create table markets(x)")
    conn.close()
    before = digest(path)
    code, _, err = cli("--db", f"sqlite:///{path}", *command)
    assert code == 2 and "holds tables of another application (markets)" in err
    assert digest(path) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]


def test_another_applications_postgres_database_is_left_untouched(pg_server: PostgresServer) -> None:
    with create_engine(pg_server.url(), isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text("CREATE DATABASE someone_else"))
    url = pg_server.url("someone_else")
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("create table markets(x int)"))
    for command in (["prices", "show"], ["db", "upgrade"]):
        code, _, err = cli("--db", url, *command)
        assert code == 2 and "holds tables of another application (markets)" in err
    assert inspect(engine).get_table_names() == ["markets"]
    engine.dispose()


def _read_only_url(db_url: str) -> str:
    """The same database, refusing every write: SQLite opened read-only, PostgreSQL read-only."""
    if db_url.startswith("sqlite"):
        return f"sqlite:///file:{make_url(db_url).database}?mode=ro&uri=true"
    name = make_url(db_url).database
    with create_engine(db_url, isolation_level="AUTOCOMMIT").connect() as conn:
        conn.execute(text(f"ALTER DATABASE {name} SET default_transaction_read_only = on"))
    return db_url


@pytest.mark.parametrize(
    "command",
    [
        ["throughput", "import", "THROUGHPUT"],
        ["import", "csv", "PRICES"],
    ],
)
def test_a_read_only_database_refuses_writes_with_one_line(
    db_url: str, tmp_path: Path, command: list[str]
) -> None:
    open_history(db_url).dispose()  # schema and catalog in place before it turns read-only
    files = {
        "THROUGHPUT": ("t.csv", "workload,gpu_model,gpu_count,steps_per_s\nw,V100,1,2\n"),
        "PRICES": (
            "p.csv",
            "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n"
            "2024-05-01T00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.9\n",
        ),
    }
    args = []
    for word in command:
        if word in files:
            name, content = files[word]
            (tmp_path / name).write_text(content)
            word = str(tmp_path / name)
        args.append(word)
    url = _read_only_url(db_url)
    code, out, err = cli("--db", url, *args)
    assert code == 2 and out == "" and "Traceback" not in err
    assert "is read-only" in err or "refused the write" in err
    assert cli("--db", url, "prices", "show", "--limit", "1")[0] == 0  # reading still works


def test_runs_record_their_process(db: Database) -> None:
    summary = ingest(db, [price("p3.2xlarge", "2024-05-01 00:00", 0.9)])
    with db.session() as session:
        run = session.get(Run, summary.run_id)
        assert run is not None and (run.pid, run.host) == (os.getpid(), socket.gethostname())


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_runs_of_killed_processes_are_failed_on_the_next_start(db_url: str) -> None:
    db = open_history(db_url)
    host = socket.gethostname()
    started = datetime(2024, 5, 1, tzinfo=UTC)
    with db.session() as session:
        session.add_all(
            [
                Run(source="csv", scope="killed", started_at=started, status="running", pid=_dead_pid()),
                Run(source="csv", scope="alive", started_at=started, status="running", pid=os.getpid()),
                Run(source="csv", scope="elsewhere", started_at=started, status="running", host="x.invalid"),
                Run(source="csv", scope="old", started_at=started, status="running", pid=None, host=None),
            ]
        )
    db.dispose()
    open_history(db_url).dispose()
    db = open_history(db_url)
    with db.session() as session:
        status = {r.scope: (r.status, r.error) for r in session.scalars(select(Run))}
    db.dispose()
    assert status["killed"][0] == "failed"
    assert f"on {host}) ended without finishing" in str(status["killed"][1])
    assert {status[s][0] for s in ("alive", "elsewhere", "old")} == {"running"}


def test_open_history_refuses_empty_url() -> None:
    with pytest.raises(ConfigError, match="URL is empty"):
        open_history("")


HOLDER = """
import sys
from filelock import FileLock
lock = FileLock(sys.argv[1])
lock.acquire()
print("held", flush=True)
sys.stdin.read()
"""


def test_a_second_writer_waits_visibly_then_gives_up_cleanly(
    sqlite_db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another spotopt process holds the SQLite write lock (as a long import does): a second
    import says so, waits the bound, then exits 3 with one line and nothing written."""
    url = sqlite_db.engine.url.render_as_string()
    path = Path(str(make_url(url).database))
    prices = tmp_path / "p.csv"
    prices.write_text(
        "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n"
        "2024-05-01T00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,spot,0.9\n"
    )
    monkeypatch.setattr("spotopt.db.writelock.WRITE_WAIT_S", 0.5)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, f"{path}.write.lock"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        code, out, err = cli("--db", url, "import", "csv", prices)
        assert code == 3 and out == "" and "Traceback" not in err
        assert f"another spotopt process is writing to {path}; waiting up to 0.5 s" in err
        assert "kept writing" in err and "nothing was written" in err
    finally:
        holder.communicate(b"")  # end of stdin: the holder exits and its lock goes with it
    code, out, _ = cli("--db", url, "import", "csv", prices, "--format", "json")
    assert code == 0 and '"inserted": 1' in out
