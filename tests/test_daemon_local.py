"""The mover end to end on the local provider: real training processes, a real checkpoint store,
the SQL history edited while the daemon runs, on SQLite and PostgreSQL.

Scenarios of issue 11's "done when": a cheaper market appears → a make-before-break move and
weights bit-identical to an uninterrupted run; a preemption notice → emergency checkpoint and
relaunch; a budget cap → over-budget with spend ≤ cap; a deadline spot cannot meet → on-demand.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import select

from spotopt.checkpoints import AgentState, Location, read_heartbeat
from spotopt.cloud_calls import MissingCredentials
from spotopt.clouds.common.base import DATABASE_TAG, Instance, LaunchSpec
from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.identity import database_id_of
from spotopt.db.models import DaemonTick, InstanceLifetime, JobProgress, JournalEntry, Market, Throughput
from spotopt.decide.guardrails import Guardrails
from spotopt.errors import CapacityUnavailableError, ProviderError
from spotopt.mover import daemon as daemon_module
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.mover.eventlog import parse
from spotopt.mover.executor import job_location
from spotopt.mover.ledger import intervals
from spotopt.mover.observed import PREEMPTION_ENDS, record_capacity
from spotopt.mover.progress import progress_points
from spotopt.types import MarketKey, MarketKind
from tests.helpers import cli
from tests.mover_world import (
    AGENT_ENV,
    World,
    a_day_ago,
    job_yaml,
    make_world,
    now,
    on_demand,
    spot,
    uninterrupted_weights,
)
from tests.read_only import allow_writes, refuse_writes
from tests.traces import stored_capacity


@pytest.fixture
def world(db: Database, tmp_path: Path) -> World:
    w = make_world(db, tmp_path)
    yield w
    w.stop_all()


def started(world: World, hold_at: int, name: str = "mlp") -> None:
    world.hold(name, hold_at)
    world.daemon.tick()
    world.until("the job to run", lambda: world.job(name).state == "running")
    world.until(f"step {hold_at}", lambda: world.job(name).steps >= hold_at)


def test_a_cheaper_market_moves_the_job_make_before_break(
    world: World, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    world.prices(*world.markets.history())
    jobstore.submit(world.db, world.markets.job_yaml(tmp_path))
    caplog.set_level("INFO", logger="spotopt.mover")
    started(world, 150)
    first = world.placements()
    assert [p.state for p in first] == ["running"]

    cheaper = world.markets.drop()
    world.prices(cheaper)
    report = world.daemon.tick()
    assert [d["kind"] for d in report.decisions] == ["move"]
    assert f"/{cheaper.market.zone or cheaper.market.region}/" in report.decisions[0]["to"]
    world.until("the lease to move", lambda: world.moves()[-1].step == "confirm")
    world.hold("mlp", 300)  # the new placement may now progress past the checkpoint
    world.until("the move to finish", lambda: world.moves()[-1].outcome is not None)
    old, new = world.placements()
    assert world.moves()[-1].outcome == "done"
    assert old.end_reason == "terminated" and new.state == "running"
    # Make before break: the new instance was up before the old one was terminated.
    assert new.started_at is not None and old.ended_at is not None and new.started_at < old.ended_at
    assert world.moves()[-1].checkpoint_step == 150

    # Both lives are in the history the planner's preemption estimate reads, ours censored.
    with world.db.session() as session:
        lives = (
            session.query(InstanceLifetime).filter_by(source="spotopt").order_by(InstanceLifetime.id).all()
        )
    assert [(life.instance_ref, life.end_reason) for life in lives] == [
        (old.key, "terminated"),
        (new.key, None),
    ]

    world.release("mlp")
    world.until("the job to finish", lambda: world.job().state == "done")
    weights = np.load(tmp_path / "mlp-out" / "weights.npy")
    assert np.array_equal(weights, uninterrupted_weights(tmp_path))
    # The job's progress history, from the agents' heartbeats: each epoch's first beat is kept
    # (the new placement's from the checkpoint at step 150 on), and the chart ends on the job row.
    with world.db.session() as session:
        job = jobstore.find_job(session, "mlp")
        kept = session.execute(
            select(JobProgress.epoch, JobProgress.steps)
            .where(JobProgress.job_id == job.id)
            .order_by(JobProgress.at)
        ).all()
        points = progress_points(session, job)
    assert [epoch for epoch, _ in kept] == sorted(epoch for epoch, _ in kept)
    assert {epoch for epoch, _ in kept} == {old.epoch, new.epoch}
    assert min(steps for epoch, steps in kept if epoch == new.epoch) > 150
    assert points[-1][1] == world.job().steps
    # Every side effect was journaled and finished; every line parses back.
    with world.db.session() as session:
        assert {e.status for e in session.query(JournalEntry)} == {"done"}
    events = [parse(r.getMessage()) for r in caplog.records]
    assert {"launch", "stop-old", "grant", "terminate-old", "decide"} <= {e["event"] for e in events}


def test_a_preemption_notice_checkpoints_and_relaunches(world: World, tmp_path: Path) -> None:
    world.prices(*world.markets.history())
    jobstore.submit(world.db, world.markets.job_yaml(tmp_path))
    started(world, 120)
    (first,) = world.placements()
    assert first.instance_id is not None
    killer = threading.Thread(target=world.preempt, args=(first.instance_id,))
    killer.start()
    world.until("the preempted placement to end", lambda: world.placements()[0].state == "ended")
    killer.join()
    world.daemon.tick()
    world.until(
        "the lease to move",
        lambda: world.moves()[-1].kind == "recover" and world.moves()[-1].step == "confirm",
    )
    world.hold("mlp", 300)
    world.until("the recovery", lambda: world.moves()[-1].outcome is not None)
    assert world.moves()[-1].outcome == "done"
    # Locally the agent saves on the notice and its process ends before the reclaim ("noticed":
    # billed like an instance we ended); the fake EC2 reclaims the instance ("preempted"). Both
    # are preemptions in the lifetimes.
    assert world.placements()[0].end_reason in PREEMPTION_ENDS
    with world.db.session() as session:
        life = session.query(InstanceLifetime).filter_by(instance_ref=first.key).one()
        assert life.end_reason == "preempted"
    assert world.moves()[-1].checkpoint_step == 120  # the emergency checkpoint, nothing lost
    world.release("mlp")
    world.until("the job to finish", lambda: world.job().state == "done")
    assert np.array_equal(np.load(tmp_path / "mlp-out" / "weights.npy"), uninterrupted_weights(tmp_path))


def test_a_budget_cap_stops_the_job_over_budget_within_the_cap(world: World, tmp_path: Path) -> None:
    # $36/h: AWS bills at least 60 s, $0.60, on launch; one more period would pass $0.62.
    world.prices(spot("us-east-1a", 36.0, a_day_ago()), on_demand(90.0, a_day_ago()))
    jobstore.submit(world.db, job_yaml(tmp_path, budget=0.62))
    world.hold("mlp", 50)
    world.daemon.tick()  # launches: $0.60 of the $0.62 is committed by AWS's 60 s minimum
    assert world.placements()[0].state == "running"
    world.until("the stop", lambda: world.job().state == "over-budget")
    with world.db.session() as session:
        rows = intervals(session, world.job().id, now())
    assert len(rows) == 1 and rows[0].ended_at is not None
    assert sum(r.cost_usd for r in rows) <= 0.62
    # Never relaunched until the budget is raised.
    world.daemon.tick()
    assert world.job().state == "over-budget" and len(world.placements()) == 1


def test_a_deadline_spot_cannot_meet_starts_on_demand(world: World, tmp_path: Path) -> None:
    # Spot is cheap but the job's 400 steps at 0.02 steps/s take 5.6 h and spot preempts hourly
    # here; with 6 h to the deadline only on-demand finishes in time.
    from spotopt.db.models import Interruption  # noqa: F401  (the rate comes from the default)

    world.prices(spot("us-east-1a", 0.3, a_day_ago()), on_demand(3.06, a_day_ago()))
    jobstore.submit(world.db, job_yaml(tmp_path, deadline="6h"))
    world.hold("mlp", 10)
    report = world.daemon.tick()
    assert [d["kind"] for d in report.decisions] == ["start"]
    assert report.decisions[0]["to"].endswith("on-demand")
    world.until("the on-demand launch", lambda: world.placements()[0].state == "running")
    assert stored_capacity(world.db) == []  # capacity observations are about spot markets only


def test_a_cancelled_job_is_checkpointed_and_stopped(world: World, tmp_path: Path) -> None:
    world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    jobstore.submit(world.db, job_yaml(tmp_path))
    started(world, 40)
    jobstore.cancel(world.db, "mlp", "not needed")
    world.daemon.tick()
    world.until("the stop", lambda: world.moves()[-1].outcome is not None)
    (placement,) = world.placements()
    assert (world.moves()[-1].kind, world.moves()[-1].outcome) == ("stop", "done")
    assert placement.state == "ended" and world.job().state == "cancelled"
    assert world.moves()[-1].checkpoint_step == 40
    assert not world.provider.status(placement.instance_id or "").state.is_live


def _url(db: Database) -> str:
    return db.engine.url.render_as_string(hide_password=False)


def _halt_journal(world: World, move_id: int) -> list[tuple[str, str]]:
    """The journal of ``move_id``: (key, status), each written before its call and closed after."""
    with world.db.session() as session:
        entries = list(session.scalars(select(JournalEntry).where(JournalEntry.move_id == move_id)))
    assert all(e.finished_at is not None and e.finished_at >= e.started_at for e in entries)
    return [(e.key, e.status) for e in entries]


def test_a_job_cancelled_now_is_terminated_without_a_checkpoint(world: World, tmp_path: Path) -> None:
    world.prices(*world.markets.history())
    jobstore.submit(world.db, world.markets.job_yaml(tmp_path))
    started(world, 40)
    db_url = _url(world.db)
    checkpoints = sorted((tmp_path / "store" / "mlp").glob("checkpoints/*/manifest.json"))
    code, out, err = cli("--db", db_url, "jobs", "cancel", "mlp", "--now", "--reason", "wrong data")
    assert code == 0 and "mlp: cancelled (at once, no checkpoint: wrong data)" in out, err
    (cancel,) = [e for e in jobstore.events(world.db, "mlp") if e.to_state == "cancelled"]
    (placement,) = world.placements()
    assert cancel.reason == "at once, no checkpoint: wrong data" and placement.state == "running"
    world.daemon.tick()  # no stop request, no wait for the agent: terminated in this round
    _start, halt = world.moves()
    assert (halt.kind, halt.outcome, halt.checkpoint_step) == ("halt", "done", None)
    (placement,) = world.placements()
    assert (placement.state, placement.end_reason) == ("ended", "terminated")
    assert not world.provider.status(placement.instance_id or "").state.is_live
    assert world.job().state == "cancelled"
    assert sorted((tmp_path / "store" / "mlp").glob("checkpoints/*/manifest.json")) == checkpoints
    assert _halt_journal(world, halt.id) == [
        (f"m{halt.id}:fence", "done"),
        (f"m{halt.id}:terminate-old", "done"),
    ]
    with world.db.session() as session:
        (interval,) = intervals(session, world.job().id, now())
    assert interval.instance_id == placement.instance_id and interval.ended_at == placement.ended_at
    assert world.daemon.executor is not None and world.daemon.executor.sweep(dry_run=True) == []
    code, _, err = cli("--db", db_url, "jobs", "cancel", "mlp", "--now")
    assert code == 2 and "cancelled" in err


def test_a_cancel_under_way_is_escalated_to_a_halt(world: World, tmp_path: Path) -> None:
    """``jobs cancel`` asks for a checkpoint-and-stop that does not come (the store refuses the
    checkpoint); ``jobs cancel --now`` then wins: the stop is abandoned, the placement fenced
    and terminated in the next round, both steps journaled, nothing left billing, no
    checkpoint written after the halt."""
    world.prices(*world.markets.history())
    jobstore.submit(world.db, world.markets.job_yaml(tmp_path))
    started(world, 40)
    db_url = _url(world.db)
    refused = tmp_path / "store" / "mlp" / "checkpoints"
    refused.mkdir(parents=True, exist_ok=True)
    refuse_writes(refused)
    try:
        code, _, err = cli("--db", db_url, "jobs", "cancel", "mlp", "--reason", "not needed")
        assert code == 0, err
        world.daemon.tick()
        _start, stop = world.moves()
        assert (stop.kind, stop.outcome) == ("stop", None)  # its request sent, no answer possible
        assert _halt_journal(world, stop.id) == [(f"m{stop.id}:stop-old", "done")]
        code, out, err = cli("--db", db_url, "jobs", "cancel", "mlp", "--now", "--reason", "taking too long")
        assert code == 0 and "mlp: cancelled (at once, no checkpoint: taking too long)" in out, err
        world.daemon.tick()
    finally:
        allow_writes(refused)
    _start, stop, halt = world.moves()
    assert stop.outcome == "aborted" and "cancelled" in (stop.detail or "")
    assert (halt.kind, halt.outcome, halt.checkpoint_step) == ("halt", "done", None)
    assert _halt_journal(world, halt.id) == [
        (f"m{halt.id}:fence", "done"),
        (f"m{halt.id}:terminate-old", "done"),
    ]
    (placement,) = world.placements()
    assert (placement.state, placement.end_reason) == ("ended", "terminated")
    assert not world.provider.status(placement.instance_id or "").state.is_live
    assert [e.reason for e in jobstore.events(world.db, "mlp") if e.to_state == "cancelled"] == [
        "not needed",
        "at once, no checkpoint: taking too long",
    ]
    with world.db.session() as session:
        (interval,) = intervals(session, world.job().id, now())
    assert interval.instance_id == placement.instance_id and interval.ended_at == placement.ended_at
    assert world.daemon.executor is not None and world.daemon.executor.sweep(dry_run=True) == []
    world.daemon.tick()  # the fenced agent can write nothing, now that the store would take it
    assert list(refused.glob("*/manifest.json")) == []
    assert world.job().state == "cancelled"
    code, _, err = cli("--db", db_url, "jobs", "cancel", "mlp", "--now")
    assert code == 2 and "cannot become cancelled: that state is final" in err


def test_a_job_cancelled_while_it_starts_has_its_instance_stopped(world: World, tmp_path: Path) -> None:
    world.prices(*world.markets.history())
    jobstore.submit(world.db, world.markets.job_yaml(tmp_path))
    world.hold("mlp", 0)  # up, but no progress: the start waits at its confirm step
    world.daemon.tick()
    (start,) = world.moves()
    assert (start.kind, start.step, start.outcome) == ("start", "confirm", None)
    assert world.job().state == "launching"
    (placement,) = world.placements()
    assert world.provider.status(placement.instance_id or "").state.is_live
    jobstore.cancel(world.db, "mlp", "not needed")
    world.daemon.tick()
    (start,) = world.moves()
    assert start.outcome == "aborted" and "cancelled" in (start.detail or "")
    (placement,) = world.placements()
    assert placement.state == "ended" and world.job().state == "cancelled"
    assert not world.provider.status(placement.instance_id or "").state.is_live


class RefusedIn(LocalProvider):
    """The local provider, except that one zone refuses every launch with ``error`` (no
    capacity, as a cloud's error says, or any other provider error: an Azure NIC whose subnet
    is in another region, a quota, an image the region lacks)."""

    def __init__(self, state_dir: Path, zone: str, error: Exception) -> None:
        super().__init__(state_dir, grace_s=5.0)
        self.zone, self.error = zone, error

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        if market.zone == self.zone:
            raise self.error
        return super().launch(spec, market, idempotency_key)


def test_no_capacity_aborts_the_move_and_the_job_keeps_running(db: Database, tmp_path: Path) -> None:
    world = make_world(db, tmp_path)
    no_capacity = CapacityUnavailableError("InsufficientInstanceCapacity in us-east-1b")
    provider = RefusedIn(tmp_path / "local", "us-east-1b", no_capacity)
    world.provider = provider
    world.daemon = Daemon(db, provider, world.settings, agent_env=AGENT_ENV)
    try:
        world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
        jobstore.submit(db, job_yaml(tmp_path))
        started(world, 30)
        world.prices(spot("us-east-1b", 0.3, now()))
        world.daemon.tick()
        move = world.moves()[-1]
        assert (move.kind, move.outcome) == ("move", "aborted") and "no capacity" in (move.detail or "")
        first, refused = world.placements()
        assert (first.state, refused.state, refused.end_reason) == ("running", "failed", "capacity")
        assert world.job().state == "running"
        # Both launch attempts are capacity observations of the daemon: 1 of 1, then 0 of 1.
        assert [(z, s, up, n, of) for z, _t, s, up, n, of in stored_capacity(db)] == [
            ("us-east-1a", "daemon", True, 1, 1),
            ("us-east-1b", "daemon", False, 0, 1),
        ]
        (launched, refused_at) = (t for _z, t, *_ in stored_capacity(db))
        assert launched == first.started_at and refused_at > launched
        # The refused market is left out for a while: the next round does not try it again.
        assert world.daemon.tick().decisions == []
    finally:
        world.stop_all()


def test_reconcile_terminates_only_this_database_s_instances_no_placement_owns(
    world: World, tmp_path: Path
) -> None:
    def launch(key: str, **tags: str) -> str:
        spec = LaunchSpec("ghost", 1, ("sleep", "600"), f"file://{tmp_path}/s", tags=tags)
        return world.provider.launch(spec, spot("us-east-1a", 1.0, now()).market, key).instance_id

    leaked = launch("ghost-m9", **{"spotopt:job": "ghost", DATABASE_TAG: database_id_of(world.db)})
    # another database's daemon on the same account: its instances are not this one's to end
    theirs = launch("ghost-m10", **{"spotopt:job": "ghost", DATABASE_TAG: "another-database"})
    untagged = launch("not-ours")
    report = world.daemon.tick()
    assert report.leaked == [leaked]
    assert [(row["instance"], row["action"]) for row in report.swept] == [(leaked, "terminated")]
    assert not world.provider.status(leaked).state.is_live
    assert world.provider.status(theirs).state.is_live
    assert world.provider.status(untagged).state.is_live  # launched outside the daemon


def test_a_price_spike_stops_the_job_at_the_next_poll(world: World, tmp_path: Path) -> None:
    world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    jobstore.submit(world.db, job_yaml(tmp_path, budget=5.0))
    started(world, 30)
    world.prices(spot("us-east-1a", 3600.0, now()))  # $1 a second: one more period would pass $5
    world.daemon.poll()
    move = world.moves()[-1]
    assert move.kind == "stop" and move.then_state == "over-budget" and move.reason.startswith("budget:")
    world.until("the stop", lambda: world.job().state == "over-budget")


class OnTheMarketsMachine(LocalProvider):
    """A local provider that stands for the market's own machine, so measured steps/s count."""

    runs_on_market = True


