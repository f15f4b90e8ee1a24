"""Stale prices are shown with their age and ranked after fresh ones (issue 36 item 6):
``prices cheapest`` and ``report run price-board`` through the installed console script, the
limit being the setting ``price_max_age_days``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).parents[1] / "data" / "examples" / "prices.csv"
"""The README's example prices: from 2024, so stale by now."""


def _spotopt(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("spotopt")
    assert script.exists(), f"{script}: install the package (pip install -e .) into this interpreter's env"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=120
    )


def _json(*args: str, env: dict[str, str] | None = None) -> Any:
    done = _spotopt(*args, "-f", "json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The example prices (2024) and, an hour ago, a fresh one dearer than every 2024 spot price
    of its GPU (L4: g2-standard-4 in europe-west4)."""
    tmp_path = tmp_path_factory.mktemp("stale")
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    fresh = tmp_path / "fresh.csv"
    hour_ago = (datetime.now(UTC) - timedelta(hours=1)).replace(microsecond=0)
    fresh.write_text(
        "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n"
        f"{hour_ago.isoformat()},gcp,europe-west4,,g2-standard-4,spot,0.9\n"
    )
    for csv in (EXAMPLES, fresh):
        done = _spotopt("--db", url, "import", "csv", str(csv))
        assert done.returncode == 0, done.stderr
    return url


def test_prices_cheapest_ranks_a_fresh_price_before_stale_ones_and_shows_ages(history: str) -> None:
    rows = _json("--db", history, "prices", "cheapest", "--gpu", "L4", "--market", "spot")
    assert (rows[0]["region"], rows[0]["stale"]) == ("europe-west4", False)
    assert len(rows) > 1 and all(r["stale"] for r in rows[1:])
    assert rows[0]["usd_per_gpu_hour"] > min(r["usd_per_gpu_hour"] for r in rows[1:])  # dearer, yet first
    assert rows[0]["age_days"] == pytest.approx(1 / 24, abs=0.01)
    assert all(r["age_days"] > 365 for r in rows[1:])
    # The limit is the setting: a limit of ten years makes every price fresh, ranked by price alone.
    decade = _json(
        "--db", history, "prices", "cheapest", "--gpu", "L4", "--market", "spot",
        env={"SPOTOPT_PRICE_MAX_AGE_DAYS": "3650"},
    )  # fmt: skip
    assert not any(r["stale"] for r in decade)
    assert [r["usd_per_gpu_hour"] for r in decade] == sorted(r["usd_per_gpu_hour"] for r in decade)
    assert decade[0]["region"] != "europe-west4"
    table = _spotopt("--db", history, "prices", "cheapest", "--gpu", "L4")
    assert table.returncode == 0, table.stderr
    assert "age days" in table.stdout and "stale" in table.stdout
    assert "more than 7 days" in table.stdout and "price_max_age_days" in table.stdout


def test_price_board_ranks_stale_prices_last_and_says_why(history: str) -> None:
    args = ("--db", history, "report", "run", "price-board", "-p", "gpu=L4", "-p", "market=spot")
    board = _json(*args)
    assert board[0]["region"] == "europe-west4" and board[0]["stale"] is False
    assert all(r["stale"] and r["age_days"] > 365 for r in board[1:]) and len(board) > 1
    done = _spotopt(*args)
    assert done.returncode == 0
    assert f"{len(board) - 1} of {len(board)} prices are stale" in done.stderr
    assert "price_max_age_days" in done.stderr
