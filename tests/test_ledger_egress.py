"""The ledger bills data egress (issue 13 follow-up): the executor records, when a move grants
the lease to the new epoch, what entering the new placement transferred, priced by the one egress
rule (``spotopt.decide.egress.entry_usd``); the ledger, the budget checks and ``jobs cost``/``show``
count it. On SQLite and PostgreSQL."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import select

from spotopt.checkpoints.store import checkpoint_name
from spotopt.clouds.common.base import Instance, InstanceState, InstanceStatus, LaunchSpec, market_label
from spotopt.db.engine import Database
from spotopt.db.models import InstanceType, JobMove, JournalEntry, ManagedJob, Market, Placement
from spotopt.decide.egress import entry_usd, transfer_matrix
from spotopt.mover import jobs as jobstore
from spotopt.mover import ledger
from spotopt.mover.executor import Executor
from spotopt.types import MarketKey
from tests.helpers import cli, ingest, price, strict_json
from tests.mover_rows import AWS_V100, JOB, T0, place, seed_markets, submit

SPEC = JOB.rstrip() + "\n    checkpoint_gb: 2\n    dataset: {gb: 150, cloud: aws, region: us-east-1}\n"
"""resnet with a 2 GB checkpoint and a 150 GB dataset living in AWS us-east-1."""
AT = T0 + timedelta(hours=2)
EAST, WEST, AZURE = ("aws", "us-east-1"), ("aws", "us-west-2"), ("azure", "eastus")


def world(db: Database, tmp_path: Path, spec: str = SPEC) -> int:
    """The markets of ``seed_markets`` plus AWS spot in us-west-2, and resnet submitted."""
    seed_markets(db)
    ingest(db, [price(AWS_V100, "2026-03-01 11:00", 0.95, region="us-west-2", zone="us-west-2a")])
    return submit(db, tmp_path, spec)


def market(db: Database, cloud: str, region: str, kind: str = "spot") -> int:
    with db.session() as session:
        found = session.scalar(
            select(Market.id)
            .join(InstanceType, InstanceType.id == Market.instance_type_id)
            .where(InstanceType.cloud == cloud, Market.region == region, Market.kind == kind)
        )
    assert found is not None
    return found


def at_grant(
    db: Database,
    job: int,
    kind: str,
    to_market: int,
    epoch: int,
    *,
    old: int | None = None,
    new: int | None = None,
    checkpoint: str | None = None,
) -> int:
    """A move standing at its ``grant`` step, as the executor leaves it there."""
    with db.session() as session:
        row = JobMove(
            job_id=job,
            kind=kind,
            reason="test",
            step="grant",
            from_placement_id=old,
            to_placement_id=new,
            market_id=to_market,
            gpus=1,
            instances=1.0,
            usd_per_hour=0.6,
            epoch=epoch,
            checkpoint_name=checkpoint,
            created_at=AT,
            updated_at=AT,
        )
        session.add(row)
        stored = session.get(ManagedJob, job)
        assert stored is not None
        stored.epoch = epoch
        session.flush()
        return row.id


def record(db: Database, move_id: int) -> ledger.Egress:
    """What the executor's grant step does first: price and record the move's entry egress."""
    with db.session() as session:
        row = session.get(JobMove, move_id)
        assert row is not None
        managed = session.get(ManagedJob, row.job_id)
        assert managed is not None
        spec = jobstore.job_spec(managed)
        return ledger.record_entry_egress(session, move_id, spec, AT)


def expected(here: tuple[str, str] | None, dest: tuple[str, str], home: tuple[str, str] | None) -> float:
    """``entry_usd`` on its own terms: a transfer matrix over the three places, the job's sizes."""
    locations = [EAST, WEST, AZURE]
    return float(
        entry_usd(
            transfer_matrix(locations, AT),
            np.array(locations.index(here) if here else -1),
            np.array(locations.index(dest)),
            np.array(2.0),
            np.array(150.0),
            np.array(locations.index(home) if home else -1),
        )
    )


def moved(db: Database, tmp_path: Path, to: tuple[str, str], kind: str = "spot") -> tuple[int, int, int]:
    """resnet ran on AWS us-east-1a spot (epoch 1, checkpointed at step 150) and moves to ``to``:
    (job, the new placement, the move at its grant step)."""
    job = world(db, tmp_path)
    return (job, *moving(db, job, to, kind))


