"""CI runs Hypothesis derandomised (the same examples every run); local runs keep exploring."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What a test module sees once conftest is loaded: the profile, and a per-test ``@settings``.
PROBE = (
    "import tests.conftest\n"
    "from hypothesis import settings\n"
    "per_test = settings(max_examples=7)\n"
    "print(settings.get_current_profile_name(), per_test.derandomize, per_test.database is None)\n"
)


def _probe(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("CI", "HYPOTHESIS_PROFILE")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=clean | env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"CI": "true"}, "ci True True"),
        ({}, "explore False False"),
        ({"HYPOTHESIS_PROFILE": "ci"}, "ci True True"),
        ({"CI": "true", "HYPOTHESIS_PROFILE": "explore"}, "explore False False"),
    ],
)
def test_profile_follows_ci(env: dict[str, str], expected: str) -> None:
    assert _probe(**env) == expected
