"""The job's ``max_usd_per_hour`` reaches the provider as a cap on one instance's hourly price
(``LaunchSpec.max_usd_per_instance_hour``): the job's cap over its slot's share of an instance
(``move.instances``), so a cloud that enforces it (AWS ``MaxPrice``) never bills the job more
than its cap, even between two of the daemon's budget checks."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from spotopt.clouds.common.base import Instance, LaunchSpec
from spotopt.db.engine import Database
from spotopt.db.models import JobMove
from spotopt.mover.executor import Executor
from spotopt.mover.ledger import fleet_usd_per_hour
from spotopt.price import SlotPrice
from spotopt.types import MarketKey
from tests.helpers import ingest, price
from tests.mover_rows import AWS_V100, JOB, T0, market_id, place, seed_markets, submit
from tests.test_ledger_egress import StubProvider


class Recording(StubProvider):
    """The stub provider, keeping every launch spec it was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.specs: list[LaunchSpec] = []

    def launch(self, spec: LaunchSpec, market: MarketKey, idempotency_key: str) -> Instance:
        self.specs.append(spec)
        return super().launch(spec, market, idempotency_key)


UNCAPPED = JOB.replace("    max_usd_per_hour: 4\n", "")


@pytest.mark.parametrize(
    ("spec", "instances", "cap"),
    [
        (JOB, 1.0, 4.0),  # a whole instance: the job's cap
        (JOB, 0.25, 16.0),  # 1 of an instance's 4 GPUs: the instance may cost 4× the slot's cap
        (UNCAPPED, 1.0, None),  # no cap: the cloud's default (AWS: the on-demand price)
    ],
)
def test_the_launch_carries_the_job_s_cap_per_instance(
    sqlite_db: Database, tmp_path: Path, spec: str, instances: float, cap: float | None
) -> None:
    assert ("max_usd_per_hour: 4" in spec) == (cap is not None)
    seed_markets(sqlite_db)
    submit(sqlite_db, tmp_path, spec)
    provider = Recording()
    executor = Executor(sqlite_db, provider, clock=lambda: T0)
    move = executor.open_move(
        "resnet",
        "start",
        "test",
        market_id=market_id(sqlite_db, AWS_V100),
        gpus=1,
        price=SlotPrice.recorded(0.9 * instances, instances),
    )
    assert move is not None
    executor.advance(move)  # grant, launch, then waits for the agent
    (launched,) = provider.specs
    assert launched.max_usd_per_instance_hour == cap


def test_the_fleet_cap_counts_running_slots_at_the_price_in_effect_now(
    sqlite_db: Database, tmp_path: Path
) -> None:
    # A placement launched at $0.90/h whose market now asks $1.50/h: with a fleet cap of $2/h,
    # another $0.90/h launch is refused (the budget checks bill $1.50 for the first one, so the
    # cap must too); at launch prices ($1.80/h) it would have passed.
    seed_markets(sqlite_db)
    first = submit(sqlite_db, tmp_path, UNCAPPED)
    second = tmp_path / "second"
    second.mkdir()
    submit(sqlite_db, second, UNCAPPED.replace("name: resnet", "name: bert"))
    spot = market_id(sqlite_db, AWS_V100)
    place(sqlite_db, first, spot, T0 - timedelta(minutes=30), usd_per_hour=0.9)
    with sqlite_db.session() as session:
        assert fleet_usd_per_hour(session, T0) == pytest.approx(0.9)
    ingest(sqlite_db, [price(AWS_V100, "2026-03-01 11:50", 1.50)])
    with sqlite_db.session() as session:
        assert fleet_usd_per_hour(session, T0) == pytest.approx(1.5)
    executor = Executor(sqlite_db, Recording(), clock=lambda: T0, max_usd_per_hour=2.0)
    move = executor.open_move("bert", "start", "test", market_id=spot, gpus=1, price=SlotPrice(0.9))
    assert move is not None
    executor.advance(move)
    with sqlite_db.session() as session:
        row = session.get(JobMove, move)
        assert row is not None and row.outcome == "failed"
        assert row.detail == "budget: the fleet would spend $2.40/h, above max_usd_per_hour $2.00"