def moving(db: Database, job: int, to: tuple[str, str], kind: str = "spot") -> tuple[int, int]:
    """Job ``job`` ran in us-east-1 (epoch 1, checkpointed at step 150) and moves to ``to``: the
    new placement and the move at its grant step."""
    old = place(db, job, market(db, *EAST), T0, AT, "terminated", epoch=1)
    target = market(db, *to, kind=kind)
    new = place(db, job, target, AT - timedelta(minutes=5), None, epoch=2, usd_per_hour=0.6)
    return new, at_grant(db, job, "move", target, 2, old=old, new=new, checkpoint=checkpoint_name(150, 1))


@pytest.mark.parametrize(
    ("to", "usd", "gb"),
    [
        # AWS internet egress $0.09/GB: the checkpoint, and the dataset Azure has no copy of
        (AZURE, 2 * 0.09 + 150 * 0.09, 152.0),
        # AWS inter-region $0.02/GB: the same transfers within one cloud
        (WEST, 2 * 0.02 + 150 * 0.02, 152.0),
    ],
)
def test_a_move_out_of_the_region_bills_what_entry_usd_prices(
    db: Database, tmp_path: Path, to: tuple[str, str], usd: float, gb: float
) -> None:
    job, new, move = moved(db, tmp_path, to)
    egress = record(db, move)
    assert egress.usd == expected(EAST, to, EAST)  # the one rule, to the last bit
    assert egress.usd == pytest.approx(usd)
    assert (egress.gb, egress.source, egress.dest) == (gb, "aws/us-east-1", "/".join(to))
    with db.session() as session:
        rows = {r.placement_id: r for r in ledger.intervals(session, job, AT)}
    row = rows[new]
    assert (row.egress_usd, row.egress_gb, row.egress_from, row.egress_to) == (
        egress.usd,
        gb,
        "aws/us-east-1",
        "/".join(to),
    )
    assert row.billed_usd == row.cost_usd + egress.usd
    with db.session() as session:
        assert ledger.spent_usd(session, job, AT) == ledger.total_usd(list(rows.values()))
        assert ledger.total_usd(list(rows.values())) == pytest.approx(
            sum(r.cost_usd for r in rows.values()) + usd
        )


def test_a_move_within_the_region_bills_no_egress(db: Database, tmp_path: Path) -> None:
    """Spot us-east-1a to on-demand us-east-1: the region's object storage, read for free."""
    job, _new, move = moved(db, tmp_path, EAST, kind="on-demand")
    egress = record(db, move)
    assert (egress.usd, egress.gb, egress.source, egress.dest) == (0.0, 0.0, "aws/us-east-1", "aws/us-east-1")
    with db.session() as session:
        rows = ledger.intervals(session, job, AT)
        assert ledger.total_usd(rows) == sum(r.cost_usd for r in rows)


def test_a_first_start_pays_the_dataset_but_no_checkpoint(db: Database, tmp_path: Path) -> None:
    """No checkpoint yet (``here`` -1): entering Azure moves the 150 GB dataset out of AWS, and
    entering the dataset's own region moves nothing."""
    job = world(db, tmp_path)
    azure = at_grant(db, job, "start", market(db, *AZURE), 1)
    egress = record(db, azure)
    assert egress.usd == expected(None, AZURE, EAST) == pytest.approx(150 * 0.09)
    assert (egress.gb, egress.source, egress.dest) == (150.0, None, "azure/eastus")

    (tmp_path / "home").mkdir()
    other = submit(db, tmp_path / "home", SPEC.replace("name: resnet", "name: home"))
    home = record(db, at_grant(db, other, "start", market(db, *EAST), 1))
    assert (home.usd, home.gb) == (0.0, 0.0)


def test_a_start_restores_the_checkpoint_where_its_writer_ran(db: Database, tmp_path: Path) -> None:
    """A restart (a start, no verified checkpoint on the move) restores the job's newest
    checkpoint, written by epoch 1 in us-west-2, not by epoch 2 that ran later without one."""
    job = world(db, tmp_path)
    place(db, job, market(db, *WEST), T0, T0 + timedelta(minutes=40), "preempted", epoch=1)
    place(db, job, market(db, *AZURE), T0 + timedelta(hours=1), AT, "preempted", epoch=2)
    with db.session() as session:
        stored = session.get(ManagedJob, job)
        assert stored is not None
        stored.checkpoint_name, stored.checkpoint_step = checkpoint_name(150, 1), 150
    egress = record(db, at_grant(db, job, "start", market(db, *EAST), 3))
    # the checkpoint crosses AWS regions; us-east-1 is the dataset's home
    assert egress.usd == expected(WEST, EAST, EAST) == pytest.approx(2 * 0.02)
    assert (egress.gb, egress.source) == (2.0, "aws/us-west-2")


class Killed(BaseException):
    """The daemon process dies here (not an error the executor may catch and journal)."""


