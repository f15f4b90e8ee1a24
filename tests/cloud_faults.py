"""A fault run of the daemon on one cloud's documented fake: nothing of ours may be left billing.

The daemon runs the example job on the real provider of one cloud (behind the ``clouds``
router, as ``spotopt daemon run --provider clouds`` runs it) against that cloud's fake, which
behaves as the cloud's documentation says (``tests.fake_ec2.DocumentedEc2``,
``tests.gcp_fake``, ``tests.azure_fake``). No process runs on the fake VMs: a stand-in agent
writes the heartbeats a live VM's agent would write. The clock is the run's own, moved on five
minutes a round, so every time limit passes when the round says so.

Every round draws (from a seeded ``random.Random``: a run never depends on luck) what goes
wrong next: the guest powers a VM off (its job ended; on Azure the VM stays allocated and
billed), the market evicts a VM (on Azure its NIC stays), the API answers server errors or
rate limits, EC2 does not show a fresh instance yet, and the daemon process dies at a journaled
step (before or after the call: "between launch and record" among them) and a new one, with
new provider objects, carries on. At the end the job is cancelled, the daemon settles, and the
cloud must hold nothing of ours that bills: no instance, disk, NIC (its subnet address) or IP.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import select

from spotopt.checkpoints import AgentState, Heartbeat, write_heartbeat
from spotopt.clouds.common.base import Provider
from spotopt.clouds.common.router import CloudsProvider, split_id
from spotopt.db.engine import Database
from spotopt.db.models import ManagedJob, Placement
from spotopt.decide.guardrails import Guardrails
from spotopt.errors import SpotoptError
from spotopt.history.ingest import run_ingest
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.mover.executor import Timeouts, job_location
from tests.mover_world import V100_MARKETS, Markets

ROUND = timedelta(minutes=5)
PERIOD_H = ROUND.total_seconds() / 3600
TIMEOUTS = Timeouts(launch_s=900.0, stop_s=600.0, unavailable_s=1800.0)


class Crash(BaseException):
    """The daemon process dies here (SIGKILL): a ``BaseException``, so no ``except Exception``
    of the daemon journals or cleans up anything, exactly as after a real kill."""


@dataclass
class Fleet:
    """One cloud's fake as the run drives it; instance ids are the cloud provider's own."""

    markets: Markets
    provider: Callable[[], Provider]
    """A new provider object: a restarted daemon builds its own, remembering nothing."""
    up: Callable[[], set[str]]
    """The instances whose VM is up (its agent would write heartbeats)."""
    power_off: Callable[[str], None]
    evict: Callable[[str], None]
    api_faults: Callable[[random.Random], None]
    """Script transient API faults (server errors, rate limits) for the next calls."""
    billing: Callable[[], list[str]]
    """What of ours the cloud still bills."""


@dataclass
class Clock:
    now: datetime = field(default_factory=lambda: datetime.now(UTC))

    def __call__(self) -> datetime:
        return self.now


def _job_yaml(tmp: Path, markets: Markets) -> str:
    return "\n".join(
        [
            "jobs:",
            "  - name: mlp",
            "    throughput: {V100: 0.02}",
            "    work: {steps: 1000000000}",
            "    restart_s: 10",
            "    checkpoint_s: 1",
            "    run: python train.py",
            f"    checkpoint: {{uri: {tmp / 'store'}}}",
            "    budget_usd: 1000",
            f"    allow: {{clouds: [{markets.cloud}], markets: [spot, on-demand], "
            f"instance_types: [{markets.instance_type}]}}",
        ]
    )


def start(db: Database, tmp: Path, fleet: Fleet) -> None:
    """The markets' history and the job, submitted."""
    run_ingest(db, "test", "test", fleet.markets.history())
    jobstore.submit(db, _job_yaml(tmp, fleet.markets))


def daemon_on(
    db: Database, fleet: Fleet, clock: Clock, failpoint: Callable[[str, str], None] | None = None
) -> Daemon:
    """A daemon process on ``fleet``: a new provider object behind the ``clouds`` router."""
    own = fleet.provider()
    cloud = fleet.markets.cloud
    region = V100_MARKETS.get(cloud, ("us-east-1",))[0]
    router = CloudsProvider(regions={cloud: [region]}, build=lambda c, s, r: own)
    router.runs_on_market = False  # no GPU behind a fake VM: no throughput to learn
    settings = DaemonSettings(
        period_h=PERIOD_H, guardrails=Guardrails(min_dwell_h=0.0, period_h=PERIOD_H), timeouts=TIMEOUTS
    )
    return Daemon(db, router, settings, clock=clock, failpoint=failpoint)


def play(
    db: Database, tmp: Path, fleet: Fleet, seed: int, rounds: int = 30
) -> tuple[list[str], dict[str, int]]:
    """The run (module doc); what the cloud bills at the end and how often each fault struck."""
    rng = random.Random(seed)
    clock = Clock()
    start(db, tmp, fleet)
    struck: dict[str, int] = {}

    def failpoint(key: str, phase: str) -> None:
        if rng.random() < 0.08:
            point = f"crash {key.split(':')[1]} {phase}"
            struck[point] = struck.get(point, 0) + 1
            raise Crash(point)

    current = daemon_on(db, fleet, clock, failpoint)
    for _ in range(rounds):
        clock.now += ROUND
        beat(db, fleet, clock.now)
        fault = rng.choice(["none", "none", "power-off", "evict", "api"])
        live = sorted(fleet.up())
        if fault in ("power-off", "evict") and live:
            (fleet.power_off if fault == "power-off" else fleet.evict)(rng.choice(live))
        elif fault == "api":
            fleet.api_faults(rng)
        struck[fault] = struck.get(fault, 0) + 1
        try:
            current.tick()
            current.poll()
        except (Crash, SpotoptError):  # a killed daemon, or a round that failed: a new process
            current = daemon_on(db, fleet, clock, failpoint)
    jobstore.cancel(db, "mlp", "the fault run is over", clock.now)
    settled = daemon_on(db, fleet, clock)
    for _ in range(12):
        clock.now += ROUND
        settled.tick()
        settled.poll()
    return fleet.billing(), struck


def beat(db: Database, fleet: Fleet, now: datetime) -> None:
    """The stand-in agent: a RUNNING heartbeat, one step further, for each running placement
    whose VM is up."""
    up = fleet.up()
    with db.session() as session:
        job = session.scalar(select(ManagedJob).where(ManagedJob.name == "mlp"))
        assert job is not None
        running = session.scalars(
            select(Placement).where(Placement.job_id == job.id, Placement.state == "running")
        ).all()
        session.expunge_all()
    for placement in running:
        parts = split_id(placement.instance_id or "")
        if parts is not None and parts[1] in up:
            step = int(now.timestamp() // ROUND.total_seconds())  # one step a round, ever higher
            beat = Heartbeat("mlp", placement.epoch, AgentState.RUNNING, step, 1.0, None, None, now)
            write_heartbeat(job_location(job), beat)