def test_measured_steps_per_second_become_a_measured_throughput(db: Database, tmp_path: Path) -> None:
    world = make_world(db, tmp_path)
    world.provider = OnTheMarketsMachine(tmp_path / "local", grace_s=5.0)
    world.daemon = Daemon(db, world.provider, world.settings, agent_env=AGENT_ENV)
    try:
        world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
        jobstore.submit(db, job_yaml(tmp_path, step_delay=0.02))
        started(world, 60)
        world.hold("mlp", 390)  # ~7 s of steady progress, never finishing, for the heartbeats to measure
        world.until("a measured figure", lambda: _measured(db) is not None)
        figure = _measured(db)
        assert figure is not None and figure.gpu_model.startswith("V100") and figure.gpu_count == 1
        assert figure.steps_per_s > 0
    finally:
        world.stop_all()


def _measured(db: Database) -> Throughput | None:
    with db.session() as session:
        row = session.query(Throughput).filter_by(workload="mlp", source="measured").one_or_none()
        if row is not None:
            session.expunge(row)
        return row


def test_a_market_that_refuses_launches_sits_out_and_the_job_starts_elsewhere(
    db: Database, tmp_path: Path
) -> None:
    world = make_world(db, tmp_path)
    provider = RefusedIn(
        tmp_path / "local", "us-east-1a", ProviderError("SubnetNotInSameRegion in us-east-1a")
    )
    world.provider = provider
    world.daemon = Daemon(db, provider, world.settings, agent_env=AGENT_ENV)
    try:
        world.prices(spot("us-east-1a", 0.3, a_day_ago()), spot("us-east-1b", 0.9, a_day_ago()))
        jobstore.submit(db, job_yaml(tmp_path))
        world.hold("mlp", 30)
        world.daemon.tick()  # the cheapest market refuses: the start fails
        (failed,) = world.moves()
        assert failed.outcome == "failed" and "SubnetNotInSameRegion" in (failed.detail or "")
        world.daemon.tick()  # that market sits out: the next round starts the job on the other
        world.until("the job to start elsewhere", lambda: world.job().state == "running")
        assert world.placements()[-1].state == "running"
        assert "us-east-1b" in world.moves()[-1].reason
        # A refusal for another reason than capacity says nothing about capacity: not recorded.
        assert [(z, up) for z, _t, _s, up, *_ in stored_capacity(db)] == [("us-east-1b", True)]
    finally:
        world.stop_all()


