"""The README documents every registered collector, policy, report, strategy, setting and command.

A name counts as documented only as a whole name in code style (`spot`, not the `spot` inside
`spot-discount` or `spotopt`) in the section that documents its kind, so deleting that section
fails the test even when the word still occurs elsewhere (`spotopt` is also the program).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spotopt.agent.config import ENV_VARS
from spotopt.cli.app import app
from spotopt.collectors.base import COLLECTORS
from spotopt.policies.base import policy_names
from spotopt.reports.registry import REPORTS
from spotopt.settings import Settings
from spotopt.whatif.run import STRATEGIES

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")

# The section (a ``##``/``###`` heading, up to the next heading of the same or a higher level)
# that must document each kind of registered name.
SECTIONS = {
    "collector": "Collecting from the clouds",
    "policy": "Policies and their formulation",
    "report": "Reports and SQL views",
    "strategy": "What-if analysis",
    "setting": "Configuration",
    "agent variable": "Running a training job under the agent",
}


def _registered() -> list[tuple[str, str]]:
    return [
        *(("collector", n) for n in sorted(COLLECTORS)),
        *(("policy", n) for n in policy_names()),
        *(("report", n) for n in sorted(REPORTS)),
        *(("strategy", n) for n in STRATEGIES),
        *(("setting", f"SPOTOPT_{field.upper()}") for field in Settings.model_fields),
        *(("agent variable", v) for v in ENV_VARS),
    ]


def section(readme: str, title: str) -> str:
    """The text of the section headed ``title`` ("" if there is none)."""
    match = re.search(rf"^(#{{2,}}) {re.escape(title)}\s*$", readme, re.MULTILINE)
    if match is None:
        return ""
    level = len(match.group(1))
    rest = readme[match.end() :]
    end = re.search(rf"^#{{2,{level}}} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def documented(name: str, text: str) -> bool:
    """``name`` appears as a whole name inside inline code or a fenced block of ``text``."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL))
    whole = re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)")
    return any(whole.search(code) for code in [*fenced, *inline])


def undocumented(readme: str) -> list[str]:
    """Registered names the README does not document where they belong."""
    return [
        f"{kind} {name}"
        for kind, name in _registered()
        if not documented(name, section(readme, SECTIONS[kind]))
    ]


@pytest.mark.parametrize(("kind", "name"), _registered())
def test_registered_name_is_documented_in_its_section(kind: str, name: str) -> None:
    where = SECTIONS[kind]
    assert documented(name, section(README, where)), (
        f"{kind} {name} is registered but '{where}' never shows it"
    )


def test_a_readme_without_the_what_if_section_fails() -> None:
    """The proof the check can fail: every strategy goes missing, although `spot`, `oracle` and
    `spotopt` still occur elsewhere (inside `spot-discount`, as the program's name)."""
    assert section(README, "What-if analysis")
    cut = README.replace(section(README, "What-if analysis"), "\n")
    assert sorted(undocumented(cut)) == sorted(f"strategy {s}" for s in STRATEGIES)
    assert undocumented(README) == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("`spot`", True),
        ("`--strategies spot,oracle`", True),
        ("`spot-discount`", False),
        ("`spotopt whatif`", False),
        ("`on-demand-only`", False),
        ("`data/spot.csv`", False),
        ("the spot market", False),  # prose is not code style
        ("```bash\nspotopt whatif --strategies spot\n```", True),
    ],
)
def test_only_whole_names_in_code_count(text: str, expected: bool) -> None:
    assert documented("spot", text) is expected


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
