"""The per-database id, the leak sweep and ``spotopt daemon sweep`` / ``daemon status`` on the
local provider (real processes): only this database's instances that bill with no live
placement are listed, and ended unless ``--dry-run``."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from spotopt.clouds.common.base import DATABASE_TAG, LaunchSpec
from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.identity import DATABASE_ID_KEY, database_id, database_id_of
from spotopt.db.models import Meta
from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history
from spotopt.mover.leader import Leadership
from tests.helpers import cli, strict_json
from tests.mover_world import a_day_ago, now, on_demand, spot


def test_the_database_id_is_made_once_and_kept(db: Database) -> None:
    first = database_id_of(db)
    assert len(first) == 32 and first == database_id_of(db)
    with db.session() as session:
        assert session.scalar(select(Meta.value).where(Meta.key == DATABASE_ID_KEY)) == first
        assert database_id(session) == first  # inside a caller's transaction too


def test_two_databases_have_two_ids_and_a_reopened_one_keeps_its_own(tmp_path: Path) -> None:
    a, b = (open_history(f"sqlite:///{tmp_path / name}.sqlite") for name in ("a", "b"))
    try:
        assert database_id_of(a) != database_id_of(b)
        kept = database_id_of(a)
    finally:
        a.dispose()
        b.dispose()
    again = open_history(f"sqlite:///{tmp_path / 'a'}.sqlite")
    try:
        assert database_id_of(again) == kept
    finally:
        again.dispose()


@pytest.fixture
def fleet(db: Database, tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    """A local provider holding three running instances: this database's (no placement owns
    it), another database's, and one launched outside the daemon."""
    run_ingest(db, "test", "test", [spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago())])
    state_dir = tmp_path / "local"
    provider = LocalProvider(state_dir)
    market = spot("us-east-1a", 0.9, now()).market

    def launch(key: str, **tags: str) -> str:
        spec = LaunchSpec("ghost", 1, ("sleep", "600"), f"file://{tmp_path}/s", tags=tags)
        return provider.launch(spec, market, key).instance_id

    made = {
        "ours": launch("ghost-m1", **{DATABASE_TAG: database_id_of(db)}),
        "theirs": launch("ghost-m2", **{DATABASE_TAG: "another-database"}),
        "untagged": launch("ghost-m3"),
    }
    yield state_dir, made
    for instance in provider.list_instances():
        provider.terminate(instance.instance_id)


def _live(state_dir: Path, instance_id: str) -> bool:
    return LocalProvider(state_dir).status(instance_id).state.is_live


def test_sweep_lists_then_ends_only_this_database_s_leftover(
    db_url: str, fleet: tuple[Path, dict[str, str]]
) -> None:
    state_dir, made = fleet
    local = ("--provider", "local", "--state-dir", state_dir)
    code, out, err = cli("--db", db_url, "daemon", "sweep", "--dry-run", *local, "--format", "json")
    assert code == 0, err
    doc = strict_json(out)
    assert doc["dry_run"] is True
    assert [(r["instance"], r["bills"], r["action"]) for r in doc["leftovers"]] == [
        (made["ours"], "compute", "none")
    ]
    assert doc["leftovers"][0]["usd_per_hour"] == 0.9  # the market's price now, from the history
    assert doc["by_cloud"] == [
        {"cloud": "aws", "leftovers": 1, "ended": 0, "usd_per_hour": 0.9, "unpriced": 0}
    ]
    assert all(_live(state_dir, i) for i in made.values())  # a dry run ends nothing

    code, out, err = cli("--db", db_url, "daemon", "sweep", *local)
    assert code == 0, err
    assert "Billing with no live placement: ended" in out and made["ours"] in out and "terminated" in out
    assert not _live(state_dir, made["ours"])
    assert _live(state_dir, made["theirs"]) and _live(state_dir, made["untagged"])
    code, out, _ = cli("--db", db_url, "daemon", "sweep", *local, "--format", "csv")
    assert (code, out.splitlines()) == (0, ["cloud,instance,job,state,bills,usd_per_hour,why,action"])


def test_sweep_leaves_the_ending_to_the_leader_and_pipes_json_from_the_console_script(
    db_url: str, db: Database, fleet: tuple[Path, dict[str, str]]
) -> None:
    state_dir, made = fleet
    leader = Leadership(db)
    assert leader.try_acquire()
    try:
        code, _, err = cli("--db", db_url, "daemon", "sweep", "--provider", "local", "--state-dir", state_dir)
        assert code == 2 and "another daemon leads" in err and "--dry-run" in err
        assert _live(state_dir, made["ours"])
        args = [
            "--db",
            db_url,
            "daemon",
            "sweep",
            "--dry-run",
            "--provider",
            "local",
            "--state-dir",
            str(state_dir),
        ]
        piped = subprocess.run(
            [sys.executable, "-m", "spotopt", *args, "--format", "json"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert [r["instance"] for r in strict_json(piped.stdout)["leftovers"]] == [made["ours"]]
    finally:
        leader.release()


def test_daemon_status_shows_what_the_last_round_swept(
    db_url: str, fleet: tuple[Path, dict[str, str]]
) -> None:
    state_dir, made = fleet
    code, _, err = cli(
        "--db", db_url, "daemon", "run", "--once", "--provider", "local", "--state-dir", state_dir
    )
    assert code == 0, err
    assert not _live(state_dir, made["ours"])
    code, out, _ = cli("--db", db_url, "daemon", "status", "--format", "json")
    (row,) = strict_json(out)["last_tick"]["swept"]
    assert (row["instance"], row["action"], row["why"]) == (
        made["ours"],
        "terminated",
        "no placement has its key",
    )
    code, out, _ = cli("--db", db_url, "daemon", "status")
    assert "1 billing with no live placement, 1 terminated ($0.90/h)" in out
