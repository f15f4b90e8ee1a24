"""Every relative link and heading anchor in README.md and docs/ resolves in plain Markdown.

The README says every page also reads as plain Markdown (on GitHub, in an editor), not only in
the site ``mkdocs build --strict`` checks: a link must name a file that exists, relative to the
page, and an anchor a heading of that file as GitHub slugs it (lower case, punctuation dropped,
spaces to hyphens, ``-1``, ``-2`` for repeats).
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


def prose(markdown: str) -> str:
    """``markdown`` without what is not rendered as links: fenced blocks, code spans, comments."""
    return _CODE_SPAN.sub("", _COMMENT.sub("", _FENCE.sub("", markdown)))


def links(markdown: str) -> list[str]:
    """The targets of the inline links and images of ``markdown``."""
    return _LINK.findall(prose(markdown))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's Markdown: the rendered text (code, emphasis and link
    markup dropped), lower case, characters other than letters, digits, ``_``, ``-`` and spaces
    dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]|<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """The heading anchors of ``markdown``: a repeated slug gets ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", markdown)):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken(page: Path) -> list[str]:
    """The links of ``page`` that name a missing file or a heading its file lacks."""
    text = page.read_text(encoding="utf-8")
    out = []
    for target in links(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # https:, mailto:: not a file of the repository
        path, _, anchor = unquote(target).partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            out.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
            out.append(f"{target}: {file.name} has no heading with the anchor #{anchor}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    assert broken(page) == []


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("The mover on one machine", "the-mover-on-one-machine"),
        (
            "Fidelity: the daemon replaying a recorded market",
            "fidelity-the-daemon-replaying-a-recorded-market",
        ),
        ("`spotopt daemon run`", "spotopt-daemon-run"),
        ("Quick start (fresh machine, Python 3.11)", "quick-start-fresh-machine-python-311"),
        ("What-if *analysis*", "what-if-analysis"),
        ("`usd_per_hour` and [links](x.md)", "usd_per_hour-and-links"),
        ("A — B", "a--b"),
    ],
)
def test_slugs_are_githubs(heading: str, expected: str) -> None:
    assert slug(heading) == expected


def test_the_check_finds_a_missing_file_a_missing_anchor_and_ignores_code(tmp_path: Path) -> None:
    (tmp_path / "b.md").write_text("# Title\n\n## Part two\n\n## Part two\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](b.md#part-two-1) [self](#here) [gone](c.md) [bad](b.md#part-three)\n"
        "`[code](nowhere.md)` <!-- [comment](nowhere.md) -->\n"
        "```\n[fenced](nowhere.md)\n```\n## Here\n[web](https://example.com/x.md#y)\n",
        encoding="utf-8",
    )
    assert [entry.split(":")[0] for entry in broken(page)] == ["c.md", "b.md#part-three"]
