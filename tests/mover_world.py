"""A small world for the daemon's tests: a price history, the example training job submitted as a
managed job, the local provider (real processes) and a daemon driven round by round.

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

from spotopt.db.engine import Database
from spotopt.db.models import JobMove, ManagedJob, Placement
from spotopt.ingest import run_ingest
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon, DaemonSettings
from spotopt.mover.executor import Timeouts
from spotopt.mover.guardrails import Guardrails
from spotopt.providers.local import LocalProvider
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


def job_yaml(
    tmp: Path,
    name: str = "mlp",
    budget: float = 100.0,
    deadline: str | None = None,
    markets: str = "[spot, on-demand]",
) -> Path:
    """The example NumPy job as a managed job: 400 real steps that the planner believes take
    hours (``throughput`` is per hour-ish), so moving pays in its eyes."""
    out = tmp / f"{name}-out"
    lines = [
        "jobs:",
        f"  - name: {name}",
        "    throughput: {V100: 0.02}",
        f"    work: {{steps: {STEPS}}}",
        "    restart_s: 10",
        "    checkpoint_s: 1",
        f"    run: {sys.executable} {TRAIN} --steps {STEPS} --out {out} --until-file {tmp / name}.until",
        f"    checkpoint: {{uri: {tmp / 'store'}}}",
        f"    budget_usd: {budget}",
        f"    allow: {{clouds: [aws], markets: {markets}, instance_types: [p3.2xlarge]}}",
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
    provider: LocalProvider
    daemon: Daemon
    settings: DaemonSettings = field(default_factory=DaemonSettings)

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


def make_world(db: Database, tmp: Path, guard: Guardrails | None = None) -> World:
    provider = LocalProvider(tmp / "local", grace_s=5.0)
    settings = DaemonSettings(
        period_h=PERIOD_H,
        guardrails=guard or Guardrails(min_dwell_h=0.0, period_h=PERIOD_H),
        timeouts=Timeouts(launch_s=300.0, stop_s=300.0, unavailable_s=600.0),
    )
    daemon = Daemon(db, provider, settings, agent_env=AGENT_ENV)
    return World(db, tmp, provider, daemon, settings)


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
