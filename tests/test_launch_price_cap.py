"""The job's ``max_usd_per_hour`` reaches the provider as a cap on one instance's hourly price
(``LaunchSpec.max_usd_per_instance_hour``): the job's cap over its slot's share of an instance
(``move.instances``), so a cloud that enforces it (AWS ``MaxPrice``) never bills the job more
than its cap, even between two of the daemon's budget checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from spotopt.clouds.common.base import Instance, LaunchSpec
from spotopt.db.engine import Database
from spotopt.mover.executor import Executor
from spotopt.types import MarketKey
from tests.mover_rows import AWS_V100, JOB, T0, market_id, seed_markets, submit
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
        instances=instances,
        usd_per_hour=0.9 * instances,
    )
    assert move is not None
    executor.advance(move)  # grant, launch, then waits for the agent
    (launched,) = provider.specs
    assert launched.max_usd_per_instance_hour == cap
