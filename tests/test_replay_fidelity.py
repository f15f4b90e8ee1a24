"""Fidelity: the real daemon replaying a recorded market pays what the what-if engine predicted.

One small case: one job of about three simulated hours on AWS p3.2xlarge, whose cheapest zone
changes after two hours, replayed with no preemptions. The daemon runs for real (executor,
journal, lease, checkpoints, ``local`` processes running the stand-in workload) on the
simulated clock; the what-if engine replays the same history from the same start.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from spotopt.db.engine import Database, make_engine
from spotopt.db.models import CapacityObservation, InstanceLifetime, ManagedJob, Market, Placement
from spotopt.replay.standin import Rates, Workload
from tests.helpers import cli, ingest, strict_json
from tests.mover_world import on_demand, spot

START = datetime(2024, 3, 1, tzinfo=UTC)
JOB = {
    "name": "small",
    "throughput": {"V100": 1.0},
    "work": {"steps": 10000},
    "restart_s": 300,
    "checkpoint_s": 30,
    "allow": {"clouds": ["aws"], "markets": ["spot", "on-demand"], "instance_types": ["p3.2xlarge"]},
}


def history(db: Database) -> None:
    before = START - timedelta(days=1)
    ingest(
        db,
        [
            spot("us-east-1a", 0.90, before),
            spot("us-east-1b", 1.20, before),
            spot("us-east-1b", 0.30, START + timedelta(hours=1, minutes=30)),
            on_demand(3.06, before),
        ],
    )


def test_the_replayed_daemon_pays_what_the_whatif_predicted(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    history(db)
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [JOB]}), encoding="utf-8")
    keep = tmp_path / "kept"
    code, out, err = cli(
        "--db",
        db_url,
        "daemon",
        "replay",
        jobs,
        "--start",
        START.isoformat(),
        "--keep",
        keep,
        "--format",
        "json",
    )
    assert code == 0, err
    (row,) = strict_json(out)
    assert row["job"] == "small"
    # The job moves once (zone b turns cheapest at 01:30; the 02:00 round moves it), both ways.
    assert row["predicted_moves"] == row["realised_moves"] == 1
    assert row["predicted_preemptions"] == row["realised_preemptions"] == 0
    assert row["failed_moves"] == 0  # every start and move the executor ran went through
    # Within 1 %: what remains is the make-before-break overlap of the move (the old placement
    # bills its 30 s checkpoint, the new one waits those 30 s for the lease) and the stand-in
    # writing periodic checkpoints as real pauses where the engine discounts speed evenly
    # (docs/benchmarks.md, "Fidelity"); both are well under 1 % of a three-hour job.
    assert abs(row["cost_diff"]) < 0.01 and abs(row["finish_diff"]) < 0.01
    assert row["realised_cost_usd"] == pytest.approx(row["predicted_cost_usd"], rel=0.01)
    # The replayed ledger is a database of its own, kept with --keep, read like a real one.
    code, out, err = cli(
        "--db", f"sqlite:///{keep / 'replay.sqlite'}", "jobs", "show", "small", "--format", "json"
    )
    assert code == 0, err
    assert strict_json(out)["state"] == "done"
    # The replay ran on a copy: the history has no managed job or placement.
    with db.session() as session:
        assert session.scalar(select(func.count()).select_from(ManagedJob)) == 0
        assert session.scalar(select(func.count()).select_from(Placement)) == 0


def test_a_recorded_preemption_is_replayed_as_the_whatif_simulates_it(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    # Zone b's instance was preempted at 02:40 in the record (AWS: the notice two minutes
    # before). The job moved there at 02:00; at 02:38 its agent gets the notice, writes its
    # 30 s emergency checkpoint (it fits in the notice: nothing is lost) and ends the instance;
    # the 03:00 round places it again. The engine simulates exactly that.
    history(db)
    with db.session() as session:
        market_id = session.scalar(
            select(Market.id).where(Market.zone == "us-east-1b", Market.kind == "spot")
        )
        session.add(
            InstanceLifetime(
                market_id=market_id,
                instance_ref="i-recorded",
                started_at=START - timedelta(hours=5),
                ended_at=START + timedelta(hours=2, minutes=40),
                end_reason="preempted",
                source="test",
            )
        )
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [JOB]}), encoding="utf-8")
    args = ("daemon", "replay", jobs, "--start", START.isoformat(), "--preemptions", "replay")
    code, out, err = cli("--db", db_url, *args, "--format", "json")
    assert code == 0, err
    (row,) = strict_json(out)
    assert row["predicted_preemptions"] == row["realised_preemptions"] == 1
    assert row["predicted_moves"] == row["realised_moves"] == 1
    assert row["failed_moves"] == 0
    # The preemption costs the 02:38-03:00 wait and a restart: the finish is 25 min later than
    # without it, in both.
    assert row["predicted_finish_hours"] > 3.2
    assert abs(row["cost_diff"]) < 0.01 and abs(row["finish_diff"]) < 0.01


def submitted(db: Database, db_url: str, tmp_path: Path) -> Path:
    """The history, and the small job submitted as a managed job (``spotopt jobs submit``)."""
    history(db)
    store = {"uri": str(tmp_path / "store")}
    managed = {**JOB, "run": "python train.py", "checkpoint": store, "budget_usd": 50}
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [managed]}), encoding="utf-8")
    assert cli("--db", db_url, "jobs", "submit", jobs)[0] == 0
    return jobs


def test_daemon_run_replay_replays_the_submitted_jobs_in_a_database_of_its_own(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    jobs = submitted(db, db_url, tmp_path)
    where = tmp_path / "replayed"
    args = ("daemon", "run", "--replay", "--start", START.isoformat(), "--state-dir", where)
    code, out, note = cli("--db", db_url, *args, "--format", "json")
    assert code == 0, note
    (row,) = strict_json(out)
    # The job as `daemon replay` ran it above: done after one move, at the what-if's cost.
    assert row["job"] == "small" and row["state"] == "done"
    assert row["moves"] == 1 and row["preemptions"] == 0 and row["failed_moves"] == 0
    code, out, err = cli(
        "--db", db_url, "daemon", "replay", jobs, "--start", START.isoformat(), "--format", "json"
    )
    assert code == 0, err
    (predicted,) = strict_json(out)
    assert row["cost_usd"] == pytest.approx(predicted["realised_cost_usd"], rel=1e-9)
    assert row["finish_hours"] == pytest.approx(predicted["realised_finish_hours"], rel=1e-9)
    # Its ledger is read like a real one, from the replay's own database; the real one is untouched.
    assert f"sqlite:///{where / 'replay.sqlite'}" in note
    code, out, err = cli(
        "--db", f"sqlite:///{where / 'replay.sqlite'}", "jobs", "cost", "small", "--format", "json"
    )
    assert code == 0, err
    assert strict_json(out)["total_usd"] == pytest.approx(row["cost_usd"], rel=1e-9)
    code, out, err = cli("--db", db_url, "jobs", "show", "small", "--format", "json")
    assert strict_json(out)["state"] == "pending" and strict_json(out)["spent_usd"] == 0


def test_a_replay_stopped_before_the_job_is_done_bills_up_to_its_simulated_end(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    submitted(db, db_url, tmp_path)
    where = tmp_path / "replayed"
    until = (START + timedelta(hours=1)).isoformat()
    args = ("daemon", "run", "--replay", "--start", START.isoformat(), "--until", until, "--state-dir", where)
    code, out, err = cli("--db", db_url, *args, "--format", "json")
    assert code == 0, err
    (row,) = strict_json(out)
    assert row["state"] == "running" and row["finish_hours"] is None
    assert row["cost_usd"] == pytest.approx(0.90, rel=1e-9)  # one hour on zone a at $0.90/h
    # Its ledger, read later, stops at the simulated end, not at the real now.
    code, out, err = cli(
        "--db", f"sqlite:///{where / 'replay.sqlite'}", "jobs", "cost", "small", "--format", "json"
    )
    assert code == 0, err
    assert strict_json(out)["total_usd"] == pytest.approx(row["cost_usd"], rel=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--replay", "--once"), "--replay with --once: a replay runs every placement as a local process"),
        (("--replay", "--provider", "aws"), "--replay with --provider:"),
        (("--start", "2024-03-01"), "--start/--until/--preemptions/--seed: only with --replay"),
        (("--replay", "--poll", "1s"), "--replay with --poll:"),
        (("--replay", "--preemptions", "often"), "--preemptions 'often': must be one of none, model, replay"),
        (("--replay",), "--replay: no unfinished managed job to replay"),
    ],
)
def test_daemon_run_replay_refuses_bad_options(
    db: Database, db_url: str, args: tuple[str, ...], message: str
) -> None:
    history(db)
    code, out, err = cli("--db", db_url, "daemon", "run", *args)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("bogus", "--preemptions 'bogus': must be one of none, model, replay"),
        ("replay", "--preemptions replay: the history has no recorded preemptions"),
    ],
)
def test_replay_refuses_bad_preemptions(db_url: str, tmp_path: Path, option: str, message: str) -> None:
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [JOB]}), encoding="utf-8")
    code, out, err = cli("--db", db_url, "daemon", "replay", jobs, "--preemptions", option)
    assert code == 2 and out == ""
    assert message in err and len(err.strip().splitlines()) == 1


def test_the_standin_trains_restarts_and_checkpoints_in_simulated_time() -> None:
    rates = Rates(
        work_steps=1000, restart_s=100, checkpoint_s=10, options={"m|1": {"steps_per_s": 1.0, "tau_s": 60}}
    )
    load = Workload.entering(0.0, 0.0, rates, "m|1")
    # Its first whole step confirms a start or a move: the first event the daemon must see.
    assert load.next_event() == pytest.approx(101.0)
    assert load.advance(100.0) == [] and load.step == 0  # the restart: no progress
    assert load.advance(100.5) == [] and load.next_event() == pytest.approx(101.0)
    assert load.advance(101.0) == []
    # Then only the end: 20 cycles of 50 s training and a 10 s periodic write, less the last write.
    assert load.next_event() == pytest.approx(100.0 + 20 * 60.0 - 10.0)
    assert load.advance(155.0) == [] and load.step == pytest.approx(50.0)  # writing: no progress
    assert load.advance(160.0) == [pytest.approx(50.0)]
    assert load.advance(170.0) == [] and load.step == pytest.approx(60.0)
    load.begin_checkpoint(170.0)  # the daemon asks: the write takes checkpoint_s from now
    assert load.next_event() == pytest.approx(180.0)
    assert load.advance(180.0) == [pytest.approx(60.0)]
    assert load.next_event() == pytest.approx(180.0 + 18 * 60.0 + 40.0)
    written = load.advance(5000.0)
    # 940 more steps at 50 per 60 s cycle: 18 periodic writes, then the work is done mid-cycle.
    assert len(written) == 18 and load.mode == "done" and load.step == 1000
    assert load.cursor == pytest.approx(180.0 + 18 * 60.0 + 40.0)
    assert load.next_event() is None


def test_the_replay_table_sets_each_prediction_beside_what_happened() -> None:
    from spotopt.cli.daemon import _side_by_side

    row = {
        "job": "small",
        "predicted_cost_usd": 2.124957,
        "predicted_egress_usd": 0.0,
        "realised_cost_usd": 2.138333,
        "cost_diff": 0.0062946,
        "predicted_finish_hours": 3.44153,
        "realised_finish_hours": 3.43611,
        "finish_diff": -0.0015732,
        "predicted_moves": 1,
        "realised_moves": 1,
        "predicted_preemptions": 1,
        "realised_preemptions": 1,
        "failed_moves": 0,
    }
    shown = _side_by_side(row)
    assert shown["cost $"] == "2.12 → 2.14" and shown["Δ cost"] == "+0.63 %"
    assert shown["finish h"] == "3.4 → 3.4" and shown["Δ finish"] == "-0.16 %"
    assert shown["moves"] == "1/1" and shown["preemptions"] == "1/1"
    never = {**row, "predicted_cost_usd": math.inf, "predicted_finish_hours": math.inf, "cost_diff": None}
    assert _side_by_side(never)["cost $"] == "– → 2.14"
    assert _side_by_side(never)["finish h"] == "never → 3.4" and _side_by_side(never)["Δ cost"] == "–"


def test_recorded_capacity_refuses_the_replayed_launch_as_the_whatif_refuses_it(
    db: Database, db_url: str, tmp_path: Path
) -> None:
    # Zone a, the cheapest, was probed out from the start to 02:00, after a day seen available:
    # its outage is not yet recorded when the job starts. Both the engine and the replayed
    # daemon try zone a first, are refused (the daemon by the local provider standing in for
    # the cloud's capacity error), and run the job on zone b, which stays cheaper than
    # on-demand. A deadline puts the job under the capacity rule.
    before = START - timedelta(days=1)
    ingest(db, [spot("us-east-1a", 0.90, before), spot("us-east-1b", 1.20, before), on_demand(3.06, before)])
    probes = tmp_path / "probes.csv"
    rows = [
        (START - timedelta(days=1), "us-east-1a", 1),
        (START, "us-east-1a", 0),
        (START + timedelta(hours=2), "us-east-1a", 1),
        (START - timedelta(days=1), "us-east-1b", 1),
    ]
    probes.write_text(
        "timestamp,cloud,region,zone,instance_type,available\n"
        + "".join(f"{at.isoformat()},aws,us-east-1,{zone},p3.2xlarge,{up}\n" for at, zone, up in rows),
        encoding="utf-8",
    )
    assert cli("--db", db_url, "import", "availability", probes)[0] == 0
    jobs = tmp_path / "jobs.yaml"
    jobs.write_text(yaml.safe_dump({"jobs": [{**JOB, "deadline": "8h"}]}), encoding="utf-8")
    keep = tmp_path / "kept"
    args = ("daemon", "replay", jobs, "--start", START.isoformat(), "--preemptions", "replay", "--keep", keep)
    code, out, err = cli("--db", db_url, *args, "--format", "json")
    assert code == 0, err
    (row,) = strict_json(out)
    assert row["predicted_moves"] == row["realised_moves"] == 0
    assert row["predicted_preemptions"] == row["realised_preemptions"] == 0
    assert abs(row["cost_diff"]) < 0.02 and abs(row["finish_diff"]) < 0.02
    replayed = Database(make_engine(f"sqlite:///{keep / 'replay.sqlite'}"))
    try:
        with replayed.session() as session:
            zones = session.execute(
                select(Market.zone, Placement.started_at)
                .join(Placement, Placement.market_id == Market.id)
                .order_by(Placement.id)
            ).all()
            refused = session.scalars(
                select(Market.zone)
                .join(CapacityObservation, CapacityObservation.market_id == Market.id)
                .where(CapacityObservation.source == "daemon", ~CapacityObservation.available)
            ).all()
    finally:
        replayed.dispose()
    # The daemon tried zone a (recorded before the call), ran the job on zone b only, and its
    # refused launch is a capacity observation.
    assert [(zone, started is not None) for zone, started in zones] == [
        ("us-east-1a", False),
        ("us-east-1b", True),
    ]
    assert refused == ["us-east-1a"]
