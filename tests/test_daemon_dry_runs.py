"""``spotopt daemon`` dry runs and defaults as a user meets them, through the installed console
script (issue 36): ``daemon sweep --dry-run`` changes nothing, not even the database's id
(item 21), and ``daemon run --period 2s`` alone is accepted, its poll following the short
period (item 4)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from spotopt.clouds.common.base import DATABASE_TAG, LaunchSpec
from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import Meta
from spotopt.history.ingest import run_ingest
from tests.helpers import strict_json
from tests.mover_world import a_day_ago, now, on_demand, spot

SPOTOPT = Path(sys.executable).parent / "spotopt"


def _spotopt(db_url: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    argv = [str(SPOTOPT), "--db", db_url, *map(str, args)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _meta(db: Database) -> dict[str, str]:
    with db.session() as session:
        return {row.key: row.value for row in session.scalars(select(Meta))}


def test_sweep_dry_run_writes_nothing_not_even_the_database_id(
    db_url: str, db: Database, tmp_path: Path
) -> None:
    run_ingest(db, "test", "test", [spot("us-east-1a", 0.9, a_day_ago())])
    provider = LocalProvider(tmp_path / "local")
    market = spot("us-east-1a", 0.9, now()).market
    for key, tags in (("theirs", {DATABASE_TAG: "another-database"}), ("outside", {})):
        spec = LaunchSpec("ghost", 1, ("sleep", "600"), f"file://{tmp_path}/s", tags=tags)
        provider.launch(spec, market, key)
    try:
        before = _meta(db)
        done = _spotopt(
            db_url, "daemon", "sweep", "--dry-run", "--provider", "local", "--state-dir", tmp_path / "local",
            "--format", "json",
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert strict_json(done.stdout)["leftovers"] == []  # neither is this database's
        assert _meta(db) == before and "database_id" not in before
    finally:
        for instance in provider.list_instances():
            provider.terminate(instance.instance_id)


def test_a_short_period_alone_is_accepted_its_poll_following_it(db_url: str, db: Database) -> None:
    run_ingest(db, "test", "test", [spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago())])
    done = _spotopt(db_url, "daemon", "run", "--period", "2s", "--dry-run", "--format", "json")
    assert done.returncode == 0, done.stderr
    assert strict_json(done.stdout)["decisions"] == []
    longer = _spotopt(db_url, "daemon", "run", "--period", "2s", "--poll", "5s", "--dry-run")
    assert longer.returncode == 2 and "--poll 5s: longer than --period 2s" in longer.stderr
