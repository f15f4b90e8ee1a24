"""A job's problems stay that job's (issue 21): a store the job could never use is refused at
submit in one line, and a job whose store fails at run time is failed with its reason while
the daemon goes on placing and watching the others. Real training processes (the local
provider), a real store, S3 served by moto; SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import itertools
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import update

from spotopt.db.engine import Database
from spotopt.db.models import ManagedJob
from spotopt.errors import InputError
from spotopt.mover import jobs as jobstore
from spotopt.mover.executor import FAULTS_TO_FAIL
from tests.mover_world import World, a_day_ago, job_yaml, make_world, now, on_demand, spot
from tests.stores import moto_s3

__all__ = ["moto_s3"]  # the fixture, imported for pytest


@pytest.fixture
def world(db: Database, tmp_path: Path) -> World:
    w = make_world(db, tmp_path)
    w.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    yield w
    w.stop_all()


def _with_store(path: Path, uri: str) -> Path:
    """``path``'s job spec with its checkpoint store at ``uri``."""
    text = path.read_text(encoding="utf-8")
    old = next(line for line in text.splitlines() if "checkpoint: {uri:" in line)
    path.write_text(text.replace(old, f"    checkpoint: {{uri: {uri}}}"), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("ftp://h/x", "unknown URL scheme 'ftp'"),
        ("bogus://x", "unknown URL scheme 'bogus'"),
        ("/proc/nope", "cannot write to file:///proc/nope"),
        ("/etc/hostname/ckpt", "/etc/hostname is not a directory"),
    ],
)
def test_a_store_that_can_never_work_is_refused_at_submit(
    db: Database, tmp_path: Path, uri: str, message: str
) -> None:
    spec = _with_store(job_yaml(tmp_path), uri)
    with pytest.raises(InputError, match=message) as raised:
        jobstore.submit(db, spec)
    assert "jobs[0] (mlp).checkpoint.uri" in str(raised.value) and "\n" not in str(raised.value)
    assert jobstore.list_jobs(db) == []


