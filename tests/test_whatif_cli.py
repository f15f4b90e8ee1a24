"""``spotopt whatif``: the example on a fresh database, the JSON schema, both databases agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from spotopt.cli.app import app
from spotopt.db.models import PricePoint
from spotopt.history.setup import open_history
from spotopt.whatif.example_market import load_example
from spotopt.whatif.run import STRATEGIES
from spotopt.whatif.timeline import SYNTHETIC_SOURCE

RESULT_KEYS = {
    "job",
    "strategy",
    "cost_usd",
    "ratio_vs_spot",
    "finish_hours",
    "deadline_met",
    "moves",
    "preemptions",
}
JOBS = """
jobs:
  - name: a3c
    throughput: {K80: 1.0, P100: 1.2, V100: 2.2}
    work: {gpu_days: 0.5, gpu: V100}
    checkpoint_gb: 0.01
  - name: resnet
    throughput: {K80: 1.0, P100: 3.7, V100: 9.6}
    work: {gpu_days: 0.5, gpu: V100}
    deadline: 30h
    dataset: {gb: 150, cloud: aws, region: us-east-1}
"""
ARGS = ["--start", "2020-02-03T00:00Z", "--starts", "2", "--every", "1d", "--seed", "5", "--format", "json"]


def whatif(url: str, *args: str) -> Any:
    result = CliRunner().invoke(app, ["--db", url, "whatif", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def check_schema(doc: dict[str, Any]) -> None:
    assert doc["synthetic"] is True and SYNTHETIC_SOURCE in doc["price_sources"]
    for row in doc["results"]:
        assert set(row) >= RESULT_KEYS
        assert row["strategy"] in STRATEGIES
        assert isinstance(row["cost_usd"], float) and row["cost_usd"] > 0
        assert isinstance(row["ratio_vs_spot"], float)
        assert isinstance(row["finish_hours"], float)
        assert row["deadline_met"] in (None, True, False) or 0 <= row["deadline_met"] <= 1
        assert isinstance(row["moves"], float) and isinstance(row["preemptions"], float)


def test_example_replays_in_a_throwaway_database_and_leaves_the_history_alone(
    db_url: str, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    doc = whatif(db_url, str(jobs), "--example", *ARGS)
    check_schema(doc)
    assert {(r["job"], r["strategy"]) for r in doc["results"]} == {
        (j, s) for j in ("a3c", "resnet") for s in STRATEGIES
    }
    by = {(r["job"], r["strategy"]): r for r in doc["results"]}
    for job in ("a3c", "resnet"):
        assert by[(job, "spot")]["ratio_vs_spot"] == pytest.approx(1.0)
        bound = by[(job, "oracle")]["bound_usd"]
        assert bound <= by[(job, "oracle")]["cost_usd"] + 1e-9
        for strategy in STRATEGIES:
            if strategy != "dynamic":  # its moves are free: not the same model
                assert bound <= by[(job, strategy)]["cost_usd"] + 1e-9, strategy
    assert by[("resnet", "spotopt")]["deadline_met"] == 1.0
    db = open_history(db_url)
    try:
        with db.session() as session:
            count = session.scalar(select(func.count()).where(PricePoint.source == SYNTHETIC_SOURCE))
    finally:
        db.dispose()
    assert count == 0


def test_sqlite_and_postgresql_agree(sqlite_db: Any, pg_url: str, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    pg = open_history(pg_url)
    try:
        load_example(sqlite_db)
        load_example(pg)
    finally:
        pg.dispose()
    sqlite_url = str(sqlite_db.engine.url)
    args = [str(jobs), *ARGS, "--strategies", "spot,multi-cloud,spotopt,oracle"]
    doc = whatif(sqlite_url, *args)
    check_schema(doc)
    assert doc == whatif(pg_url, *args)


def test_bad_strategy_names_the_valid_ones(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["whatif", "--example", "--strategies", "spot,cheapest"])
    assert result.exit_code == 2
    assert "cheapest" in result.output and "multi-cloud" in result.output


def test_plot_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import matplotlib

    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    png = tmp_path / "whatif.png"
    # A plot leaves the process's backend as it found it (a notebook's, a server's): it used to
    # switch it to Agg through pyplot.
    monkeypatch.setattr(matplotlib, "use", lambda *a, **k: pytest.fail(f"matplotlib.use{a} called"))
    result = CliRunner().invoke(
        app,
        [
            "whatif",
            str(jobs),
            "--example",
            "--start",
            "2020-02-03T00:00Z",
            "--strategies",
            "spot,dynamic",
            "--plot",
            str(png),
        ],
    )
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "SYNTHETIC" in result.output


def test_bad_seed_plot_and_too_many_starts_fail_before_replaying(db_url: str, tmp_path: Path) -> None:
    cases = [
        (["--example", "--seed", "-1"], "--seed"),
        (["--example", "--plot", str(tmp_path / "nowhere" / "x.png")], "--plot"),
        (["--example", "--starts", "100000"], "--starts 100000"),
    ]
    for args, named in cases:
        result = CliRunner().invoke(app, ["--db", db_url, "whatif", *args])
        assert result.exit_code == 2, result.output
        assert named in result.output
    assert not (tmp_path / "nowhere").exists()


def test_the_table_shows_the_summary_and_placements_only_on_request(db_url: str, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(JOBS)
    base = [
        "--db",
        db_url,
        "whatif",
        str(jobs),
        "--example",
        "--start",
        "2020-02-03T00:00Z",
        "--strategies",
        "spot",
    ]
    short = CliRunner().invoke(app, base)
    assert short.exit_code == 0, short.output
    assert "Where each job ran" not in short.output and "--details" in short.output
    full = CliRunner().invoke(app, [*base, "--details"])
    assert "Where each job ran" in full.output
    with_spotopt = [*base[:-1], "spot,spotopt"]
    short = CliRunner().invoke(app, with_spotopt)
    assert "policy solves" not in short.output and "policy solved" not in short.output  # not a note
    detailed = CliRunner().invoke(app, [*with_spotopt, "--details"])
    assert "detail: the spotopt strategy's policy solved" in detailed.output
    document = json.loads(CliRunner().invoke(app, [*with_spotopt, "--format", "json"]).stdout)
    assert document["policy_solves"] > 0 and not any("policy solves" in n for n in document["notes"])