class CredentialsGone(LocalProvider):
    """A provider whose credentials expired after the daemon started."""

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        raise MissingCredentials("aws", "configure AWS credentials")


def test_a_launch_without_credentials_fails_the_move_not_the_round(db: Database, tmp_path: Path) -> None:
    world = make_world(db, tmp_path, provider=CredentialsGone(tmp_path / "local"))
    world.prices(spot("us-east-1a", 0.9, a_day_ago()), on_demand(3.06, a_day_ago()))
    jobstore.submit(db, job_yaml(tmp_path))
    report = world.daemon.tick()
    (move,) = world.moves()
    assert (
        report.opened == [move.id] and move.outcome == "failed" and "AWS credentials" in (move.detail or "")
    )
    assert world.job().state == "pending" and world.placements()[0].state == "failed"


def test_a_notice_is_acted_on_at_the_next_poll_not_the_next_tick(world: World, tmp_path: Path) -> None:
    world.prices(*world.markets.history())
    jobstore.submit(world.db, world.markets.job_yaml(tmp_path))
    started(world, 120)
    (first,) = world.placements()
    assert first.instance_id is not None
    ticks = _ticks(world.db)
    noticed_at = now()
    assert isinstance(world.provider, LocalProvider)
    world.provider.notify(first.instance_id, 30.0)
    job = world.job()
    world.until(
        "the agent to stop on the notice",
        lambda: _stopping(job_location(job), "mlp", first.epoch),
        poll=False,
    )
    world.daemon.poll()  # one poll: the recovery is opened and its instance launched
    recover = world.moves()[-1]
    assert (recover.kind, recover.reason.split(":")[0]) == ("recover", "preempted")
    new = world.placements()[-1]
    assert new.id != first.id and new.state == "running" and new.started_at is not None
    print(f"notice to new placement launched: {(new.started_at - noticed_at).total_seconds():.2f} s")
    world.hold("mlp", 300)
    world.until("the recovery", lambda: world.moves()[-1].outcome is not None)
    assert world.moves()[-1].outcome == "done" and world.moves()[-1].checkpoint_step == 120
    assert _ticks(world.db) == ticks  # no planning round was needed
    assert world.placements()[0].end_reason == "noticed"  # a preemption, in the lifetimes too
    with world.db.session() as session:
        life = session.query(InstanceLifetime).filter_by(instance_ref=first.key).one()
        assert life.end_reason == "preempted"
    world.release("mlp")
    world.until("the job to finish", lambda: world.job().state == "done")
    assert np.array_equal(np.load(tmp_path / "mlp-out" / "weights.npy"), uninterrupted_weights(tmp_path))


