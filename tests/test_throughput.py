"""Effective throughput: figures, estimates, data-parallel scaling, preemption loss, the store."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from spotopt.db.engine import Database
from spotopt.errors import InputError
from spotopt.history.market import DEFAULT_RATE_PER_HOUR, bucket_midpoint, rate_per_hour
from spotopt.history.throughput_store import import_rows, list_rows, read_file, stored_figures
from spotopt.jobspec import parse_jobs
from spotopt.throughput import (
    JobThroughput,
    StoredFigure,
    checkpoint_interval_s,
    comm_ratio_efficiency,
    preemption_efficiency,
)

EXAMPLES = Path(__file__).parents[1] / "data" / "examples"


def one_job(**fields: object):  # type: ignore[no-untyped-def]
    return parse_jobs({"jobs": [{"name": "j", "work": {"steps": 10}, **fields}]}).jobs[0]


def test_spec_figures_match_family_and_model() -> None:
    book = JobThroughput(one_job(throughput={"V100": 2.4, "V100-32GB": 2.6}))
    assert book.at("V100-16GB", 1).steps_per_s == 2.4  # type: ignore[union-attr]
    assert book.at("V100-32GB", 1).steps_per_s == 2.6  # type: ignore[union-attr]  (model beats family)
    assert book.at("A100-80GB", 1) is None  # nothing to estimate from


def test_spec_comm_ratio_keeps_its_data_parallel_model() -> None:
    # T(d) = T1 d / (1 + 2 r (d-1)) as the spec states it; its measured points still win
    book = JobThroughput(one_job(throughput={"A100": {1: 1.0, 4: 3.5}}, scaling={"comm_ratio": 0.05}))
    fig = book.at("A100-80GB", 8)
    assert fig is not None and fig.steps_per_s == pytest.approx(8 * comm_ratio_efficiency(8, 0.05))
    assert fig.source == "spec"
    assert book.at("A100-40GB", 4).steps_per_s == 3.5  # type: ignore[union-attr]


def test_one_gpu_figure_scales_with_a_hardware_default_and_is_estimated() -> None:
    book = JobThroughput(one_job(throughput={"A100-40GB": 1.0}))
    two, eight = book.at("A100-40GB", 2), book.at("A100-40GB", 8)
    assert two is not None and eight is not None and two.estimated and eight.estimated
    assert 1.0 < two.steps_per_s < 2.0 and two.steps_per_s < eight.steps_per_s < 8.0
    assert eight.low is not None and eight.high is not None and eight.low < eight.steps_per_s < eight.high


def test_missing_gpu_estimated_from_the_references() -> None:
    refs = [
        StoredFigure("cnn", g, 1, v, "imported") for g, v in (("K80", 1.0), ("P100", 3.7), ("V100", 9.6))
    ] + [StoredFigure("rl", g, 1, v, "imported") for g, v in (("K80", 1.0), ("P100", 1.2), ("V100", 2.2))]
    book = JobThroughput(one_job(throughput={"K80": 0.5, "P100": 1.85}), refs)
    fig = book.at("V100-16GB", 1)
    assert fig is not None and fig.estimated and "cnn" in fig.references
    # the job's P100/K80 ratio is the CNN's: its slope on the GPU speeds carries it to about
    # 0.5 x 9.6 (7 % over: the CNN is not straight in them; the shrunk rank-one term was 18 % under)
    assert fig.steps_per_s == pytest.approx(4.8, rel=0.1)
    assert fig.low is not None and fig.high is not None and fig.low < fig.steps_per_s < fig.high


def test_young_daly_and_preemption_efficiency() -> None:
    assert checkpoint_interval_s(60, 0.0) is None
    assert preemption_efficiency(0.0, 60, 300) == 1.0
    rate = 1 / 24  # per hour
    tau = checkpoint_interval_s(60, rate)
    assert tau == pytest.approx(math.sqrt(2 * 60 * 24 * 3600))
    expected = 1 - 60 / tau - (rate / 3600) * (tau / 2 + 300)  # type: ignore[operator]
    assert preemption_efficiency(rate, 60, 300) == pytest.approx(expected)
    assert preemption_efficiency(100.0, 600, 3600) == 0.0


def test_a_planning_period_bounds_the_checkpoint_interval() -> None:
    hour = 3600.0
    # Nothing preempts: one checkpoint per period, which costs C/period (the simulator writes it).
    assert checkpoint_interval_s(60, 0.0, hour) == hour
    assert preemption_efficiency(0.0, 60, 300, hour) == pytest.approx(1 - 60 / hour)
    # Young/Daly (sqrt(2*60*48*3600) = 4554 s) longer than the period: capped at it, and the
    # preemption loss uses the period.
    rate = 1 / 48
    assert checkpoint_interval_s(60, rate, hour) == hour
    expected = 1 - 60 / hour - (rate / 3600) * (hour / 2 + 300)
    assert preemption_efficiency(rate, 60, 300, hour) == pytest.approx(expected)
    assert preemption_efficiency(rate, 60, 300, hour) < preemption_efficiency(rate, 60, 300)
    # Shorter: shortened further to divide the period (sqrt(2*60*3600/2) = 466 s -> 450 s).
    assert checkpoint_interval_s(60, 2.0, hour) == pytest.approx(hour / 8)


def test_interruption_conversions() -> None:
    assert [bucket_midpoint(v) for v in (5, 10, 15, 20, 100)] == [2.5, 7.5, 12.5, 17.5, 25.0]
    assert rate_per_hour("advisor-bucket", 5) == pytest.approx(-math.log(1 - 0.025) / 730)
    assert rate_per_hour("eviction-rate", 10) == pytest.approx(-math.log(1 - 0.075))
    assert DEFAULT_RATE_PER_HOUR["gcp"] == pytest.approx(1 / 24)
    with pytest.raises(ValueError):
        rate_per_hour("placement-score", 3)


def test_store_import_is_idempotent_and_listed(db: Database) -> None:
    rows = read_file(EXAMPLES / "throughputs.csv")
    with db.session() as s:
        assert import_rows(s, rows) == (len(rows), 0)
    with db.session() as s:
        assert import_rows(s, rows) == (0, 0)
        assert len(list_rows(s, "cyclegan")) == 3
        assert {f.workload for f in stored_figures(s)} >= {"transformer", "resnet18"}


def test_store_json_and_errors(tmp_path: Path) -> None:
    good = tmp_path / "t.json"
    good.write_text('[{"workload": "w", "gpu_model": "h100-80gb", "gpu_count": 8, "steps_per_s": 3}]')
    assert read_file(good)[0]["gpu_model"] == "H100-80GB"
    bad = tmp_path / "t.csv"
    bad.write_text("workload,gpu_model,gpu_count,steps_per_s\nw,V100,1,0\n")
    with pytest.raises(InputError, match=r"line 2: steps_per_s '0' is not a number from 1e-06 to 1e\+09"):
        read_file(bad)
    bad.write_text("workload,gpu_model,gpu_count,steps_per_s\nw,Z9,1,1\n")
    with pytest.raises(InputError, match="line 2: gpu_model: unknown GPU"):
        read_file(bad)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ('"gpu_count": 1, "steps_per_s": Infinity', r"steps_per_s inf is not a number from 1e-06"),
        ('"gpu_count": 1, "steps_per_s": NaN', r"steps_per_s nan is not a number from 1e-06"),
        ('"gpu_count": 1, "steps_per_s": "fast"', r"steps_per_s 'fast' is not a number from 1e-06"),
        ('"gpu_count": 1, "steps_per_s": true', r"steps_per_s True is not a number from 1e-06"),
        # Finite but beyond the job spec's bounds: 1e308 made a placement free and 1e-300 made its
        # cost overflow, and either stopped every job's decision (HiGHS: kModelEmpty).
        ('"gpu_count": 1, "steps_per_s": 1e308', r"steps_per_s 1e\+308 is not a number from 1e-06 to 1e\+09"),
        ('"gpu_count": 1, "steps_per_s": 1e-300', r"steps_per_s 1e-300 is not a number from 1e-06"),
        ('"gpu_count": 1.5, "steps_per_s": 2', r"gpu_count 1.5 is not a whole number >= 1"),
        ('"gpu_count": 0, "steps_per_s": 2', r"gpu_count 0 is not a whole number >= 1"),
        ('"gpu_count": "two", "steps_per_s": 2', r"gpu_count 'two' is not a whole number >= 1"),
    ],
)
def test_store_names_the_bad_field(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "t.json"
    path.write_text(f'[{{"workload": "w", "gpu_model": "V100", {row}}}]')
    with pytest.raises(InputError, match=rf"\[0\]: {message}"):
        read_file(path)


def test_store_csv_counts_and_integral_json_counts(tmp_path: Path) -> None:
    csv_path = tmp_path / "t.csv"
    csv_path.write_text("workload,gpu_model,gpu_count,steps_per_s\nw,V100,2,1.5\nw,V100,1.5,1\n")
    with pytest.raises(InputError, match=r"line 3: gpu_count '1.5' is not a whole number"):
        read_file(csv_path)
    json_path = tmp_path / "t.json"
    json_path.write_text('[{"workload": "w", "gpu_model": "V100", "gpu_count": 4.0, "steps_per_s": 2}]')
    assert read_file(json_path)[0]["gpu_count"] == 4


def test_a_nul_in_a_workload_or_note_is_refused(tmp_path: Path) -> None:
    """PostgreSQL cannot store a NUL in text (psycopg.DataError); SQLite could: refused for both."""
    bad = tmp_path / "t.json"
    bad.write_text('[{"workload": "w\\u0000x", "gpu_model": "V100", "gpu_count": 1, "steps_per_s": 2}]')
    with pytest.raises(InputError, match=r"\[0\]: workload: .* contains a NUL character"):
        read_file(bad)
    bad.write_text(
        '[{"workload": "w", "gpu_model": "V100", "gpu_count": 1, "steps_per_s": 2, "note": "a\\u0000"}]'
    )
    with pytest.raises(InputError, match=r"\[0\]: note: .* contains a NUL character"):
        read_file(bad)


def test_a_figure_stored_out_of_bounds_is_left_out_of_the_references(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """A figure stored before the import's bounds (1e308) would overflow every estimate: it is
    left out, with a warning naming it, and the sane figures stay."""
    from datetime import UTC, datetime

    from spotopt.db.models import Throughput

    ok = {"workload": "ok", "gpu_model": "V100", "gpu_count": 1, "steps_per_s": 2.0, "source": "imported"}
    with db.session() as s:
        import_rows(s, [{**ok, "note": None}])
        s.add(
            Throughput(
                **{**ok, "workload": "bad", "gpu_model": "L4", "steps_per_s": 1e308},
                recorded_at=datetime.now(UTC),
            )
        )
    with db.session() as s, caplog.at_level("WARNING", logger="spotopt"):
        figures = stored_figures(s)
    assert [(f.workload, f.steps_per_s) for f in figures] == [("ok", 2.0)]
    assert "throughput bad on 1 x L4 (imported): steps_per_s 1e+308 is outside" in caplog.text
