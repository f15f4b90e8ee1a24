"""Every command with ``--format json|csv``, run as the installed ``spotopt`` console script in a
subprocess: its stdout must parse in full.

``CliRunner`` captures Python's ``sys.stdout`` only, so it cannot see a native library writing to
file descriptor 1 (highspy's ``Running HiGHS … Copyright`` banner did, before every solve). Here
the real executable writes to a real pipe. The list of commands is checked against the CLI
itself, so a new command with ``--format`` fails this test until it is covered. ``.ci/run`` also
runs this file in a separate virtualenv with the newest allowed dependencies.
"""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer.main

from spotopt.cli.app import app
from tests.helpers import cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "data" / "examples"
SPOTOPT = Path(sys.executable).parent / "spotopt"
TIMEOUT_S = 300

MANAGED_JOB = """\
jobs:
  - name: resnet
    throughput: {V100: 2.4}
    work: {steps: 9850}
    run: python train.py
    checkpoint: {uri: ckpt, every: 10m}
    budget_usd: 50
"""
PROFILE_JOB = f"""\
jobs:
  - name: tiny
    run: {sys.executable} {EXAMPLES / "train_numpy.py"} --steps 1000000 --out profile-out
    checkpoint: {{uri: profile-store, every: 10m}}
    work: {{steps: 1000}}
"""
PROFILE_ARGS = ["{work}/profile.yaml", "--gpu", "V100-16GB", "--steps", "3", "--warmup-steps", "1"]
SMALL_JOBS = """\
jobs:
  - name: a3c
    throughput: {K80: 1.0, P100: 1.2, V100: 2.2}
    work: {steps: 40000}
    gpus: 1
"""

AVAILABILITY = """\
timestamp,cloud,region,zone,instance_type,available
2020-02-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,1
2020-02-01T01:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,0
"""
LIFETIMES = """\
cloud,region,zone,instance_type,instance_id,launched_at,ended_at,end_reason
aws,us-east-1,us-east-1a,p3.2xlarge,i-1,2020-02-01T00:00:00Z,2020-02-01T05:00:00Z,preempted
"""

# command → its arguments before --format ("{work}" is the test's directory). Exit 3 is allowed
# where the command reports partial failure in its output (collect without credentials).
COMMANDS: dict[str, tuple[list[str], set[int]]] = {
    "import aws-spot-history": ([str(EXAMPLES / "aws-spot-price-history.json")], {0}),
    "import azure-retail": ([str(EXAMPLES / "azure-retail-prices.json")], {0}),
    "import csv": ([str(EXAMPLES / "prices.csv")], {0}),
    "import availability": (["{work}/availability.csv"], {0}),
    "import lifetimes": (["{work}/lifetimes.csv"], {0}),
    "catalog list": ([], {0}),
    "prices show": ([], {0}),
    "prices cheapest": (["--gpu", "V100"], {0}),
    "report list": ([], {0}),
    "report run": (["cheapest"], {0}),
    "throughput list": ([], {0}),
    "throughput estimate": (["{work}/small.yaml", "--gpus", "V100,A100", "--counts", "1,8"], {0}),
    "throughput profile": ([*PROFILE_ARGS, "--state-dir", "{work}/profile-state"], {0}),
    "plan": ([str(EXAMPLES / "jobs.yaml")], {0}),
    "whatif": (["--example"], {0}),
    "jobs list": ([], {0}),
    "jobs show": (["resnet"], {0}),
    "jobs cost": (["resnet"], {0}),
    "daemon run": (["--dry-run", "--state-dir", "{work}/state"], {0}),
    "daemon status": ([], {0}),
    "daemon sweep": (["--dry-run", "--provider", "local", "--state-dir", "{work}/state"], {0}),
    "daemon replay": (["{work}/small.yaml", "--example"], {0}),
    "notify list": ([], {0}),
    "agent run-local": ([str(EXAMPLES / "train_numpy.py"), "--store", "{work}/store"], {0}),
    "collect": (["aws", "--dry-run"], {0, 3}),
}
AFTER = {"agent run-local": ["--", "--steps", "3"]}


def formatted_commands() -> set[str]:
    """Every command of the CLI that takes ``--format``."""
    found: set[str] = set()

    def walk(command: object, path: list[str]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands is not None:
            for name, sub in subcommands.items():
                walk(sub, [*path, name])
        elif any("--format" in getattr(p, "opts", ()) for p in getattr(command, "params", ())):
            found.add(" ".join(path))

    walk(typer.main.get_command(app), [])
    return found


def test_help_texts_have_no_hard_line_breaks_inside_a_paragraph() -> None:
    """Docstrings are wrapped in the source; ``--help`` must wrap them to the terminal instead."""
    broken = []

    def walk(command: object, path: list[str]) -> None:
        for paragraph in (getattr(command, "help", None) or "").split("\n\n"):
            if any(not line.lstrip().startswith(("- ", "* ")) for line in paragraph.splitlines()[1:]):
                broken.append(f"{' '.join(path)}: {paragraph[:60]!r}")
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), ["spotopt"])
    assert not broken, "\n".join(broken)


def test_every_command_with_a_format_is_covered() -> None:
    assert formatted_commands() == set(COMMANDS)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """A history with the bundled examples and throughputs imported and one managed job submitted."""
    work = tmp_path_factory.mktemp("console")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    env |= {"SPOTOPT_DB_URL": f"sqlite:///{work / 'history.sqlite'}", "COLUMNS": "120"}
    env |= {"AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull}
    env |= {"AWS_SHARED_CREDENTIALS_FILE": os.devnull}  # collect finds no credentials, quickly
    (work / "small.yaml").write_text(SMALL_JOBS)
    (work / "availability.csv").write_text(AVAILABILITY)
    (work / "lifetimes.csv").write_text(LIFETIMES)
    (work / "job.yaml").write_text(MANAGED_JOB)
    (work / "profile.yaml").write_text(PROFILE_JOB)
    # The setup runs in this process (what is tested is each command's output, below): five
    # console-script starts cost ~15 s per worker.
    db = ["--db", env["SPOTOPT_DB_URL"]]
    for name in ("import aws-spot-history", "import azure-retail", "import csv"):
        code, _, err = cli(*db, *name.split(), *COMMANDS[name][0])
        assert code == 0, err
    for setup in (
        ["jobs", "submit", str(work / "job.yaml")],
        ["throughput", "import", str(EXAMPLES / "throughputs.csv")],
    ):
        code, _, err = cli(*db, *setup)
        assert code == 0, err
    yield work, env


@pytest.mark.parametrize("fmt", ["json", "csv"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_stdout_parses_in_full(name: str, fmt: str, work: tuple[Path, dict[str, str]]) -> None:
    directory, env = work
    args, codes = COMMANDS[name]
    argv = [str(SPOTOPT), *name.split(), *(a.replace("{work}", str(directory)) for a in args)]
    argv += ["--format", fmt, *AFTER.get(name, [])]
    done = subprocess.run(argv, env=env, cwd=directory, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode in codes, done.stderr[-2000:]
    assert done.stdout.strip(), f"{name} --format {fmt} printed nothing; stderr: {done.stderr[-500:]}"
    if fmt == "json":
        json.loads(done.stdout)  # the whole of stdout: a banner before or after fails here
    else:
        rows = list(csv.reader(io.StringIO(done.stdout)))
        widths = {len(row) for row in rows if row}
        assert len(widths) == 1, f"{name}: ragged CSV (a foreign line in stdout?): {done.stdout[:300]!r}"
        assert all(row for row in rows), f"{name}: a blank line inside the CSV"