def test_a_missing_bucket_is_refused_at_submit_and_a_real_one_accepted(
    db: Database,
    tmp_path: Path,
    moto_s3: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import boto3

    for key, value in {
        "AWS_ENDPOINT_URL": moto_s3,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(key, value)
    boto3.client("s3", endpoint_url=moto_s3).create_bucket(Bucket="i21-there")
    with pytest.raises(InputError, match=r"checkpoint.uri: cannot write to s3://i21-nowhere/ckpt"):
        jobstore.submit(db, _with_store(job_yaml(tmp_path), "s3://i21-nowhere/ckpt"))
    job = jobstore.submit(db, _with_store(job_yaml(tmp_path), "s3://i21-there/ckpt"))
    assert job.state == "pending"
    listed = boto3.client("s3", endpoint_url=moto_s3).list_objects_v2(Bucket="i21-there")
    assert listed["KeyCount"] == 0  # the probe was removed


def test_a_job_whose_store_is_unknown_fails_alone_and_the_others_start(world: World, tmp_path: Path) -> None:
    jobstore.submit(world.db, job_yaml(tmp_path, name="bad"))
    jobstore.submit(world.db, job_yaml(tmp_path))
    # stored before submit checked stores (or edited since): a scheme no back-end serves
    with world.db.session() as session:
        session.execute(update(ManagedJob).where(ManagedJob.name == "bad").values(checkpoint_uri="ftp://h/x"))
    world.hold("mlp", 20)
    world.daemon.tick()
    bad = world.job("bad")
    assert bad.state == "failed"
    (event,) = [e for e in jobstore.events(world.db, "bad") if e.to_state == "failed"]
    assert "unknown URL scheme 'ftp'" in event.reason and "\n" not in event.reason
    assert [p.state for p in world.placements("bad")] in ([], ["ended"])
    world.until("the good job to run", lambda: world.job().state == "running")
    world.until("its progress", lambda: world.job().steps >= 20)


def test_a_running_job_whose_store_breaks_is_failed_and_stopped_while_the_other_is_watched(
    db: Database, tmp_path: Path
) -> None:
    skew = [timedelta(0)]
    world = make_world(db, tmp_path, clock=lambda: now() + skew[0])
    world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    try:
        _break_a_store_for_good(world, tmp_path, skew)
    finally:
        world.stop_all()


def _break_a_store_for_good(world: World, tmp_path: Path, skew: list[timedelta]) -> None:
    fragile = _with_store(job_yaml(tmp_path, name="fragile"), str(tmp_path / "fragile-store"))
    jobstore.submit(world.db, fragile)
    jobstore.submit(world.db, job_yaml(tmp_path))
    world.hold("fragile", 20)
    world.hold("mlp", 20)
    world.daemon.tick()
    world.until("both to run", lambda: world.job("fragile").state == world.job().state == "running")
    world.until("both to progress", lambda: world.job("fragile").steps >= 20 and world.job().steps >= 20)
    (placement,) = world.placements("fragile")
    # The store goes: its directory replaced by a file (a bucket deleted, a mount gone).
    _replace_by_a_file(tmp_path / "fragile-store")
    # An outage is waited out: as many failed rounds as it takes, within Timeouts.store_s...
    for _ in range(FAULTS_TO_FAIL + 1):
        world.daemon.poll()
    assert world.job("fragile").state == "running"
    # ...and past it the job is failed (the daemon's clock moved on, the store is still gone).
    skew[0] = timedelta(seconds=world.settings.timeouts.store_s)
    world.daemon.poll()
    assert world.job("fragile").state == "failed"
    reason = next(e for e in jobstore.events(world.db, "fragile") if e.to_state == "failed").reason
    assert "NotADirectoryError" in reason and "\n" not in reason
    (ended,) = world.placements("fragile")
    assert (ended.state, ended.end_reason) == ("ended", "failed")
    assert not world.provider.status(placement.instance_id or "").state.is_live
    # The other job is still watched: it finishes and is marked done.
    world.release("mlp")
    world.until("the other job to finish", lambda: world.job().state == "done")


def _replace_by_a_file(store: Path) -> None:
    """Put a file where the directory ``store`` is, while a live trainer writes into it.

    Deleting the tree raced the trainer's writes (``rmtree`` failed with "Directory not empty:
    'heartbeats'" when a heartbeat landed between its listing and its ``rmdir``). A rename
    moves the whole tree away at once, and the file is created only where nothing is
    (``O_EXCL``); should the trainer make the directory again in between, it is moved away too."""
    for moved in itertools.count():
        with contextlib.suppress(FileNotFoundError):
            store.rename(store.with_name(f"{store.name}-gone-{moved}"))
        try:
            with store.open("x", encoding="utf-8") as file:
                file.write("not a store")
            return
        except FileExistsError:  # the trainer made it again in between: move that away too
            continue


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("    restart_s: 10", "    restart_s: 10\n    deadline: 2020-01-01T00:00Z"),
            r"deadline: .* is already past",
        ),
        (("    throughput: {V100: 0.02}\n", ""), r"throughput: no steps/s figure for this job"),
    ],
)
def test_submit_refuses_a_job_plan_would_refuse(
    db: Database, tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    path = job_yaml(tmp_path)
    text = path.read_text(encoding="utf-8")
    assert change[0] in text
    path.write_text(text.replace(*change), encoding="utf-8")
    with pytest.raises(InputError, match=message):
        jobstore.submit(db, path)
    assert jobstore.list_jobs(db) == []


def test_submit_warns_of_markets_the_history_has_never_priced(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = job_yaml(tmp_path, instance_types="[p3.2xlarg]")
    jobstore.submit(world.db, path)
    assert "allow.instance_types: 'p3.2xlarg' has no market in this history; did you mean 'p3.2xlarge'?" in (
        caplog.text
    )
