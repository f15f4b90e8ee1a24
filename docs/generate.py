#!/usr/bin/env python3
"""The parts of the docs that are generated from the code, written into the committed Markdown.

Every page then reads the same as plain Markdown (on GitHub, in an editor) as in the site, and
building the site needs nothing but MkDocs (``pip install ".[docs]"``). Run
``python docs/generate.py`` after changing a command, an option, a setting, an import between
layers or the README, and commit what it rewrites; ``tests/test_docs.py`` fails while a
committed page differs from what this writes (``--check`` says which, without writing).

- ``docs/index.md`` (the site's home page) is the README, its links into ``docs/`` made relative
  to ``docs/``: one text for GitHub, PyPI and the site.
- Between ``<!-- generated: NAME -->`` and ``<!-- end generated: NAME -->`` on any page:
  - ``cli``: every command of the typer app, read from the click command tree typer builds
    (``typer.main.get_command``): usage, help and every option, as ``spotopt COMMAND --help``
    prints them.
  - ``settings``: every field of ``spotopt.settings.Settings``, a table per section (its own
    fields, then each cloud's, ``spotopt/clouds/<cloud>/settings.py``): its environment variable,
    default and docstring (a field without a docstring is an error).
  - ``imports``: a drawing (Mermaid) of the imports between the layers of ``.importlinter``'s
    first contract, read from the code by grimp (import-linter's engine, a test dependency):
    every arrow points down a layer, which ``tests/test_import_layers.py`` checks.

Nothing here imports MkDocs: the tests load this file by path.
"""

from __future__ import annotations

import ast
import configparser
import inspect
import itertools
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
import typer.main
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
INDEX = DOCS / "index.md"
INDEX_HEADER = (
    "<!-- README.md, its links made relative to docs/: edit README.md, then run python docs/generate.py -->"
)
REGION = re.compile(
    r"^<!-- generated: (?P<name>[a-z]+) -->\n.*?^<!-- end generated: (?P=name) -->$", re.MULTILINE | re.DOTALL
)


def generators() -> dict[str, Callable[[], str]]:
    """What each region name is filled with."""
    return {"cli": cli_reference, "settings": settings_reference, "imports": imports_drawing}


