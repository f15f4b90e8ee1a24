"""The docs document every registered collector, policy, report, strategy, setting, agent variable
and command.

The docs are README.md and the pages under docs/ (built into a site by ``mkdocs build --strict``
in CI). A name counts as documented only as a whole name in code style (`spot`, not the `spot`
inside `spot-discount` or `spotopt`) on the page that documents its kind, so deleting that page
fails the test even when the word still occurs elsewhere (`spotopt` is also the program).
Settings are documented by their docstrings in the ``Settings`` model: ``docs/generate.py``
writes the settings and command references (and the home page, from the README) into the
committed pages, and a test here fails while a committed page differs from what it writes.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic_settings import BaseSettings

from spotopt.agent.config import ENV_VARS
from spotopt.cli.app import app
from spotopt.clouds.registry import COLLECTORS
from spotopt.policies.base import policy_names
from spotopt.reports.registry import REPORTS
from spotopt.settings import Settings
from spotopt.whatif.run import STRATEGIES

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {
    "README.md": README,
    **{
        str(path.relative_to(ROOT)): path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "docs").rglob("*.md"))
    },
}


def _load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_generated", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATED = _load_generator()
SETTINGS_PAGE = "docs/reference/settings.md"

# The page that must document each kind of registered name.
PAGES = {
    "collector": "docs/guides/collect.md",
    "policy": "docs/concepts/policies.md",
    "report": "docs/guides/reports.md",
    "strategy": "docs/guides/whatif.md",
    "setting": SETTINGS_PAGE,
    "agent variable": "docs/reference/agent-environment.md",
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


def documented(name: str, text: str) -> bool:
    """``name`` appears as a whole name inside inline code or a fenced block of ``text``."""
    fenced = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL))
    whole = re.compile(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)")
    return any(whole.search(code) for code in [*fenced, *inline])


def undocumented(docs: dict[str, str]) -> list[str]:
    """Registered names the docs do not document on their kind's page."""
    return [
        f"{kind} {name}" for kind, name in _registered() if not documented(name, docs.get(PAGES[kind], ""))
    ]


@pytest.mark.parametrize(("kind", "name"), _registered())
def test_registered_name_is_documented_on_its_page(kind: str, name: str) -> None:
    where = PAGES[kind]
    assert documented(name, DOCS[where]), f"{kind} {name} is registered but {where} never shows it"


def test_docs_without_the_what_if_page_fail() -> None:
    """The proof the check can fail: every strategy goes missing, although `spot`, `oracle` and
    `spotopt` still occur on other pages (inside `spot-discount`, as the program's name)."""
    assert DOCS[PAGES["strategy"]]
    cut = {**DOCS, PAGES["strategy"]: ""}
    assert sorted(undocumented(cut)) == sorted(f"strategy {s}" for s in STRATEGIES)
    assert undocumented(DOCS) == []


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
def test_every_command_is_in_the_written_docs(command: str) -> None:
    """Beyond the generated reference: some page written by hand says what the command is for."""
    assert any(command in text for text in DOCS.values()), f"`{command}` is missing from the docs"


def test_the_command_reference_is_generated_for_every_command_and_option() -> None:
    reference = GENERATED.cli_reference()
    headings = set(re.findall(r"^#+ `(spotopt[^`]*)`$", reference, re.MULTILINE))
    assert headings == {"spotopt", *_commands(), *{" ".join(c.split()[:2]) for c in _commands()}}
    plan = reference.split("`spotopt plan`", 1)[1].split("\n#", 1)[0]
    assert "spotopt plan [OPTIONS] {JOBS.yaml}" in plan  # as `spotopt plan --help` prints it
    assert "| `JOBS.yaml <path>` | Job spec" in plan
    assert "| `--policy <str>` | min-cost, min-cost-slo," in plan
    assert "--help" not in reference  # typer's own options are the shell's business
    assert reference in DOCS["docs/reference/cli.md"]


def test_the_settings_reference_carries_every_field_docstring() -> None:
    table = GENERATED.settings_reference()
    docstrings = GENERATED.field_docstrings(Settings)
    for name, field in Settings.model_fields.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"`SPOTOPT_{name.upper()}`" in row
        assert " ".join(docstrings[name].split()).split(";")[0] in row
        assert ("unset" in row) is (field.default is None)
    assert table in DOCS[SETTINGS_PAGE]


class _Undocumented(BaseSettings):
    documented: int = 1
    """A setting with its docstring."""

    forgotten: int = 2


def test_a_setting_without_a_docstring_fails_the_reference() -> None:
    assert GENERATED.field_docstrings(_Undocumented) == {"documented": "A setting with its docstring."}
    with pytest.raises(ValueError, match=r"_Undocumented\.forgotten has no docstring"):
        GENERATED.settings_reference(_Undocumented)


def test_the_site_home_is_the_readme_with_links_into_the_site() -> None:
    home = DOCS["docs/index.md"]
    assert home == f"{GENERATED.INDEX_HEADER}\n\n{GENERATED.readme_for_site(README)}"
    links = re.findall(r"\]\(([^)#]+\.md)", home)
    assert links and "docs/" not in " ".join(links)
    assert all((ROOT / "docs" / link).is_file() for link in links), links


def test_the_committed_generated_pages_are_what_the_code_generates() -> None:
    """The references, the imports drawing and the home page read as plain Markdown: they are
    committed, so they must never lag the code (or the README) they are generated from."""
    check = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True, text=True
    )
    assert check.returncode == 0, f"run `python docs/generate.py` and commit what it writes:\n{check.stdout}"
    regions = {
        name: text
        for text in DOCS.values()
        for name in re.findall(r"^<!-- generated: (\w+) -->$", text, re.M)
    }
    assert sorted(regions) == ["cli", "imports", "settings"]


def test_a_region_is_refilled_and_a_broken_one_refused() -> None:
    old = "intro\n<!-- generated: settings -->\nan old table\n<!-- end generated: settings -->\noutro\n"
    filled = GENERATED.fill(old)
    assert "an old table" not in filled and GENERATED.settings_reference() in filled
    assert filled.startswith("intro\n") and filled.endswith("<!-- end generated: settings -->\noutro\n")
    assert GENERATED.fill(filled) == filled
    with pytest.raises(ValueError, match="without its"):
        GENERATED.fill("<!-- generated: settings -->\nno end\n")
    with pytest.raises(ValueError, match="unknown generated region 'cl'"):
        GENERATED.fill("<!-- generated: cl -->\n<!-- end generated: cl -->")


def test_quick_start_is_two_commands() -> None:
    block = README.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [line for line in block.strip().splitlines() if line.strip()]
    assert len(lines) == 2
    assert lines[0].startswith("pip install . && spotopt ")
    assert lines[1].startswith(".ci/run")


def test_the_site_needs_nothing_beyond_the_docs_extra() -> None:
    """`pip install ".[docs]" && mkdocs serve` is all the README asks, so no MkDocs hook may import
    the project or a package outside the docs extra (the generating hook once needed grimp);
    CI builds the site from a fresh venv of exactly that line (.ci/readme-installs)."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert not re.search(r"^hooks:", config, re.MULTILINE)
    assert 'pip install ".[docs]" && mkdocs serve' in README
