"""What the mover feeds back (``spotopt.mover.observed``): spot lifetimes into the market's
preemption rate, heartbeat steps/s into the planner's throughput, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from spotopt.db.engine import Database
from spotopt.db.models import InstanceLifetime, Placement, Throughput
from spotopt.errors import InputError
from spotopt.history.market import DEFAULT_RATE_PER_HOUR, PRIOR_HOURS, snapshot
from spotopt.history.throughput_store import import_rows, stored_figures, validate_row
from spotopt.jobspec import Job
from spotopt.mover.observed import THROUGHPUT_HALF_LIFE_S, record_lifetime, record_throughput
from spotopt.throughput import JobThroughput
from tests.helpers import cli
from tests.mover_rows import AWS_V100, T0, market_id, place, seed_markets, submit


def lifetimes(db: Database) -> list[tuple[str, datetime, datetime | None, str | None, str]]:
    with db.session() as session:
        rows = session.scalars(select(InstanceLifetime).order_by(InstanceLifetime.started_at)).all()
        return [(r.instance_ref, r.started_at, r.ended_at, r.end_reason, r.source) for r in rows]


def record(db: Database, placement_id: int, **changes: object) -> str:
    """Apply ``changes`` to the placement (as the executor would), then record its life."""
    with db.session() as session:
        placement = session.get(Placement, placement_id)
        assert placement is not None
        for key, value in changes.items():
            setattr(placement, key, value)
        record_lifetime(session, placement)
        return placement.key


def test_a_spot_placement_is_recorded_once_running_then_ended(db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    job = submit(db, tmp_path)
    running = place(db, job, market_id(db, AWS_V100), T0)
    key = record(db, running)
    assert lifetimes(db) == [(key, T0, None, None, "spotopt")]  # still running: censored at any t
    record(db, running)  # every tick may record it again: still one row
    end = T0 + timedelta(hours=3)
    record(db, running, ended_at=end, end_reason="preempted", state="ended")
    assert lifetimes(db) == [(key, T0, end, "preempted", "spotopt")]
    record(db, running)  # a reconcile after a crash records it once more
    assert len(lifetimes(db)) == 1


@pytest.mark.parametrize("reason", ["terminated", "exited", "finished", "lost"])
def test_every_end_but_a_preemption_is_censored(db: Database, tmp_path: Path, reason: str) -> None:
    seed_markets(db)
    job = submit(db, tmp_path)
    p = place(db, job, market_id(db, AWS_V100), T0, T0 + timedelta(hours=1), reason)
    key = record(db, p)
    assert lifetimes(db) == [(key, T0, T0 + timedelta(hours=1), "terminated", "spotopt")]


def test_on_demand_and_unstarted_placements_record_nothing(db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    job = submit(db, tmp_path)
    on_demand = place(db, job, market_id(db, AWS_V100, "on-demand"), T0, T0 + timedelta(hours=1), "preempted")
    never = place(db, job, market_id(db, AWS_V100), None)
    record(db, on_demand)
    record(db, never)
    assert lifetimes(db) == []


def test_recorded_lifetimes_change_the_snapshot_rate(db: Database, tmp_path: Path) -> None:
    """AWS spot with no advisor data starts at the default 1/48 per hour; two preemptions after
    1 h each and a 10 h life we ended (censored) make it (2 + 1/48·48) / (12 + 48) = 0.05."""
    seed_markets(db)
    job = submit(db, tmp_path)
    aws = market_id(db, AWS_V100)
    at = T0 + timedelta(days=1)

    def rate() -> tuple[float, str]:
        with db.session() as session:
            [state] = [m for m in snapshot(session, at) if m.quote.market_id == aws]
        return state.preemptions_per_hour, state.rate_source

    assert rate() == (pytest.approx(DEFAULT_RATE_PER_HOUR["aws"]), "default")
    lives = [(0, 1, "preempted"), (2, 3, "preempted"), (4, 14, "terminated")]
    for start_h, end_h, reason in lives:
        p = place(db, job, aws, T0 + timedelta(hours=start_h), T0 + timedelta(hours=end_h), reason)
        record(db, p)
    prior = DEFAULT_RATE_PER_HOUR["aws"]
    expected = (2 + prior * PRIOR_HOURS) / (1 + 1 + 10 + PRIOR_HOURS)
    assert expected == pytest.approx(0.05)
    assert rate() == (pytest.approx(expected), "observed+default")


def imported(db: Database, *rows: dict[str, object]) -> None:
    """Figures as ``spotopt throughput import`` stores them."""
    with db.session() as session:
        import_rows(session, [validate_row("test", r) for r in rows], now=T0)


def measured(db: Database) -> list[tuple[str, str, int, float, datetime]]:
    with db.session() as session:
        rows = session.scalars(select(Throughput).where(Throughput.source == "measured")).all()
        return [(r.workload, r.gpu_model, r.gpu_count, r.steps_per_s, r.recorded_at) for r in rows]


def test_heartbeats_combine_as_a_time_decayed_mean(db: Database) -> None:
    half = timedelta(seconds=THROUGHPUT_HALF_LIFE_S)
    with db.session() as session:
        record_throughput(session, "resnet", "v100", 1, 2.0, T0)
    assert measured(db) == [("resnet", "V100", 1, 2.0, T0)]  # the GPU spelled as imports spell it
    with db.session() as session:
        record_throughput(session, "resnet", "V100", 1, 9.0, T0)  # the same heartbeat re-read
        record_throughput(session, "resnet", "V100", 1, 9.0, T0 - half)  # an older one, late
    assert measured(db) == [("resnet", "V100", 1, 2.0, T0)]
    with db.session() as session:
        record_throughput(session, "resnet", "V100", 1, 3.0, T0 + half)  # one half-life later: halfway
    assert measured(db) == [("resnet", "V100", 1, pytest.approx(2.5), T0 + half)]
    with db.session() as session:  # a quick poll moves it only a little
        record_throughput(session, "resnet", "V100", 1, 3.0, T0 + half + timedelta(seconds=5))
    assert 2.5 < measured(db)[0][3] < 2.51
    with db.session() as session:  # other GPU counts are other figures
        record_throughput(session, "resnet", "V100", 2, 3.8, T0)
    assert len(measured(db)) == 2


@pytest.mark.parametrize(
    ("gpu", "count", "steps", "field"),
    [("Z999", 1, 1.0, "gpu_model"), ("V100", 0, 1.0, "gpu_count"), ("V100", 1, float("nan"), "steps_per_s")],
)
def test_a_bad_heartbeat_figure_names_the_field(
    db: Database, gpu: str, count: int, steps: float, field: str
) -> None:
    with db.session() as session, pytest.raises(InputError, match=f"throughput of 'resnet': {field}"):
        record_throughput(session, "resnet", gpu, count, steps, T0)
    assert measured(db) == []


def test_the_planner_prefers_the_measured_figure(db: Database, tmp_path: Path) -> None:
    """An imported 2.0 and an estimate lose to the measured 3.0, whichever row comes first."""
    job = Job.model_validate({"name": "bert", "work": {"steps": 36000}})
    gpu = "V100-16GB"  # one key for all three: only the source decides
    imported(
        db,
        {"workload": "bert", "gpu_model": gpu, "gpu_count": 1, "steps_per_s": 2.0},
        {"workload": "bert", "gpu_model": gpu, "gpu_count": 2, "steps_per_s": 3.5},
        {"workload": "bert", "gpu_model": gpu, "gpu_count": 1, "steps_per_s": 1.0, "source": "estimated"},
    )
    with db.session() as session:
        record_throughput(session, "bert", "V100-16GB", 1, 3.0, T0)
        figures = stored_figures(session)
    for rows in (figures, list(reversed(figures))):
        fig = JobThroughput(job, rows).at("V100-16GB", 1)
        assert fig is not None and (fig.steps_per_s, fig.source) == (3.0, "measured")
    two = JobThroughput(job, figures).at("V100-16GB", 2)
    assert two is not None and (two.steps_per_s, two.source) == (3.5, "imported")


def test_spotopt_plan_uses_the_measured_figure(db_url: str, db: Database, tmp_path: Path) -> None:
    seed_markets(db)
    spec = tmp_path / "bert.yaml"
    allow = "{instance_types: [p3.2xlarge], markets: [on-demand]}"  # no preemption loss to discount
    spec.write_text(f"jobs:\n  - name: bert\n    work: {{steps: 36000}}\n    allow: {allow}\n")
    imported(db, {"workload": "bert", "gpu_model": "V100-16GB", "gpu_count": 1, "steps_per_s": 2.0})

    def chosen() -> dict[str, object]:
        code, out, err = cli(
            "--db", db_url, "plan", spec, "--policy", "min-cost", "--at", "2026-03-01T12:00Z", "-f", "json"
        )
        assert code == 0, err
        [placed] = json.loads(out)["jobs"][0]["allocation"]
        return placed  # type: ignore[no-any-return]

    assert (chosen()["throughput_source"], chosen()["steps_per_s"]) == (
        "imported",
        pytest.approx(2.0, rel=0.01),
    )
    with db.session() as session:
        record_throughput(session, "bert", "V100-16GB", 1, 3.0, T0)
    assert (chosen()["throughput_source"], chosen()["steps_per_s"]) == (
        "measured",
        pytest.approx(3.0, rel=0.01),
    )