def fill(markdown: str) -> str:
    """``markdown`` with every generated region's body replaced by what the code generates now."""
    known = generators()

    def body(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in known:
            raise ValueError(f"unknown generated region {name!r}: one of {', '.join(known)}")
        return f"<!-- generated: {name} -->\n\n{known[name]()}\n\n<!-- end generated: {name} -->"

    filled = REGION.sub(body, markdown)
    if filled.count("<!-- generated: ") != filled.count("<!-- end generated: "):
        raise ValueError("a '<!-- generated: NAME -->' line without its '<!-- end generated: NAME -->'")
    return filled


def pages() -> dict[Path, str]:
    """Every page that holds generated text, as this writes it: the home page and each page of
    ``docs/`` with a generated region."""
    wanted = {INDEX: f"{INDEX_HEADER}\n\n{readme_for_site((ROOT / 'README.md').read_text(encoding='utf-8'))}"}
    for path in sorted(DOCS.rglob("*.md")):
        text = path.read_text(encoding="utf-8")
        if path != INDEX and "<!-- generated: " in text:
            wanted[path] = fill(text)
    return wanted


def stale(wanted: dict[Path, str]) -> list[Path]:
    """The pages of ``wanted`` (``pages()``) whose committed text differs."""
    return [
        path
        for path, text in wanted.items()
        if not path.is_file() or path.read_text(encoding="utf-8") != text
    ]


def readme_for_site(readme: str) -> str:
    """The README with its links into ``docs/`` relative to ``docs/`` (the site's root page)."""
    return readme.replace("](docs/", "](")


def main(argv: list[str]) -> int:
    """Write the generated pages (``--check``: list the stale ones and exit 1, writing nothing)."""
    check = argv == ["--check"]
    if argv and not check:
        print("usage: python docs/generate.py [--check]", file=sys.stderr)
        return 2
    wanted = pages()
    changed = stale(wanted)
    for path in changed:
        print(f"{'stale' if check else 'wrote'}: {path.relative_to(ROOT)}")
        if not check:
            path.write_text(wanted[path], encoding="utf-8")
    return 1 if check and changed else 0


# -- the command line ------------------------------------------------------------------------------


def cli_reference() -> str:
    """Markdown for ``spotopt`` and every sub-command, in the order the app registers them."""
    from spotopt.cli.app import app

    root = typer.main.get_command(app)
    return "\n".join(_command(root, typer.Context(root, info_name="spotopt"), level=2))


def _command(command: Any, ctx: typer.Context, level: int) -> list[str]:
    """One command's section (typer's own click objects: duck-typed, as typer vendors click)."""
    path = ctx.command_path
    out = [f"{'#' * level} `{path}`", "", _help(command.help or command.short_help or ""), ""]
    usage = " ".join(command.collect_usage_pieces(ctx))
    out += ["```text", f"{path} {usage}".rstrip(), "```", ""]
    rows = [_param_row(param, ctx) for param in command.get_params(ctx) if not param.hidden]
    rows = [row for row in rows if row is not None]
    if rows:
        out += ["| argument / option | meaning |", "|---|---|", *rows, ""]
    for name, sub in (getattr(command, "commands", None) or {}).items():
        if not sub.hidden:
            out += _command(sub, typer.Context(sub, info_name=name, parent=ctx), level=min(level + 1, 4))
    return out


SHELL_OPTIONS = {"help", "install_completion", "show_completion"}
"""Options every typer command has, documented by the shell rather than by us."""


def _param_row(param: Any, ctx: typer.Context) -> str | None:
    record = param.get_help_record(ctx)
    if param.name in SHELL_OPTIONS or record is None:
        return None
    names, text = record
    return f"| `{names}` | {_cell(text)} |"


def _help(text: str) -> str:
    """A command's help as Markdown: click's ``\\b`` (no re-wrap) markers dropped, paragraphs kept."""
    lines = [line for line in inspect.cleandoc(text).splitlines() if line.strip() != "\b"]
    return _escape("\n".join(lines))


def _cell(text: str) -> str:
    return _escape(" ".join(text.split())).replace("|", "\\|")


def _escape(text: str) -> str:
    """Angle brackets outside code spans are text, not HTML (inside them Markdown keeps them)."""
    pieces = text.split("`")
    for i in range(0, len(pieces), 2):  # the even pieces lie outside code spans
        pieces[i] = pieces[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(pieces)


# -- settings --------------------------------------------------------------------------------------


def settings_reference(model: type[BaseSettings] | None = None) -> str:
    """Markdown for every setting of ``model`` (default: spotopt's ``Settings``): one table per
    section (the model's own fields, then each cloud's base class), headed by the section's
    docstring summary; a row per field: name, environment variable, default, docstring."""
    from spotopt.settings import Settings

    model = model or Settings
    prefix = model.model_config.get("env_prefix", "")
    out = []
    for section in sections(model):
        docs = _own_docstrings(section)
        out += [f"## {_summary(section)}", "", "| setting | environment variable | default | meaning |"]
        out.append("|---|---|---|---|")
        for name in _own_fields(section, model):
            if name not in docs:
                raise ValueError(
                    f"{section.__name__}.{name} has no docstring: document the field where it is set"
                )
            variable, default = f"{prefix}{name}".upper(), _default(model.model_fields[name].default)
            out.append(f"| `{name}` | `{variable}` | {default} | {_cell(docs[name])} |")
        out.append("")
    return "\n".join(out).rstrip()


def sections(model: type) -> list[type]:
    """The classes that declare ``model``'s fields: ``model`` first, then its bases in method
    resolution order (``Settings``, then each cloud's section, ``spotopt/clouds/<cloud>/settings.py``)."""
    return [cls for cls in model.__mro__ if _own_fields(cls, model)]


def _own_fields(cls: type, model: type) -> list[str]:
    """The fields of ``model`` that ``cls``'s own body declares, in its order."""
    fields = getattr(model, "model_fields", {})
    return [name for name in inspect.get_annotations(cls) if name in fields]


def _summary(cls: type) -> str:
    """The first line of ``cls``'s docstring, without its full stop, reST double backquotes turned
    into Markdown code."""
    line = inspect.cleandoc(cls.__doc__ or cls.__name__).splitlines()[0].rstrip(".")
    return re.sub(r"``([^`]+)``", r"`\1`", line)


def field_docstrings(model: type) -> dict[str, str]:
    """The docstring of every field of ``model``, wherever it is declared (``sections``)."""
    return {name: doc for section in sections(model) for name, doc in _own_docstrings(section).items()}


def _own_docstrings(cls: type) -> dict[str, str]:
    """The string literal under each annotated field of ``cls``'s own class body (its docstring),
    reST double backquotes turned into Markdown code."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    found = {}
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            found[node.target.id] = re.sub(r"``([^`]+)``", r"`\1`", inspect.cleandoc(after.value.value))
    return found


def _default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


# -- the package's layers --------------------------------------------------------------------------


def layers(config: Path = ROOT / ".importlinter") -> list[list[str]]:
    """The first contract's layers, top first, each a list of its sibling packages."""
    parser = configparser.ConfigParser()
    parser.read(config, encoding="utf-8")
    section = next(s for s in parser.sections() if s.startswith("importlinter:contract:"))
    rows = [line.strip() for line in parser[section]["layers"].splitlines() if line.strip()]
    return [[name.strip() for name in row.split("|")] for row in rows]


def layer_edges(config: Path = ROOT / ".importlinter") -> set[tuple[str, str]]:
    """(importer, imported) between the layers' packages, every module counted in its package;
    imports only a type checker sees are left out, as ``lint-imports`` leaves them."""
    import grimp

    packages = [name for row in layers(config) for name in row]

    def home(module: str) -> str | None:
        return next((p for p in packages if module == p or module.startswith(p + ".")), None)

    graph = grimp.build_graph("spotopt", exclude_type_checking_imports=True)
    edges = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = home(module), home(imported)
            if a and b and a != b:
                edges.add((a, b))
    return edges


def imports_drawing() -> str:
    """A Mermaid flowchart of ``layer_edges``, one row of boxes per layer."""
    rows = layers()
    lines = ["```mermaid", "flowchart TB"]
    for i, row in enumerate(rows):
        lines.append(f'  subgraph L{i}[" "]')
        lines.append("    direction LR")
        lines += [f"    {name.replace('.', '_')}[{name.removeprefix('spotopt.')}]" for name in row]
        lines.append("  end")
    for a, b in sorted(layer_edges()):
        lines.append(f"  {a.replace('.', '_')} --> {b.replace('.', '_')}")
    lines.append("```")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
