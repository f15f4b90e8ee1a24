"""A small world for the daemon's tests: a price history, the example training job submitted as a
managed job, a provider (the local one by default: real processes) and a daemon driven round
by round.

The job is held at a step (``train_numpy.py --until-file``) so that what the test checks
happens while it runs, whatever the machine's speed; the test releases it to finish. Waiting is
always for a condition, with a generous limit that only a broken build reaches.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from sqlalchemy import select

from spotopt.clouds.common.base import Provider
from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import JobMove, ManagedJob, Placement
from spotopt.decide.guardrails import Guardrails
from spotopt.history.ingest import run_ingest
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.mover.executor import Timeouts
from spotopt.types import MarketKey, MarketKind, PriceObservation

TRAIN = Path(__file__).resolve().parents[1] / "data" / "examples" / "train_numpy.py"
STEPS = 400
AGENT_ENV = {
    "SPOTOPT_POLL_EVERY": "0.1s",
    "SPOTOPT_HEARTBEAT_EVERY": "0.1s",
    "SPOTOPT_CHECKPOINT_EVERY": "1h",
}
WAIT_LIMIT_S = 300.0
PERIOD_H = 5 / 3600


def spot(
    zone: str, usd: float, at: datetime, itype: str = "p3.2xlarge", cloud: str = "aws"
) -> PriceObservation:
    return PriceObservation(MarketKey(cloud, "us-east-1", zone, itype, MarketKind.SPOT), at, usd)


def on_demand(usd: float, at: datetime, itype: str = "p3.2xlarge") -> PriceObservation:
    return PriceObservation(MarketKey("aws", "us-east-1", None, itype, MarketKind.ON_DEMAND), at, usd)


V100_MARKETS = {
    "gcp": ("us-central1", "n1-standard-8+1xnvidia-tesla-v100"),
    "azure": ("eastus", "Standard_NC6s_v3"),
}
"""Each cloud's V100 type (GCP's an N1 with one attached GPU) in the region its scenarios use."""


def v100_price(
    cloud: str, zone: str | None, usd: float, at: datetime, kind: MarketKind = MarketKind.SPOT
) -> PriceObservation:
    """A price of ``cloud``'s V100 in its region of ``V100_MARKETS`` (``zone`` None: region-wide;
    GCP and Azure price per region, their zonal markets stand for where a VM is placed)."""
    region, instance_type = V100_MARKETS[cloud]
    return PriceObservation(MarketKey(cloud, region, zone, instance_type, kind), at, usd)


@dataclass(frozen=True)
class Markets:
    """Where a scenario plays: the job's cloud and type, the history it starts from (a spot
    market at $0.90/h and an on-demand one at $3.06/h, a day old) and the spot market that
    becomes cheaper ($0.30/h) and draws the move."""

    cloud: str
    instance_type: str
    start: Callable[[datetime], list[PriceObservation]]
    cheaper: Callable[[datetime], PriceObservation]

    def history(self) -> list[PriceObservation]:
        return self.start(a_day_ago())

    def drop(self) -> PriceObservation:
        return self.cheaper(now())

    def job_yaml(self, tmp: Path) -> Path:
        return job_yaml(tmp, clouds=f"[{self.cloud}]", instance_types=f"[{self.instance_type}]")


OD = MarketKind.ON_DEMAND
AWS = Markets(
    "aws",
    "p3.2xlarge",
    lambda at: [spot("us-east-1a", 0.9, at), on_demand(3.06, at)],
    lambda at: spot("us-east-1b", 0.3, at),
)
GCP = Markets(
    "gcp",
    V100_MARKETS["gcp"][1],
    lambda at: [v100_price("gcp", "us-central1-a", 0.9, at), v100_price("gcp", None, 3.06, at, OD)],
    lambda at: v100_price("gcp", "us-central1-b", 0.3, at),
)
AZURE = Markets(
    "azure",
    V100_MARKETS["azure"][1],
    lambda at: [v100_price("azure", "1", 0.9, at), v100_price("azure", None, 3.06, at, OD)],
    lambda at: v100_price("azure", "2", 0.3, at),
)


def job_yaml(
    tmp: Path,
    name: str = "mlp",
    budget: float = 100.0,
    deadline: str | None = None,
    markets: str = "[spot, on-demand]",
    log: Path | None = None,
    clouds: str = "[aws]",
    instance_types: str = "[p3.2xlarge]",
    step_delay: float = 0.0,
    script: Path = TRAIN,
) -> Path:
    """The example NumPy job (or ``script``, taking the same options) as a managed job: 400
    real steps that the planner believes take hours (``throughput`` is per hour-ish), so moving
    pays in its eyes. ``log``: every placement appends ``<step> <loss hex> <epoch>`` there (the
    fault-injection tests read it)."""
    out = tmp / f"{name}-out"
    until = f"{tmp / name}.until" + (f" --log {log}" if log is not None else "")
    until += f" --step-delay {step_delay}" if step_delay else ""
    lines = [
        "jobs:",
        f"  - name: {name}",
        "    throughput: {V100: 0.02}",
        f"    work: {{steps: {STEPS}}}",
        "    restart_s: 10",
        "    checkpoint_s: 1",
        f"    run: {sys.executable} {script} --steps {STEPS} --out {out} --until-file {until}",
        f"    checkpoint: {{uri: {tmp / 'store'}}}",
        f"    budget_usd: {budget}",
        f"    allow: {{clouds: {clouds}, markets: {markets}, instance_types: {instance_types}}}",
    ]
    if deadline:
        lines.append(f"    deadline: {deadline}")
    path = tmp / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@dataclass
class World:
    db: Database
    tmp: Path
    provider: Provider
    daemon: Daemon
    settings: DaemonSettings = field(default_factory=DaemonSettings)
    preempt: Callable[[str], None] = lambda instance_id: None
    """The market takes ``instance_id`` back, notice first (the provider's own way)."""
    markets: Markets = AWS

    def hold(self, name: str, step: int) -> None:
        (self.tmp / f"{name}.until").write_text(str(step), encoding="utf-8")

    def release(self, name: str) -> None:
        (self.tmp / f"{name}.until").unlink(missing_ok=True)

    def prices(self, *records: PriceObservation) -> None:
        run_ingest(self.db, "test", "test", list(records))

    def job(self, name: str = "mlp") -> ManagedJob:
        return jobstore.get_job(self.db, name)

    def placements(self, name: str = "mlp") -> list[Placement]:
        with self.db.session() as session:
            job = session.scalar(select(ManagedJob).where(ManagedJob.name == name))
            assert job is not None
            return list(
                session.scalars(select(Placement).where(Placement.job_id == job.id).order_by(Placement.id))
            )

    def moves(self, name: str = "mlp") -> list[JobMove]:
        with self.db.session() as session:
            job = session.scalar(select(ManagedJob).where(ManagedJob.name == name))
            assert job is not None
            return list(session.scalars(select(JobMove).where(JobMove.job_id == job.id).order_by(JobMove.id)))

    def until(self, what: str, condition: Callable[[], bool], poll: bool = True) -> None:
        """Run the daemon's poll round until ``condition`` holds (a broken build hits the limit)."""
        deadline = time.monotonic() + WAIT_LIMIT_S
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}; state {self.job().state}")
            if poll:
                self.daemon.poll()
            time.sleep(0.05)

    def stop_all(self) -> None:
        for instance in self.provider.list_instances():
            self.provider.terminate(instance.instance_id)


