"""The import guide's commands run as written, from the repository's root, on the example files
that ship in ``data/examples/`` (docs/guides/import.md): the installed ``spotopt`` in a
subprocess, one fresh database for the whole page, in the page's order."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "import.md"
SPOTOPT = Path(sys.executable).parent / "spotopt"


def guide_commands(markdown: str) -> list[str]:
    """The commands of the page's ``bash`` blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"^```bash\n(.*?)^```", markdown, re.MULTILINE | re.DOTALL):
        for command in block.replace("\\\n", " ").splitlines():
            command = command.split(" #", 1)[0].strip()
            if command and not command.startswith("#"):
                commands.append(command)
    return commands


def run(command: str, db: Path) -> subprocess.CompletedProcess[str]:
    words = shlex.split(command)
    assert words[0] == "spotopt", f"the guide runs only spotopt: {command}"
    env = {**os.environ, "SPOTOPT_DB_URL": f"sqlite:///{db}"}
    return subprocess.run([str(SPOTOPT), *words[1:]], cwd=ROOT, env=env, capture_output=True, text=True)


def test_every_command_of_the_import_guide_runs_as_written(tmp_path: Path) -> None:
    commands = guide_commands(GUIDE.read_text(encoding="utf-8"))
    kinds = {shlex.split(c)[2] for c in commands if c.startswith("spotopt import ")}
    assert kinds == {"aws-spot-history", "azure-retail", "csv", "availability", "lifetimes"}
    db = tmp_path / "history.sqlite"
    for command in commands:
        done = run(command, db)
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, f"{command}\n{done.stderr}"
        if "--format json" in command:
            summary = json.loads(done.stdout)
            if command.startswith("spotopt import "):
                assert summary["inserted"] > 0 and summary["rejected"] == 0, summary

    # What the page says of the trace: importing it again inserts 0 (24 duplicates).
    trace = next(c for c in commands if "availability-trace.json" in c)
    again = run(f"{trace} --format json", db)
    assert again.returncode == 0, again.stderr
    assert (json.loads(again.stdout)["inserted"], json.loads(again.stdout)["duplicate"]) == (0, 24)


def test_the_capacity_and_lifetime_examples_are_labelled_synthetic() -> None:
    for name in ("availability.csv", "availability-trace.json", "lifetimes.csv", "preemption-trace.json"):
        text = (ROOT / "data" / "examples" / name).read_text(encoding="utf-8")
        if name.endswith(".json"):
            assert json.loads(text)["metadata"]["note"].startswith("SYNTHETIC"), name
        else:
            header, *rows = text.splitlines()
            assert header.endswith(",note") and rows, name
            assert all(row.endswith(",SYNTHETIC example") for row in rows), name


def test_the_commands_are_read_as_a_shell_reads_them() -> None:
    text = "```bash\n# a comment\nspotopt a x \\\n  --y 1   # why\n\nspotopt b\n```\n```csv\nspotopt c\n```\n"
    assert guide_commands(text) == ["spotopt a x    --y 1", "spotopt b"]
