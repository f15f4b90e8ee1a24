"""``spotopt whatif`` through the installed console script: every format says the example
market is synthetic (issue 36 item 9: the CSV did not), and long work is bounded and shows its
progress with the time left (item 23: ``--starts 1000000 --every 1s`` ran for years, silently)."""

from __future__ import annotations

import csv
import io
import os
import pty
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("spotopt")
QUICK = ("--example", "--strategies", "spot", "--preemptions", "none")


def _whatif(*args: str, db: Path) -> subprocess.CompletedProcess[str]:
    assert SCRIPT.exists(), f"{SCRIPT}: install the package (pip install -e .) into this interpreter's env"
    command = [str(SCRIPT), "--db", f"sqlite:///{db}", "whatif", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_the_csv_says_on_every_row_that_the_example_market_is_synthetic(tmp_path: Path) -> None:
    done = _whatif(*QUICK, "-f", "csv", db=tmp_path / "h.sqlite")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert rows and all(row["synthetic"] == "True" for row in rows)
    assert "SYNTHETIC" in done.stderr  # and the reader is told, beside the data


def test_a_million_starts_and_starts_closer_than_a_tick_are_refused_at_once(tmp_path: Path) -> None:
    db = tmp_path / "h.sqlite"
    many = _whatif("--example", "--starts", "1000000", "--every", "1s", db=db)
    assert many.returncode == 2
    assert (
        many.stderr.count("\n") == 1 and "--starts 1000000" in many.stderr and "at most 1,000" in many.stderr
    )
    close = _whatif("--example", "--starts", "3", "--every", "30m", db=db)
    assert close.returncode == 2
    assert close.stderr.count("\n") == 1 and "--every 1800 s is shorter than --tick 3600 s" in close.stderr
    assert not db.exists()  # refused before any database was opened


def test_a_replay_in_a_terminal_shows_its_progress_and_the_time_left(tmp_path: Path) -> None:
    """In a terminal (a pseudo-terminal here) the progress line counts the runs and says how
    long is left; it is erased when the replay ends."""
    leader, follower = pty.openpty()
    command = [str(SCRIPT), "--db", f"sqlite:///{tmp_path / 'h.sqlite'}", "whatif", *QUICK, "--starts", "2"]
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    proc = subprocess.Popen(command, stdin=follower, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert proc.wait(timeout=300) == 0, seen.decode(errors="replace")
    text = seen.decode(errors="replace")
    assert "what-if" in text and "/2" in text and "left" in text
