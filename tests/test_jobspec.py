"""Job specs: the documented form loads; every error names the job and the field."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spotopt.errors import InputError
from spotopt.jobspec import load_jobs, parse_jobs

EXAMPLE = Path(__file__).parents[1] / "data" / "examples" / "jobs.yaml"


def job(**fields: object) -> dict[str, object]:
    return {"jobs": [{"name": "resnet50", "work": {"steps": 1000}, **fields}]}


def test_example_file_loads() -> None:
    spec = load_jobs(EXAMPLE)
    assert [j.name for j in spec.jobs] == ["resnet50", "a3c", "lm-1b"]
    lm = spec.jobs[2]
    assert lm.gpu_range == (1, 8) and lm.throughput["A100"] == {1: 1.1, 8: 8.0}


def test_issue_form_works() -> None:
    spec = parse_jobs(
        {
            "jobs": [
                {
                    "name": "resnet50",
                    "throughput": {"K80": 0.25, "P100": 0.93, "V100": 2.4},
                    "work": {"gpu_days": 4, "gpu": "V100"},
                    "gpus": 1,
                    "deadline": "72h",
                    "checkpoint_gb": 0.1,
                    "restart_s": 300,
                    "dataset": {"gb": 150, "cloud": "aws", "region": "us-east-1"},
                    "allow": {"clouds": ["aws", "azure"], "markets": ["spot", "on-demand"]},
                }
            ]
        }
    )
    j = spec.jobs[0]
    assert j.deadline_hours(datetime(2025, 1, 1, tzinfo=UTC)) == 72
    assert j.checkpoint_seconds == pytest.approx(0.1 / 0.25)


def test_a_job_sets_its_own_guardrails() -> None:
    spec = parse_jobs(job(guardrails={"min_dwell_s": 600, "deadline_margin_s": 1800.0}))
    own = spec.jobs[0].guardrails
    assert own is not None and (own.min_dwell_s, own.move_margin, own.deadline_margin_s) == (600, None, 1800)
    assert parse_jobs(job()).jobs[0].guardrails is None


def test_iso_deadline_is_relative_to_start() -> None:
    j = parse_jobs(job(deadline="2025-01-02T00:00Z")).jobs[0]
    assert j.deadline_hours(datetime(2025, 1, 1, tzinfo=UTC)) == 24


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"work": {"gpu_days": 0, "gpu": "V100"}}, "jobs[0] (resnet50).work.gpu_days: must be > 0"),
        ({"work": {"gpu_days": 2}}, "jobs[0] (resnet50).work: gpu_days needs gpu"),
        ({"work": {"steps": 1, "gpu_days": 1, "gpu": "V100"}}, "give exactly one of steps or gpu_days"),
        ({"throughput": {"V100": -1}}, "jobs[0] (resnet50).throughput.V100: must be >= 1e-06"),
        ({"throughput": {"X99": 1}}, "jobs[0] (resnet50).throughput: unknown GPU 'X99'"),
        ({"gpus": {"min": 4, "max": 2}}, "jobs[0] (resnet50).gpus: min (4) is above max (2)"),
        ({"gpus": 0}, "jobs[0] (resnet50).gpus: must be >= 1"),
        ({"deadline": "tomorrow"}, "jobs[0] (resnet50).deadline: 'tomorrow' is neither a duration"),
        ({"deadlin": "3h"}, "jobs[0] (resnet50).deadlin: unknown field; did you mean 'deadline'?"),
        ({"allow": {"clouds": ["ibm"]}}, "jobs[0] (resnet50).allow.clouds[0]"),
        ({"allow": {"gpus": ["V1OO"]}}, "jobs[0] (resnet50).allow.gpus"),
        ({"guardrails": {"min_dwell_s": -1}}, "jobs[0] (resnet50).guardrails.min_dwell_s: must be >= 0"),
        ({"guardrails": {"move_margin": True}}, "jobs[0] (resnet50).guardrails.move_margin"),
        ({"guardrails": {"move_margin": 1e6}}, "jobs[0] (resnet50).guardrails.move_margin: must be <= 100"),
        ({"guardrails": {"min_dwell": 60}}, "jobs[0] (resnet50).guardrails.min_dwell: unknown field"),
    ],
)
def test_errors_name_job_and_field(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as err:
        parse_jobs(job(**fields))
    assert message in str(err.value)


def test_duplicate_names_and_missing_fields() -> None:
    with pytest.raises(InputError, match="appears twice"):
        parse_jobs({"jobs": [{"name": "a", "work": {"steps": 1}}, {"name": "a", "work": {"steps": 1}}]})
    with pytest.raises(InputError, match=r"jobs\[0\]\.name: is required"):
        parse_jobs({"jobs": [{"work": {"steps": 1}}]})
    with pytest.raises(InputError, match="'jobs' list"):
        parse_jobs(["not", "a", "mapping"])


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "jobs.yaml"
    bad.write_text("jobs: [\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_jobs(bad)
    with pytest.raises(InputError, match=r"missing\.yaml: no such file"):
        load_jobs(tmp_path / "missing.yaml")


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
        max_leaves=8,
    )
)
def test_any_input_is_a_spec_or_an_input_error(data: object) -> None:
    with contextlib.suppress(InputError):
        parse_jobs({"jobs": [data]})
