"""No user-facing text tells anyone to install a name that resolves to another project.

``spotopt`` on PyPI is someone else's package, so every ``pip install`` in the README, the docs
and the string literals of ``spotopt/``, ``collectors/`` and ``policies/`` must name this
project's distribution (``spotopt-gpu``, with extras), a local path (``.``, ``-e .``), a
requirements file (``-r``), or a third-party package pinned with ``==``.
"""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import spotopt
from spotopt import DISTRIBUTION, pip_install_hint

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
_PIP_INSTALL = re.compile(r"pip install\s+([^`\n)]*)")
_OPTIONS_WITH_VALUE = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url"}
_OPTIONS_WITH_VALUE |= {"-f", "--find-links", "-d", "-w", "--only-binary", "--no-binary"}


def _texts() -> Iterator[tuple[str, str]]:
    """(where, text) for the README, the docs, and every string literal of the shipped code."""
    yield "README.md", (ROOT / "README.md").read_text()
    for doc in sorted((ROOT / "docs").rglob("*.md")) if (ROOT / "docs").is_dir() else []:
        yield str(doc.relative_to(ROOT)), doc.read_text()
    for package in ("spotopt", "collectors", "policies"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text())
            in_fstrings = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
            for node in ast.walk(tree):
                where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
                if isinstance(node, ast.JoinedStr):  # {DISTRIBUTION} is known, any other {…} is EXPR
                    yield where, "".join(_piece(v) for v in node.values)
                elif (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in in_fstrings
                ):
                    yield where, node.value


def _piece(value: ast.expr) -> str:
    if isinstance(value, ast.Constant):
        return str(value.value)
    inner = value.value if isinstance(value, ast.FormattedValue) else value
    return DISTRIBUTION if isinstance(inner, ast.Name) and inner.id == "DISTRIBUTION" else "EXPR"


def refused(target: str) -> list[str]:
    """The requirements in ``pip install TARGET`` that could install another project."""
    try:
        words = shlex.split(target)
    except ValueError:
        words = target.split()
    bad, skip = [], False
    for word in words:
        if word in ("&&", "||", ";", "|", "#"):
            break
        if skip or word.startswith("-"):
            skip = word in _OPTIONS_WITH_VALUE
            continue
        if word.startswith((".", "/", '".', "'.")) or "EXPR" in word:
            continue  # a local path (the checkout) or an f-string's expression (not a name)
        name = re.split(r"[\[=<>!~;@ ]", word, maxsplit=1)[0]
        if name == DISTRIBUTION or re.fullmatch(r"[A-Za-z0-9._-]+==[^,]+", word):
            continue
        bad.append(word)
    return bad


def test_no_text_says_to_install_another_project() -> None:
    found = [
        f"{where}: pip install {match.group(1).strip()}"
        for where, text in _texts()
        for match in _PIP_INSTALL.finditer(text)
        if refused(match.group(1))
    ]
    assert not found, "install hints that could install another project:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("target", "bad"),
    [
        ('"spotopt[aws]"', ["spotopt[aws]"]),
        ("-U spotopt", ["spotopt"]),
        ("s3fs", ["s3fs"]),
        ('"spotopt-gpu[aws]"', []),
        ('-e ".[test]"', []),
        (".", []),
        ("--require-hashes -r .ci/requirements.txt", []),
        ("uv==0.13.9", []),
        ("--only-binary :all: -r x.txt", []),
        (". && spotopt whatif --example", []),
        ("EXPR -r x.txt", []),
    ],
)
def test_the_check_itself(target: str, bad: list[str]) -> None:
    assert refused(target) == bad


def test_the_distribution_name_and_version_are_the_projects() -> None:
    project = PYPROJECT["project"]
    assert project["name"] == DISTRIBUTION and project["version"] == spotopt.__version__
    assert project["scripts"] == {"spotopt": "spotopt.cli.app:main"}
    for extra, requirements in project["optional-dependencies"].items():
        for requirement in requirements:
            assert not requirement.startswith("spotopt["), (
                f"extra {extra}: {requirement} names another project"
            )
    assert pip_install_hint("aws") == 'pip install "spotopt-gpu[aws]"'