class StubProvider:
    """Instances that run until terminated; nothing is started (the grant step is under test)."""

    name = "local"
    runs_on_market = False

    def __init__(self) -> None:
        self.launched: dict[str, Instance] = {}

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        instance = Instance(
            f"stub-{idempotency_key}",
            self.name,
            spec.job,
            spec.epoch,
            market_label(market),
            idempotency_key,
            AT,
        )
        self.launched.setdefault(idempotency_key, instance)
        return self.launched[idempotency_key]

    def status(self, instance_id: str) -> InstanceStatus:
        return InstanceStatus(None, instance_id, InstanceState.RUNNING)

    def terminate(self, instance_id: str) -> InstanceStatus:
        return InstanceStatus(None, instance_id, InstanceState.TERMINATED)

    def list_instances(self, job: str | None = None, tags: Mapping[str, str] | None = None) -> list[Instance]:
        return list(self.launched.values())


def executor(db: Database, kill_at: tuple[str, str] | None = None, clock: datetime = AT) -> Executor:
    def failpoint(key: str, phase: str) -> None:
        if (key, phase) == kill_at:
            raise Killed(key)

    return Executor(db, StubProvider(), clock=lambda: clock, failpoint=failpoint)


@pytest.mark.parametrize("phase", ["before", "after"])
def test_a_grant_resumed_after_a_crash_bills_its_egress_once(
    db: Database, tmp_path: Path, phase: str
) -> None:
    """The daemon dies around the grant's call (its intent committed, the result not); the next
    one resumes the step: the egress recorded before the call stands, priced as before, although
    the job reported a newer checkpoint meanwhile; the ledger counts it once."""
    job, new, move = moved(db, tmp_path, AZURE)
    with pytest.raises(Killed):
        executor(db, kill_at=(f"m{move}:grant", phase)).advance(move)
    with db.session() as session:
        first = session.get(JobMove, move)
        assert first is not None and first.step == "grant"
        assert (first.egress_usd, first.egress_to) == (expected(EAST, AZURE, EAST), "azure/eastus")
        assert (
            session.scalar(select(JournalEntry.status).where(JournalEntry.key == f"m{move}:grant"))
            == "intent"
        )
        stored = session.get(ManagedJob, job)
        assert stored is not None
        stored.checkpoint_name = checkpoint_name(160, 2)  # the new placement's, in Azure
        first.checkpoint_name = None  # re-pricing now would find it and bill nothing

    assert executor(db, clock=AT + timedelta(minutes=1)).advance(move) is False  # waits at confirm
    with db.session() as session:
        done = session.get(JobMove, move)
        assert done is not None and done.step == "confirm"
        assert (done.egress_usd, done.egress_gb, done.egress_from) == (
            expected(EAST, AZURE, EAST),
            152.0,
            "aws/us-east-1",
        )
        grants = session.scalars(select(JournalEntry.status).where(JournalEntry.action == "grant")).all()
        assert grants == ["done"]
        rows = ledger.intervals(session, job, AT)
        assert ledger.egress_usd(rows) == expected(EAST, AZURE, EAST)
        assert ledger.spent_usd(session, job, AT) == ledger.total_usd(rows)
        assert session.scalar(select(ManagedJob.placement_id).where(ManagedJob.id == job)) == new


def test_an_uninterrupted_grant_records_egress_before_the_lease_moves(db: Database, tmp_path: Path) -> None:
    """Run straight through, the grant bills the move once and a second pass changes nothing."""
    job, _new, move = moved(db, tmp_path, WEST)
    seen: list[float] = []

    def failpoint(key: str, phase: str) -> None:
        if key == f"m{move}:grant" and phase == "before":
            with db.session() as session:
                row = session.get(JobMove, move)
                assert row is not None
                seen.append(row.egress_usd)

    Executor(db, StubProvider(), clock=lambda: AT, failpoint=failpoint).advance(move)
    assert seen == [expected(EAST, WEST, EAST)]  # written before the lease moved
    assert record(db, move).usd == seen[0]  # the step run again: the same, not more
    with db.session() as session:
        assert ledger.egress_usd(ledger.intervals(session, job, AT)) == seen[0]


