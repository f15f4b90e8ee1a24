"""The package's layers (``.importlinter``, issue 22) hold, and ``lint-imports`` is no test that
cannot fail: a copy of the package with one upward import added breaks its contract."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the ``spotopt`` package found first under ``root``."""
    return subprocess.run(
        [str(LINT), "--no-cache", str(root / ".importlinter")],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package laid out as installed: the folders pyproject maps into it (``package-dir``:
    collectors/, policies/, …) inside ``spotopt/``, where import-linter finds them."""
    root = tmp_path_factory.mktemp("layers")
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "spotopt", root / "spotopt", ignore=ignore)
    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    for package, folder in mapped["package-dir"].items():
        if package.startswith("spotopt.") and (ROOT / folder / "__init__.py").exists():
            shutil.copytree(ROOT / folder, root / package.replace(".", "/"), ignore=ignore)
    shutil.copy(ROOT / ".importlinter", root / ".importlinter")
    return root


def test_the_package_keeps_its_layers(copy: Path) -> None:
    result = lint(copy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "upward", "contract"),
    [
        ("db/engine.py", "import spotopt.decide.core", "Layers: the CLI over the apps"),
        ("decide/costs.py", "import spotopt.mover.daemon", "Layers: the CLI over the apps"),
        ("clouds/aws/billing.py", "import spotopt.clouds.gcp.billing", "A cloud's folder imports no other"),
        ("jobspec.py", "import spotopt.history.ingest", "The base modules"),
        ("policies/min_cost.py", "import spotopt.decide.core", "The base modules"),
        ("collectors/base.py", "import spotopt.clouds.registry", "The base modules"),
        ("agent/config.py", "import sqlalchemy", "The agent and the checkpoints run on the instance"),
        ("clouds/aws/settings.py", "import spotopt.errors", "A cloud's settings section is a leaf"),
    ],
)
def test_an_upward_import_breaks_its_contract(copy: Path, module: str, upward: str, contract: str) -> None:
    path = copy / "spotopt" / module
    original = path.read_text(encoding="utf-8")
    try:
        path.write_text(original + f"\n{upward}  # noqa\n", encoding="utf-8")
        result = lint(copy)
    finally:
        path.write_text(original, encoding="utf-8")
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if " BROKEN" in line]  # "… BROKEN (3 ignored …)"
    assert broken, result.stdout
    assert contract.split(":")[0] in result.stdout.split("Broken contracts")[-1], result.stdout


def _hook() -> Any:
    spec = importlib.util.spec_from_file_location("generated_docs", ROOT / "docs" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_drawing_of_the_imports_has_no_arrow_up() -> None:
    hook = _hook()
    rank = {name: i for i, row in enumerate(hook.layers()) for name in row}
    edges = hook.layer_edges()
    assert ("spotopt.decide", "spotopt.history") in edges  # the drawing is read from the code
    up = [(a, b) for a, b in edges if rank[a] >= rank[b]]
    assert up == []
    drawing = hook.imports_drawing()
    assert drawing.startswith("```mermaid") and "spotopt_decide --> spotopt_history" in drawing
