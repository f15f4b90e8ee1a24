"""The README documents every registered collector, policy, report, strategy, setting and command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spotopt.agent.config import ENV_VARS
from spotopt.cli.app import app
from spotopt.collectors.base import load_all
from spotopt.policies.base import policy_names
from spotopt.reports.registry import REPORTS
from spotopt.settings import Settings
from spotopt.whatif.strategies import STRATEGIES

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def _documented(name: str) -> bool:
    return re.search(rf"`[^`]*\b{re.escape(name)}\b[^`]*`", README) is not None


@pytest.mark.parametrize(
    "name",
    [
        *sorted(load_all()),
        *policy_names(),
        *sorted(REPORTS),
        *STRATEGIES,
        *(f"SPOTOPT_{field.upper()}" for field in Settings.model_fields),
        *ENV_VARS,
    ],
)
def test_registered_name_is_in_the_readme(name: str) -> None:
    assert _documented(name), f"{name} is registered but the README never mentions it in code style"


def _commands() -> list[str]:
    import typer.main

    group = typer.main.get_command(app)
    found = []
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        subs = getattr(command, "commands", None)
        found += [f"spotopt {name} {sub}" for sub in subs] if subs else [f"spotopt {name}"]
    return found


@pytest.mark.parametrize("command", _commands())
def test_every_command_is_in_the_readme(command: str) -> None:
    assert command in README, f"`{command}` is missing from the README"


def test_quick_start_is_two_commands() -> None:
    block = README.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line for line in block.strip().splitlines() if line.strip()]
    assert len(lines) == 2
    assert lines[0].startswith("pip install . && spotopt ")
    assert lines[1].startswith(".ci/run")
