"""Managed jobs (``spotopt.mover.jobs`` and ``spotopt jobs``), on SQLite and PostgreSQL."""

from __future__ import annotations

import importlib.util
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from spotopt.db.engine import Database
from spotopt.db.models import JOB_STATES, JobEvent, ManagedJob
from spotopt.errors import InputError
from spotopt.mover import jobs
from tests.helpers import cli, strict_json
from tests.test_cli_plan import seed

T0 = datetime(2026, 11, 22, 12, tzinfo=UTC)

SPEC = """
jobs:
  - name: resnet
    throughput: {V100: 2.4}
    work: {steps: 1000}
    gpus: {min: 1, max: 2}
    run: python train.py --lr 0.1
    checkpoint: {uri: ckpt, every: 30s}
    budget_usd: 50
    max_usd_per_hour: 3
    allow: {instance_types: [test.v100x1]}
"""


def stored(db: Database) -> dict[str, int]:
    with db.session() as session:
        return {
            "jobs": session.scalar(select(func.count()).select_from(ManagedJob)) or 0,
            "events": session.scalar(select(func.count()).select_from(JobEvent)) or 0,
        }


def write(tmp_path: Path, spec: str = SPEC) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(spec)
    return path


def test_submit_stores_a_pending_job_and_its_first_event(db: Database, tmp_path: Path) -> None:
    job = jobs.submit(db, write(tmp_path), now=T0)
    assert (job.name, job.state, job.run_command) == ("resnet", "pending", "python train.py --lr 0.1")
    assert (job.checkpoint_uri, job.budget_usd, job.max_usd_per_hour) == ("ckpt", 50.0, 3.0)
    assert job.workdir == str(tmp_path.resolve())
    assert job.created_at == job.updated_at == T0
    spec = jobs.job_spec(jobs.get_job(db, "resnet"))
    assert spec.checkpoint is not None and spec.checkpoint.every == "30s" and spec.gpu_range == (1, 2)
    [event] = jobs.events(db, "resnet")
    assert (event.at, event.from_state, event.to_state, event.reason) == (T0, None, "pending", "submitted")


def test_identical_resubmit_is_a_no_op(db: Database, tmp_path: Path) -> None:
    first = jobs.submit(db, write(tmp_path), now=T0)
    # Same job after validation (GPU spelling, key order): the same canonical spec and hash.
    respelled = SPEC.replace("{V100: 2.4}", "{v100: 2.4}").replace("budget_usd: 50", "budget_usd: 50.0")
    again = jobs.submit(db, write(tmp_path, respelled), now=T0 + timedelta(hours=1))
    assert (again.id, again.spec_sha256, again.created_at) == (first.id, first.spec_sha256, T0)
    assert stored(db) == {"jobs": 1, "events": 1}


def test_another_spec_under_the_same_name_is_refused(db: Database, tmp_path: Path) -> None:
    jobs.submit(db, write(tmp_path), now=T0)
    with pytest.raises(InputError, match=r"jobs\[0\].name: job 'resnet' exists with another spec"):
        jobs.submit(db, SPEC.replace("steps: 1000", "steps: 2000"))
    other_dir = tmp_path / "elsewhere"
    other_dir.mkdir()
    with pytest.raises(InputError, match="exists with another directory"):
        jobs.submit(db, write(other_dir))
    assert stored(db) == {"jobs": 1, "events": 1}
    assert jobs.get_job(db, "resnet").budget_usd == 50.0