def make_world(
    db: Database,
    tmp: Path,
    guard: Guardrails | None = None,
    provider: Provider | None = None,
    preempt: Callable[[str], None] | None = None,
    agent_env: dict[str, str] | None = None,
    markets: Markets = AWS,
    clock: Callable[[], datetime] | None = None,
) -> World:
    """The world on ``provider`` (default: the local provider, whose ``preempt`` gives the
    notice and kills 30 s later); ``agent_env`` adds to ``AGENT_ENV``; ``markets``: where the
    shared scenarios play; ``clock``: the daemon's (default: the wall clock)."""
    local = LocalProvider(tmp / "local", grace_s=5.0)
    provider = provider or local
    settings = DaemonSettings(
        period_h=PERIOD_H,
        guardrails=guard or Guardrails(min_dwell_h=0.0, period_h=PERIOD_H),
        timeouts=Timeouts(launch_s=300.0, stop_s=300.0, unavailable_s=600.0),
    )
    daemon = Daemon(db, provider, settings, clock=clock or now, agent_env={**AGENT_ENV, **(agent_env or {})})
    return World(db, tmp, provider, daemon, settings, preempt or (lambda i: local.preempt(i, 30.0)), markets)


def now() -> datetime:
    return datetime.now(UTC)


def a_day_ago() -> datetime:
    return now() - timedelta(days=1)


def uninterrupted_weights(tmp: Path) -> np.ndarray:
    """The example job run start to end with no agent interference: the reference result."""
    import os
    import subprocess

    out = tmp / "reference"
    # The same environment as the managed run (BLAS threads change float sums), minus the agent's.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTOPT_")}
    env["SPOTOPT_CHECKPOINT_URI"] = f"file://{tmp / 'reference-store'}"
    subprocess.run(
        [sys.executable, str(TRAIN), "--steps", str(STEPS), "--out", str(out)], check=True, env=env, cwd=tmp
    )
    return np.load(out / "weights.npy")
