"""Issue 36: what ``spotopt jobs`` and the CLI's errors print, run as users run them: the installed
console script in a subprocess, on a terminal (a pseudo-terminal of 80 or 120 columns) where
the table's layout is what is tested.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import ManagedJob
from spotopt.mover import jobs as jobstore
from tests.mover_world import World, a_day_ago, job_yaml, make_world, on_demand, spot

SPOTOPT = Path(sys.executable).parent / "spotopt"
TIMEOUT_S = 300
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _env(db_url: str | None = None, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_") and k != "COLUMNS"}
    if db_url is not None:
        env["SPOTOPT_DB_URL"] = db_url
    return env | more


def spotopt(db_url: str | None, *args: str | Path, cwd: Path | None = None) -> tuple[int, str, str]:
    """``spotopt ARGS`` in a subprocess, output to pipes: (exit code, stdout, stderr)."""
    done = subprocess.run(
        [str(SPOTOPT), *map(str, args)],
        env=_env(db_url),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    return done.returncode, done.stdout, done.stderr


def on_terminal(db_url: str, columns: int, *args: str) -> str:
    """What ``spotopt ARGS`` shows on a terminal ``columns`` wide (escape codes removed)."""
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = _env(db_url, COLUMNS=str(columns), NO_COLOR="1", TERM="xterm")
    with subprocess.Popen([str(SPOTOPT), *args], stdout=sub, stderr=subprocess.PIPE, env=env) as proc:
        os.close(sub)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the other end closed: Linux says EIO
                break
            if not chunk:
                break
            chunks.append(chunk)
        err = proc.stderr.read() if proc.stderr else b""
        assert proc.wait(TIMEOUT_S) == 0, err.decode()
    os.close(main)
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


def _url(db: Database) -> str:
    return db.engine.url.render_as_string(hide_password=False)


@pytest.fixture
def world(db: Database, tmp_path: Path) -> Iterator[World]:
    w = make_world(db, tmp_path)
    yield w
    w.stop_all()


def _money(cell: str) -> float:
    return float(cell.strip().lstrip("$").replace(",", ""))


def test_retry_show_and_cost_after_a_cancel(world: World, tmp_path: Path) -> None:
    """Item 5: ``jobs retry`` after a cancel names the checkpoint the stop wrote (the agent
    resumes from it; the CLI said "the start"). Item 10: ``jobs show`` of the finished job
    measures its steps/s over its run (its last heartbeat, after the last step, says 0), says
    what ``jobs cost`` bills in one money format, and the ledger's rows add up to its total."""
    # $0.20/h: AWS's 60 s minimum bills $0.00333, which cents showed as $0.00.
    world.prices(spot("us-east-1a", 0.2, a_day_ago()), on_demand(3.06, a_day_ago()))
    jobstore.submit(world.db, job_yaml(tmp_path))
    world.hold("mlp", 40)
    world.daemon.tick()
    world.until("the job to run", lambda: world.job().state == "running")
    world.until("step 40", lambda: world.job().steps >= 40)
    jobstore.cancel(world.db, "mlp", "not needed")
    world.daemon.tick()
    world.until("the stop", lambda: world.moves()[-1].outcome is not None)
    assert world.moves()[-1].checkpoint_step == 40
    db_url = _url(world.db)

    code, out, err = spotopt(db_url, "jobs", "retry", "mlp")
    assert code == 0, err
    assert re.fullmatch(r"mlp: pending \(resumes from checkpoint 000000000040-e1-\w+, step 40\)\n", out)
    code, out, err = spotopt(db_url, "jobs", "show", "mlp", "--format", "json")
    assert code == 0, err
    assert json.loads(out)["checkpoint_verified"]["step"] == 40

    world.release("mlp")
    world.daemon.tick()
    world.until("the job to finish", lambda: world.job().state == "done")
    with world.db.session() as session:  # as a finished agent's last heartbeat leaves it
        session.scalars(select(ManagedJob)).one().steps_per_s = 0.0
    code, out, err = spotopt(db_url, "jobs", "show", "mlp", "--format", "json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["progress"]["steps_per_s_measured"] > 0
    code, cost_json, err = spotopt(db_url, "jobs", "cost", "mlp", "--format", "json")
    assert code == 0, err
    total = json.loads(cost_json)["total_usd"]
    assert 0 < total < 0.01  # two intervals of AWS's 60 s minimum at $0.20/h

    code, table, err = spotopt(db_url, "jobs", "show", "mlp")
    assert code == 0, err
    assert "│ steps/s " in table and "│ steps/s                  │ 0 measured" not in table
    spent = re.search(r"│ spent\s+│ (\$[\d.,]+) of \$100.00 budget", table)
    assert spent is not None and spent.group(1) != "$0.00"
    assert abs(_money(spent.group(1)) - total) <= 0.005 * total  # three significant digits
    code, table, err = spotopt(db_url, "jobs", "cost", "mlp")
    assert code == 0, err
    title = re.search(r"Job mlp: (\$[\d.,]+) over 2 instance interval", table)
    assert title is not None and abs(_money(title.group(1)) - total) <= 0.005 * total
    rows = [line.split("│") for line in table.splitlines() if re.match(r"│ \d+ ", line)]
    cells = [_money(row[-3]) + _money(row[-2]) for row in rows]  # $ and egress $
    assert len(cells) == 2 and all(cell > 0 for cell in cells)
    assert round(sum(cells), 9) == _money(title.group(1))  # the rows shown add up to the total shown


def test_logs_says_a_log_is_empty(world: World, tmp_path: Path) -> None:
    """Item 13: an empty log was an empty screen; now a note on stderr, exit 0, stdout empty."""
    world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    jobstore.submit(world.db, job_yaml(tmp_path))
    world.hold("mlp", 10)
    world.daemon.tick()
    world.until("the job to run", lambda: world.job().state == "running")
    (placement,) = world.placements()
    assert isinstance(world.provider, LocalProvider) and placement.instance_id is not None
    world.stop_all()
    world.provider.log_path(placement.instance_id).write_bytes(b"")
    state_dir = world.provider.log_path(placement.instance_id).parents[2]
    code, out, err = spotopt(_url(world.db), "jobs", "logs", "mlp", "--state-dir", state_dir)
    assert code == 0 and out == "", err
    assert f"note: mlp: the log of {placement.instance_id} is empty so far" in err


def long_run(name: str) -> str:
    return f"python train.py --name {name} " + " ".join(f"--option-{i} value-{i}" for i in range(12))


@pytest.mark.parametrize("columns", [80, 120])
def test_jobs_list_fits_the_terminal(db_url: str, tmp_path: Path, columns: int) -> None:
    """Item 12: at 80 columns the run command wrapped over 10+ lines and split the dates."""
    code, _, err = spotopt(db_url, "import", "csv", Path(__file__).parents[1] / "data/examples/prices.csv")
    assert code == 0, err
    names = ["resnet50-baseline", "a3c"]
    for name in names:
        spec = tmp_path / f"{name}.yaml"
        spec.write_text(
            "jobs:\n"
            f"  - name: {name}\n"
            "    throughput: {L4: 40}\n"
            "    work: {steps: 2000}\n"
            f"    run: {long_run(name)}\n"
            "    checkpoint: {uri: ckpt}\n"
            "    budget_usd: 5\n"
        )
        code, _, err = spotopt(db_url, "jobs", "submit", spec)
        assert code == 0, err
    text = on_terminal(db_url, columns, "jobs", "list")
    lines = text.splitlines()
    assert max(map(len, lines)) <= columns
    body = [line for line in lines if line.startswith("│")]
    assert len(body) == len(names)  # one line per job
    for line, name in zip(body, names, strict=True):
        assert f"│ {name} " in line and "…" in line and "$5.00" in line
        assert re.search(r"│ \d{4}-\d\d-\d\d \d\d:\d\d\s+│$", line)  # the date whole, to the minute
    code, out, err = spotopt(db_url, "jobs", "list", "--format", "json")
    assert code == 0 and [job["run_command"] for job in json.loads(out)] == list(map(long_run, names))


def test_submit_of_a_missing_file_makes_no_database(tmp_path: Path) -> None:
    """Item 15: the database was created, then the file found missing."""
    database = tmp_path / "new" / "history.sqlite"
    database.parent.mkdir()
    code, out, err = spotopt(f"sqlite:///{database}", "jobs", "submit", "missing.yaml", cwd=tmp_path)
    assert (code, out) == (2, "") and "missing.yaml" in err and "created a new" not in err
    assert list(database.parent.iterdir()) == []


def test_a_job_name_cannot_forge_or_reverse_an_error_line(tmp_path: Path) -> None:
    """Item 23: a job name with a line break or U+202E went to the terminal as is."""
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "jobs:\n"
        '  - name: "evil\\nerror: forged \\u202eline"\n'
        "    throughput: {V100: 1}\n"
        "    work: {steps: 10}\n"
        "    run: python x.py\n"
        "    checkpoint: {uri: ckpt}\n"
        "    budget_usd: -5\n"
    )
    code, _, err = spotopt(f"sqlite:///{tmp_path / 'h.sqlite'}", "jobs", "submit", spec)
    assert code == 2
    assert "\u202e" not in err and "\\u202e" in err
    assert [line for line in err.splitlines() if line.startswith("error:")] == [
        f"error: {spec}: invalid job spec:"
    ]
    assert "(evil\\nerror: forged \\u202eline).budget_usd" in err


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["daemon", "run", "--move-margin", "nan"],
            "error: --move-margin: 'nan' is not a number; give a number; see `spotopt daemon run --help`",
        ),
        (
            ["daemon", "run", "--move-margin", "200"],
            "error: --move-margin: Input should be less than or equal to 100; "
            "see `spotopt daemon run --help`",
        ),
        (
            ["whatif", "--starts", "many"],
            "error: --starts: Input should be a valid integer, unable to parse string as an integer; "
            "see `spotopt whatif --help`",
        ),
        (["jobs", "show"], "error: NAME: missing; see `spotopt jobs show --help`"),
        (["--bogus"], "error: No such option: --bogus; see `spotopt --help`"),
    ],
)
def test_usage_errors_are_one_line(tmp_path: Path, args: list[str], line: str) -> None:
    """Item 23: typer drew a five-line box; for ``nan`` it named the upper bound."""
    code, out, err = spotopt(f"sqlite:///{tmp_path / 'h.sqlite'}", *args)
    assert (code, out, err) == (2, "", line + "\n")
