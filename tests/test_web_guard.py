"""The web servers refuse what DNS rebinding sends and say they may not be framed (issue 36
item 22): ``spotopt ui``, ``report browse`` and the daemon's ``/metrics`` as real servers on
127.0.0.1, asked over HTTP with a ``Host`` of this machine and of a renamed page; a short
``SPOTOPT_UI_TOKEN`` is refused; one query cannot make Datasette allocate a gigabyte."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from spotopt.db.engine import Database, sqlite_path
from spotopt.mover.metrics import serve
from tests.servers import free_port, spotopt_server
from tests.ui_fleet import fill

pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")

REBOUND = "rebound.example"
"""A page's own name, pointed at 127.0.0.1 by its DNS: what the browser sends as Host."""


def _get(port: int, path: str, host: str) -> tuple[int, dict[str, str], bytes]:
    """GET ``path`` from 127.0.0.1:``port`` with this ``Host`` header."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest("GET", path, skip_host=True)
        conn.putheader("Host", host)
        conn.endheaders()
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def _check(port: int, path: str) -> None:
    """Answered under this machine's names, refused under a renamed page's, framing denied."""
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "127.0.0.1"):
        status, headers, _ = _get(port, path, host)
        assert status == 200, host
        assert "frame-ancestors 'none'" in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY"
    for host in (f"{REBOUND}:{port}", REBOUND, f"127.0.0.1.{REBOUND}"):
        status, headers, body = _get(port, path, host)
        assert status == 400, host
        assert b"not this server's address" in body
        assert headers["x-frame-options"] == "DENY"


@pytest.fixture
def filled(sqlite_db: Database, tmp_path: Path) -> str:
    fill(sqlite_db, tmp_path)
    return str(sqlite_db.engine.url)


@pytest.fixture
def dashboard(filled: str, tmp_path: Path) -> Iterator[int]:
    port = free_port()
    args = ["--db", filled, "ui", "--port", str(port)]
    with spotopt_server(args, f"http://127.0.0.1:{port}/", tmp_path / "ui.log"):
        yield port


def test_the_dashboard_without_a_token_answers_only_to_this_machine(dashboard: int) -> None:
    for path in ("/", "/markets", "/static/spotopt.css"):
        _check(dashboard, path)


def test_the_dashboard_with_a_token_needs_no_host_check(filled: str, tmp_path: Path) -> None:
    """The token is the lock: a renamed page never holds it (nor its cookie)."""
    token = "t" * 16
    port = free_port()
    args = ["--db", filled, "ui", "--port", str(port)]
    with spotopt_server(
        args, f"http://127.0.0.1:{port}/", tmp_path / "ui.log", env={"SPOTOPT_UI_TOKEN": token}
    ):
        status, headers, _ = _get(port, "/", REBOUND)
        assert status == 401 and headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize("token", ["q", "fifteen-chars!!"])
def test_a_short_ui_token_is_refused_in_one_line(filled: str, token: str) -> None:
    """The installed script exits at once (a timeout, not a hang, where a server would start)."""
    script = Path(sys.executable).with_name("spotopt")
    done = subprocess.run(
        [str(script), "--db", filled, "ui", "--port", str(free_port())],
        capture_output=True,
        text=True,
        env={**os.environ, "SPOTOPT_UI_TOKEN": token},
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        done.stderr.count("\n") == 1
        and "SPOTOPT_UI_TOKEN" in done.stderr
        and "at least 16 characters" in done.stderr
    )
    assert token not in done.stderr  # the secret is not echoed


def test_metrics_on_loopback_answer_only_to_this_machine(sqlite_db: Database) -> None:
    port = free_port()
    server = serve(sqlite_db, port)
    try:
        _check(port, "/metrics")
    finally:
        server.shutdown()
        server.server_close()


def test_metrics_beyond_loopback_answer_any_host(sqlite_db: Database) -> None:
    """Bound to every address (for a Prometheus elsewhere), the endpoint is reached under names
    this machine cannot know: no Host check, the headers still sent."""
    port = free_port()
    server = serve(sqlite_db, port, host="0.0.0.0")
    try:
        status, headers, _ = _get(port, "/metrics", f"prometheus-target.example:{port}")
        assert status == 200 and headers["x-frame-options"] == "DENY"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def browse(filled: str, tmp_path: Path) -> Iterator[tuple[int, str, int]]:
    path = sqlite_path(filled)
    assert path is not None
    port = free_port()
    args = ["--db", filled, "report", "browse", "--port", str(port)]
    with spotopt_server(args, f"http://127.0.0.1:{port}/{path.stem}.json", tmp_path / "browse.log") as proc:
        yield port, path.stem, proc.pid


def _sql(port: int, database: str, sql: str) -> tuple[int, dict[str, object]]:
    status, _, body = _get(port, f"/{database}.json?sql={quote(sql)}", f"127.0.0.1:{port}")
    return status, json.loads(body)


def test_browse_answers_only_to_this_machine_and_bounds_a_query(browse: tuple[int, str, int]) -> None:
    port, database, pid = browse
    _check(port, f"/{database}.json")
    status, found = _sql(port, database, "select count(*) as n from price_points")
    assert status == 200 and found["ok"] is True
    # SQLite's default allows a gigabyte in one value; here it is refused before it is made.
    status, found = _sql(port, database, "select length(zeroblob(1000000000)) as n")
    assert status == 400 and found["ok"] is False and "too big" in str(found["error"])
    status, found = _sql(port, database, "select length(printf('%.*c', 900000000, 'x')) as n")
    assert status == 200 and found["rows"] == [[None]]  # printf gives up: NULL, nothing allocated
    # Many rows of large values end at the process's data limit, not in the machine's memory.
    limits = Path(f"/proc/{pid}/limits")
    if limits.exists():
        data = next(line for line in limits.read_text().splitlines() if line.startswith("Max data size"))
        assert data.split()[3] == str(1 << 30), data
    status, found = _sql(port, database, "select count(*) as n from price_points")
    assert status == 200 and found["ok"] is True  # still serving