def test_a_submission_racing_another_is_resolved_by_the_unique_name(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process stores the same name after our look-up: the insert fails on the unique
    constraint and the submission compares with what the other one stored."""
    first = jobs.submit(db, write(tmp_path), now=T0)
    real = jobs._existing
    calls: list[str] = []

    def late(session: Session, name: str) -> ManagedJob | None:
        calls.append(name)
        return None if len(calls) == 1 else real(session, name)  # the first look-up misses it

    monkeypatch.setattr(jobs, "_existing", late)
    assert jobs.submit(db, write(tmp_path)).id == first.id
    assert calls == ["resnet", "resnet"]
    calls.clear()
    with pytest.raises(InputError, match="exists with another spec"):
        jobs.submit(db, SPEC.replace("steps: 1000", "steps: 2000"))
    assert calls == ["resnet", "resnet"]
    assert stored(db) == {"jobs": 1, "events": 1}


def test_dry_run_validates_and_stores_nothing(db: Database, tmp_path: Path) -> None:
    job = jobs.submit(db, write(tmp_path), dry_run=True)
    assert job.id is None and job.state == "pending" and job.name == "resnet"
    assert stored(db) == {"jobs": 0, "events": 0}
    jobs.submit(db, write(tmp_path))
    with pytest.raises(InputError, match="another spec"):  # a dry run also checks the name
        jobs.submit(db, SPEC.replace("run: python", "run: python3"), dry_run=True)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("    run: python train.py --lr 0.1\n", ""),
            r"jobs\[0\] \(resnet\).run: is required for a managed job",
        ),
        (("budget_usd: 50", "budget_usd: -1"), r"jobs\[0\] \(resnet\).budget_usd: must be >= 0.01"),
        (("max_usd_per_hour: 3", "max_usd_per_hour: .inf"), r"max_usd_per_hour: must be a finite number"),
        (("every: 30s", "every: soon"), r"checkpoint.every: 'soon' is not a duration"),
        (("every: 30s", "evry: 30s"), r"checkpoint.evry: unknown field; did you mean 'every'\?"),
        (("uri: ckpt, ", ""), r"checkpoint.uri: is required"),
        (("train.py --lr", "'train.py --lr"), r"\.run: not a command line \(No closing quotation\)"),
        (
            ("name: resnet", "name: ../resnet"),
            r"jobs\[0\] \(../resnet\).name: '../resnet' is not a managed job name",
        ),
        (
            ("jobs:\n", "jobs:\n  - {name: b, work: {steps: 1}}\n"),
            r"jobs: a managed job spec holds exactly one job",
        ),
        (("work: {steps: 1000}", "work: {steps: 0}"), r"work.steps: must be > 0"),
    ],
)
def test_a_bad_spec_names_the_field_and_stores_nothing(
    db: Database, change: tuple[str, str], message: str
) -> None:
    assert change[0] in SPEC
    with pytest.raises(InputError, match=message):
        jobs.submit(db, SPEC.replace(*change, 1))
    assert stored(db) == {"jobs": 0, "events": 0}


def test_list_is_oldest_first_and_filters_by_state(db: Database) -> None:
    for i, name in enumerate(("a", "b", "c")):
        jobs.submit(db, SPEC.replace("name: resnet", f"name: {name}"), now=T0 + timedelta(minutes=i))
    jobs.cancel(db, "b", "not needed", now=T0 + timedelta(hours=1))
    assert [j.name for j in jobs.list_jobs(db)] == ["a", "b", "c"]
    assert [j.name for j in jobs.list_jobs(db, ("cancelled",))] == ["b"]
    assert [j.name for j in jobs.list_jobs(db, ("pending", "running"))] == ["a", "c"]
    with pytest.raises(InputError, match="--state: 'runing' is not a job state"):
        jobs.list_jobs(db, ("runing",))


def test_cancel_records_the_transition_with_time_and_reason(db: Database) -> None:
    jobs.submit(db, SPEC, now=T0)
    at = T0 + timedelta(hours=2)
    job = jobs.cancel(db, "resnet", "budget moved to another project", now=at)
    assert (job.state, job.updated_at) == ("cancelled", at)
    history = [(e.at, e.from_state, e.to_state, e.reason) for e in jobs.events(db, "resnet")]
    assert history == [
        (T0, None, "pending", "submitted"),
        (at, "pending", "cancelled", "budget moved to another project"),
    ]
    with pytest.raises(
        InputError, match="job 'resnet': a cancelled job cannot become cancelled: that state is final"
    ):
        jobs.cancel(db, "resnet", "again")
    with pytest.raises(InputError, match="job 'resnet': already cancelled and its placement has stopped"):
        jobs.cancel(db, "resnet", "again, at once", at_once=True)  # nothing runs: nothing to halt
    with pytest.raises(InputError, match="NAME: no managed job named 'nope'"):
        jobs.cancel(db, "nope", "typo")
    assert stored(db) == {"jobs": 1, "events": 2}


def test_executor_transitions_are_checked_and_recorded(db: Database) -> None:
    """The path the executor will use: ``record_transition`` inside its own transaction."""
    jobs.submit(db, SPEC, now=T0)
    path = ["launching", "running", "moving", "running", "done"]
    with db.session() as session:
        job = session.scalar(select(ManagedJob).where(ManagedJob.name == "resnet"))
        assert job is not None
        for i, to_state in enumerate(path, start=1):
            jobs.record_transition(session, job, to_state, f"step {i}", T0 + timedelta(minutes=i))
    assert [e.to_state for e in jobs.events(db, "resnet")] == ["pending", *path]
    with pytest.raises(InputError, match="a done job cannot become cancelled: that state is final"):
        jobs.cancel(db, "resnet", "too late")
    with db.session() as session:
        job = session.scalar(select(ManagedJob).where(ManagedJob.name == "resnet"))
        assert job is not None
        with pytest.raises(InputError, match="reason: give a reason"):
            jobs.record_transition(session, job, "failed", "  ")
    assert jobs.get_job(db, "resnet").state == "done"


def test_the_transition_table_covers_every_state_and_refuses_the_rest() -> None:
    assert set(jobs.TRANSITIONS) == set(JOB_STATES)
    assert all(targets <= set(JOB_STATES) for targets in jobs.TRANSITIONS.values())
    assert {"done", "failed", "cancelled"} == jobs.TERMINAL
    jobs.check_transition("running", "moving")
    jobs.check_transition("over-budget", "pending")  # the budget was raised
    with pytest.raises(jobs.TransitionError, match="a pending job cannot become running: it may only become"):
        jobs.check_transition("pending", "running")
    with pytest.raises(jobs.TransitionError, match="over-budget job cannot become running"):
        jobs.check_transition("over-budget", "running")
    with pytest.raises(jobs.TransitionError, match="state: 'paused' is not a job state"):
        jobs.check_transition("running", "paused")


def test_the_database_refuses_an_unknown_state(db: Database) -> None:
    jobs.submit(db, SPEC, now=T0)
    with pytest.raises(IntegrityError), db.session() as session:
        session.execute(text("UPDATE managed_jobs SET state = 'paused'"))
    assert jobs.get_job(db, "resnet").state == "pending"


def test_the_migration_freezes_the_same_states() -> None:
    path = Path(__file__).parents[1] / "migrations" / "versions" / "0004_managed_jobs.py"
    spec = importlib.util.spec_from_file_location("migration_0004", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.STATES == JOB_STATES


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_submit_list_show_cancel(db_url: str, tmp_path: Path) -> None:
    path = write(tmp_path)
    code, out, err = cli("--db", db_url, "jobs", "submit", path, "--dry-run")
    assert code == 0 and "resnet: valid" in out and "nothing stored" in out, err
    code, out, _ = cli("--db", db_url, "jobs", "list", "--format", "json")
    assert (code, strict_json(out)) == (0, [])

    code, out, err = cli("--db", db_url, "jobs", "submit", path)
    assert code == 0 and out.startswith("resnet: pending (submitted "), err
    assert cli("--db", db_url, "jobs", "submit", path)[0] == 0  # identical: idempotent

    code, out, _ = cli("--db", db_url, "jobs", "list", "--format", "csv")
    assert code == 0
    header, row = out.splitlines()
    assert header == "name,state,budget_usd,max_usd_per_hour,checkpoint_uri,run_command,created_at,updated_at"
    assert row.startswith("resnet,pending,50.0,3.0,ckpt,python train.py --lr 0.1,")

    code, out, _ = cli("--db", db_url, "jobs", "show", "resnet", "--format", "json")
    doc = strict_json(out)
    assert code == 0
    assert {"state", "events", "spent_usd", "moves", "preemptions"} <= set(doc)
    assert (doc["state"], doc["spent_usd"], doc["moves"], doc["preemptions"]) == ("pending", 0.0, [], 0)
    assert doc["checkpoint"] == {"uri": "ckpt", "every": "30s"} and doc["gpus"] == {"min": 1, "max": 2}
    assert doc["run"] == "python train.py --lr 0.1" and doc["budget_usd"] == 50.0
    assert [(e["from_state"], e["to_state"], e["reason"]) for e in doc["events"]] == [
        (None, "pending", "submitted")
    ]
    assert doc["events"][0]["at"].endswith("Z")

    code, out, err = cli("--db", db_url, "jobs", "cancel", "resnet", "--reason", "[red]not[/red] needed")
    assert code == 0 and "resnet: cancelled ([red]not[/red] needed)" in out, err  # no markup
    code, out, _ = cli("--db", db_url, "jobs", "show", "resnet", "--format", "csv")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "job,at,from_state,to_state,reason"
    assert lines[2].endswith(",pending,cancelled,[red]not[/red] needed")
    code, out, _ = cli("--db", db_url, "jobs", "show", "resnet")
    assert code == 0 and "State transitions" in out and "[red]not[/red] needed" in out
    code, out, _ = cli("--db", db_url, "jobs", "list", "--state", "cancelled")
    assert code == 0 and "resnet" in out and "cancelled" in out


def test_cli_bad_input_exits_2_and_stores_nothing(db_url: str, db: Database, tmp_path: Path) -> None:
    bad = write(tmp_path, SPEC.replace("budget_usd: 50", "budget_usd: lots"))
    code, _, err = cli("--db", db_url, "jobs", "submit", bad)
    assert code == 2 and "budget_usd" in err
    code, _, err = cli("--db", db_url, "jobs", "submit", tmp_path / "missing.yaml")
    assert code == 2 and "missing.yaml" in err
    assert stored(db) == {"jobs": 0, "events": 0}

    code, _, err = cli("--db", db_url, "jobs", "show", "nope")
    assert code == 2 and "no managed job named 'nope'" in err
    assert cli("--db", db_url, "jobs", "submit", write(tmp_path))[0] == 0
    other = tmp_path / "other"
    other.mkdir()
    code, _, err = cli(
        "--db", db_url, "jobs", "submit", write(other, SPEC.replace("steps: 1000", "steps: 2000"))
    )
    assert code == 2 and "exists with another spec" in err
    assert cli("--db", db_url, "jobs", "cancel", "resnet")[0] == 0
    code, _, err = cli("--db", db_url, "jobs", "cancel", "resnet")
    assert code == 2 and "that state is final" in err
    code, _, err = cli("--db", db_url, "jobs", "list", "--state", "paused")
    assert code == 2 and "--state" in err
    assert stored(db) == {"jobs": 1, "events": 2}


def test_plan_reads_a_managed_job_spec(db_url: str, tmp_path: Path) -> None:
    """The planner ignores the mover's fields: one file serves ``plan`` and ``jobs submit``."""
    seed(db_url)
    code, out, err = cli(
        "--db", db_url, "plan", write(tmp_path), "--policy", "min-cost", "--at", "2025-03-02", "-f", "json"
    )
    assert code == 0, err
    assert json.loads(out)["jobs"][0]["name"] == "resnet"
