"""``spotopt whatif --save NAME``: the replay stored (SQLite and PostgreSQL) exactly as the JSON
output reports it, read back by the dashboard's view; a taken or blank name changes nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from spotopt.db.models import WhatifPlacement, WhatifResult, WhatifRun
from spotopt.history.setup import open_history
from spotopt.ui import views
from tests.helpers import cli, strict_json

NAME = "nightly <b>run</b>"


def _rows(url: str) -> tuple[int, int, int]:
    db = open_history(url)
    try:
        with db.session() as session:
            runs, results, placed = (
                session.scalar(select(func.count()).select_from(m)) or 0
                for m in (WhatifRun, WhatifResult, WhatifPlacement)
            )
            return runs, results, placed
    finally:
        db.dispose()


def test_saved_replay_reads_back_as_printed(db_url: str) -> None:
    code, out, err = cli(
        "--db", db_url, "whatif", "--example", "--strategies", "spot,spotopt", "--save", NAME, "-f", "json"
    )
    assert code == 0, err
    printed = strict_json(out)
    db = open_history(db_url)
    try:
        page = views.whatif(db, NAME)
    finally:
        db.dispose()
    run = page["run"]
    assert (run.starts, run.preemptions, run.billing, run.synthetic) == (1, "model", "instance", True)
    assert run.first_start.isoformat().replace("+00:00", "Z") == printed["first_start"]
    assert page["strategies"] == ["spot", "spotopt"]
    for want in printed["results"]:
        got = page["jobs"][want["job"]][want["strategy"]]
        assert got.cost_usd == pytest.approx(want["cost_usd"])
        assert got.ratio_vs_spot == pytest.approx(want["ratio_vs_spot"])
        assert got.finish_hours == pytest.approx(want["finish_hours"])
        assert (got.moves, got.preemptions, got.unfinished_starts) == (
            want["moves"],
            want["preemptions"],
            want["unfinished_starts"],
        )
    assert len(page["placements"]) == len(printed["placements"]) > 0
    assert [p.job for p in page["placements"]] == sorted(p.job for p in page["placements"])


@pytest.mark.parametrize(("name", "message"), [(NAME, "choose another name"), (" ", "1 to 200 characters")])
def test_taken_or_blank_name_is_refused_and_nothing_changes(db_url: str, name: str, message: str) -> None:
    code, _, err = cli("--db", db_url, "whatif", "--example", "--strategies", "spot", "--save", NAME)
    assert code == 0, err
    before = _rows(db_url)
    code, _, err = cli("--db", db_url, "whatif", "--example", "--strategies", "spot", "--save", name)
    assert code == 2
    assert "--save" in err and message in err
    assert _rows(db_url) == before
