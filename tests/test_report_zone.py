"""``report run availability -p zone=...`` (issue 36 item 15): spot capacity is observed per
zone, and the report was refused a zone (only a region); through the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from spotopt.db.engine import Database
from tests.ui_fleet import fill

WINDOW = ("-p", "since=2000-01-01", "-p", "until=2100-01-01")


def _report(url: str, *params: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("spotopt")
    command = [str(script), "--db", url, "report", "run", "availability", *WINDOW, *params, "-f", "json"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_availability_report_takes_a_zone(sqlite_db: Database, tmp_path: Path) -> None:
    fill(sqlite_db, tmp_path)
    url = str(sqlite_db.engine.url)
    every = _report(url)
    assert every.returncode == 0, every.stderr
    zones = {m["zone"] for m in json.loads(every.stdout)["markets"]}
    assert "us-east-1a" in zones and len(zones) > 1
    one = _report(url, "-p", "zone=us-east-1a")
    assert one.returncode == 0, one.stderr
    found = json.loads(one.stdout)
    assert {m["zone"] for m in found["markets"]} == {"us-east-1a"}
    assert found["outages"] and {o["zone"] for o in found["outages"]} == {"us-east-1a"}
    none = _report(url, "-p", "zone=nowhere-1z")
    assert none.returncode == 0 and json.loads(none.stdout)["markets"] == []