def _ticks(db: Database) -> int:
    with db.session() as session:
        return session.query(DaemonTick).count()


def _stopping(loc: Location, name: str, epoch: int) -> bool:
    beat = read_heartbeat(loc, name, epoch)
    return beat is not None and beat.state in (AgentState.STOPPING, AgentState.STOPPED)


def test_a_launch_refused_for_capacity_starts_on_the_next_market_in_the_same_round(
    db: Database, tmp_path: Path
) -> None:
    world = make_world(db, tmp_path)
    no_capacity = CapacityUnavailableError("InsufficientInstanceCapacity in us-east-1b")
    world.provider = RefusedIn(tmp_path / "local", "us-east-1b", no_capacity)
    world.daemon = Daemon(db, world.provider, world.settings, agent_env=AGENT_ENV)
    try:
        world.prices(
            spot("us-east-1a", 0.9, a_day_ago()),
            spot("us-east-1b", 0.3, a_day_ago()),
            on_demand(3.06, a_day_ago()),
        )
        jobstore.submit(db, job_yaml(tmp_path))
        world.hold("mlp", 30)
        report = world.daemon.tick()
        assert [(d["kind"], "/us-east-1b/" in d["to"]) for d in report.decisions] == [
            ("start", True),
            ("start", False),
        ]
        assert "/us-east-1a/" in report.decisions[1]["to"]
        refused, started_ = world.moves()
        assert refused.outcome == "failed" and (refused.detail or "").startswith("no capacity")
        assert world.placements()[-1].state == "running" and "us-east-1a" in started_.reason
        assert [(z, up) for z, _t, _s, up, *_ in stored_capacity(db)] == [
            ("us-east-1a", True),
            ("us-east-1b", False),
        ]
        world.until("the job to run", lambda: world.job().state == "running")
    finally:
        world.stop_all()