def test_spent_by_job_equals_spent_usd_with_egress(db: Database, tmp_path: Path) -> None:
    """The daemon's batched spend equals the per-job ledger to the last bit, egress included."""
    first, _new, move = moved(db, tmp_path, AZURE)
    record(db, move)
    jobs = [first]
    for n, to in enumerate([WEST, EAST], start=1):
        (tmp_path / f"j{n}").mkdir()
        job = submit(db, tmp_path / f"j{n}", SPEC.replace("name: resnet", f"name: job{n}"))
        record(db, moving(db, job, to, kind="on-demand" if to == EAST else "spot")[1])
        jobs.append(job)
    now = AT + timedelta(hours=1, minutes=7)
    with db.session() as session:
        batched = ledger.spent_by_job(session, [*jobs, 10**6], now)
        plain = {j: ledger.spent_usd(session, j, now) for j in jobs}
        egress = {j: ledger.egress_usd(ledger.intervals(session, j, now)) for j in jobs}
        instance = {j: sum(r.cost_usd for r in ledger.intervals(session, j, now)) for j in jobs}
    assert batched.pop(10**6) == 0.0
    assert all(plain[j] == pytest.approx(instance[j] + egress[j]) for j in jobs)
    assert batched == plain  # to the last bit
    assert egress[jobs[0]] == expected(EAST, AZURE, EAST) and egress[jobs[2]] == 0.0
    assert egress[jobs[1]] == expected(EAST, WEST, EAST)


def test_cli_jobs_cost_and_show_include_egress(db_url: str, db: Database, tmp_path: Path) -> None:
    _job, new, move = moved(db, tmp_path, AZURE)
    egress = record(db, move)
    # Ended, so that each command below bills the same (a running placement bills up to the
    # real now, a little more at each call).
    with db.session() as session:
        placement = session.get(Placement, new)
        assert placement is not None
        placement.state, placement.ended_at, placement.end_reason = "ended", AT, "terminated"
    code, out, err = cli("--db", db_url, "jobs", "cost", "resnet", "--format", "json")
    assert code == 0, err
    doc = strict_json(out)
    assert doc["egress_usd"] == pytest.approx(egress.usd)
    first, second = doc["intervals"]
    assert (first["egress_usd"], first["egress_gb"], first["egress_from"], first["egress_to"]) == (
        0,
        0,
        None,
        None,
    )
    assert (second["placement_id"], second["egress_from"], second["egress_to"]) == (
        new,
        "aws/us-east-1",
        "azure/eastus",
    )
    assert (second["egress_gb"], second["egress_usd"]) == (152.0, pytest.approx(egress.usd))
    assert doc["total_usd"] == pytest.approx(sum(i["cost_usd"] + i["egress_usd"] for i in doc["intervals"]))

    code, out, _ = cli("--db", db_url, "jobs", "cost", "resnet", "--format", "csv")
    header, *lines = out.splitlines()
    assert code == 0 and header.endswith(",cost_usd,egress_from,egress_to,egress_gb,egress_usd")
    assert lines[1].split(",")[-4:-1] == ["aws/us-east-1", "azure/eastus", "152.0"]

    code, out, _ = cli("--db", db_url, "jobs", "cost", "resnet")
    shown = re.search(r"\(egress \$([\d,.]+)\)", out)  # the column's total (render.usd_summed)
    assert code == 0 and shown is not None and "egress $" in out
    assert float(shown.group(1).replace(",", "")) == pytest.approx(egress.usd, abs=0.005)

    code, out, _ = cli("--db", db_url, "jobs", "show", "resnet", "--format", "json")
    assert code == 0 and strict_json(out)["spent_usd"] == pytest.approx(doc["total_usd"])

    # The budget checks read the same spend: a budget between the instance time and the total
    # (instance time and egress) is already spent.
    below = doc["total_usd"] - egress.usd / 2
    code, _, err = cli("--db", db_url, "jobs", "budget", "resnet", f"{below:.2f}")
    assert code == 2 and "already spent" in err


def test_a_launch_whose_egress_would_pass_the_budget_is_refused(db: Database, tmp_path: Path) -> None:
    """The launch's budget check counts the egress the move will bill at its grant: starting on
    Azure moves the 150 GB dataset out of AWS ($13.50), which a $10 budget cannot pay although
    an hour on Azure ($0.60) fits; the dataset's own region fits."""
    job = world(db, tmp_path, SPEC.replace("budget_usd: 50", "budget_usd: 10"))
    executor = Executor(db, StubProvider(), clock=lambda: AT)
    with db.session() as session:
        managed = session.get(ManagedJob, job)
        assert managed is not None
        spec = jobstore.job_spec(managed)
        session.expunge(managed)
    for where, refused in ((AZURE, True), (EAST, False)):
        move_id = at_grant(db, job, "start", market(db, *where), 1)
        with db.session() as session:
            move = session.get(JobMove, move_id)
            assert move is not None
            session.expunge(move)
        why = executor._over_budget_for(move, managed, spec)
        assert bool(why) is refused, why
        if refused:
            assert "egress would exceed budget_usd $10.00" in why