def test_the_daemon_decides_with_the_capacity_it_observed(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The core gets the capacity recorded before now, sampled at the planning period, as the
    # what-if's ``spotopt`` strategy gets it (``Availability.known``): here spot refused a launch
    # every hour for two days, then nothing was recorded for the last three hours.
    world = make_world(db, tmp_path)
    world.prices(spot("us-east-1a", 0.9, a_day_ago() - timedelta(days=2)), on_demand(3.06, a_day_ago()))
    jobstore.submit(db, job_yaml(tmp_path, deadline="12h"))
    settings = DaemonSettings(period_h=1.0, guardrails=Guardrails(min_dwell_h=0.0))
    at = now()
    dry = Daemon(db, None, settings, clock=lambda: at)
    seen: list[Any] = []
    monkeypatch.setattr(daemon_module, "decide", lambda _s, opts, *_a: seen.append(opts.availability) or [])
    dry.tick()
    assert seen == [None]  # nothing observed: every priced market is taken as available
    with db.session() as session:
        spot_id = session.scalar(select(Market.id).where(Market.kind == MarketKind.SPOT))
        assert spot_id is not None
        for hours in range(50, 2, -1):
            record_capacity(session, spot_id, at - timedelta(hours=hours, minutes=30), available=False)
        record_capacity(session, spot_id, at - timedelta(hours=2, minutes=30), available=True)
    dry.tick()
    av = seen[-1]
    assert av is not None and av.step_h == 1.0 and not av.refused.any()
    spot_row = int(np.flatnonzero(av.observed)[0])
    assert av.observed.tolist().count(True) == 1
    # Each step holds what was recorded before it: out ... out, then the last record (up).
    assert av.history[spot_row, -3:].tolist() == [1.0, 1.0, 1.0]
    assert av.history[spot_row, -5:-3].tolist() == [0.0, 0.0]
    assert np.isnan(av.history[spot_row, :-52]).all() and (av.history[spot_row, -51:-3] == 0).all()
