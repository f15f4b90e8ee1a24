"""Recovery: how soon the real daemon places a preempted job again (issue 20).

A user's set-up, run for real: a fresh SQLite history with the example prices, the example
NumPy trainer submitted as a managed job, and ``spotopt daemon run --period 1h --poll P`` as
its own process on the ``local`` provider (each placement a real process group). Once the job
trains, each trial takes its instance away in one of two ways:

- ``notice``: the cloud's preemption notice (the local provider's notice file); the agent
  writes its emergency checkpoint and ends its instance, and the daemon places the job again;
- ``lost``: the instance is killed outright (SIGKILL, no notice), as a cloud that reclaims
  without warning or a machine that dies.

Per trial it reads the ledger: when the old instance was gone (its runner's exit file, or the
kill), when the daemon recorded the recovery's placement (``created_at``) and when its instance
was launched (``started_at``). The planning period is an hour, so a recovery within seconds is
the poll's, not a round's. The daemon's reaction (gone to recorded) must be within one poll
plus the decision, and the whole recovery within that plus the launch.

    python benchmarks/recovery.py [--polls 1s,5s] [--trials 5] [--kinds notice,lost] [--seed 0]
        [--format json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from sqlalchemy import select

from spotopt.clouds.local.provider import LocalProvider
from spotopt.db.engine import Database
from spotopt.db.models import ManagedJob, Placement
from spotopt.history.setup import open_history
from spotopt.settings import Settings
from spotopt.times import parse_duration

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "data" / "examples"
AGENT_POLL = "0.5s"
"""The agent's poll of notices and requests (``SPOTOPT_POLL_EVERY``; 5 s by default): the
notice's share of a recovery is the agent's, not the daemon's, and is reported apart."""
DECISION_S = 1.0
"""What a recovery may take beyond the poll to be recorded: reading the job's state and
deciding through the decision core (a fraction of a second on an idle machine)."""
JOB = """jobs:
  - name: example
    throughput: {L4: 40, A10G: 45, A100: 100}
    work: {steps: 1000000}
    restart_s: 1
    checkpoint_s: 1
    run: python train_numpy.py --steps 1000000 --step-delay 0.01 --out example-out
    checkpoint: {uri: example-checkpoints, every: 2s}
    budget_usd: 50
    retry: {max: 100}
"""


@dataclass(frozen=True)
class Trial:
    """One recovery, in seconds from the moment the instance was taken away (``t0``)."""

    poll_s: float
    kind: str
    gone_s: float
    recorded_s: float
    launched_s: float

    @property
    def reaction_s(self) -> float:
        """The daemon's share: from the instance gone to the recovery's placement recorded."""
        return self.recorded_s - self.gone_s


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--polls", default="1s,5s", help="daemon --poll values, comma-separated")
    parser.add_argument("--trials", type=int, default=5, help="recoveries per poll and kind")
    parser.add_argument("--kinds", default="notice,lost")
    parser.add_argument("--seed", type=int, default=0, help="seed of when instances are taken")
    parser.add_argument("--format", choices=("table", "json"), default="table")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    trials: list[Trial] = []
    for poll in args.polls.split(","):
        with daemon_world(poll, args.seed) as world:
            for i in range(args.trials):
                for kind in kinds:
                    trials.append(world.recover(kind))
                    _progress(f"poll {poll} {kind} {i + 1}/{args.trials}: {trials[-1].launched_s:.2f} s")
    rows = summary(trials)
    if args.format == "json":
        print(json.dumps({"trials": [asdict(t) for t in trials], "summary": rows}, indent=2))
        return
    print(
        "| daemon --poll | taken away by | trials | instance gone (s) | daemon reaction: median / max (s) "
        "| launched after: median / max (s) | within one poll + decision + launch |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['poll_s']:g} s | {r['kind']} | {r['trials']} | {r['gone_median_s']:.2f} "
            f"| {r['reaction_median_s']:.2f} / {r['reaction_max_s']:.2f} "
            f"| {r['launched_median_s']:.2f} / {r['launched_max_s']:.2f} | {'yes' if r['within'] else 'NO'} |"
        )


def summary(trials: list[Trial]) -> list[dict[str, object]]:
    """Per (poll, kind): medians and maxima, and whether every reaction was within one poll."""
    rows: list[dict[str, object]] = []
    for key in dict.fromkeys((t.poll_s, t.kind) for t in trials):
        group = [t for t in trials if (t.poll_s, t.kind) == key]
        reaction = [t.reaction_s for t in group]
        launched = [t.launched_s for t in group]
        rows.append(
            {
                "poll_s": key[0],
                "kind": key[1],
                "trials": len(group),
                "gone_median_s": statistics.median(t.gone_s for t in group),
                "reaction_median_s": statistics.median(reaction),
                "reaction_max_s": max(reaction),
                "launched_median_s": statistics.median(launched),
                "launched_max_s": max(launched),
                "within": max(reaction) <= key[0] + DECISION_S,
            }
        )
    return rows


class World:
    """A running daemon over a history of its own, and the job it manages."""

    def __init__(self, db: Database, provider: LocalProvider, poll_s: float, seed: int) -> None:
        self.db, self.provider, self.poll_s = db, provider, poll_s
        self.rng = random.Random(seed)

    def placements(self) -> list[Placement]:
        with self.db.session() as session:
            return list(session.scalars(select(Placement).order_by(Placement.id)))

    def job_state(self) -> str:
        with self.db.session() as session:
            return str(session.scalars(select(ManagedJob.state)).one())

    def training(self) -> Placement:
        """The job's placement once it runs (within 2 minutes), after a periodic checkpoint."""

        def ready() -> Placement | None:
            placements = self.placements()
            last = placements[-1] if placements else None
            if last is None or last.state != "running" or last.instance_id is None:
                return None
            home = self.provider.log_path(last.instance_id).parent
            return last if self.job_state() == "running" and (home / "pid").exists() else None

        placement = _until("the job to train on a placement", ready, 120.0)
        # A periodic checkpoint (every 2 s) to come back from, then a moment drawn over one poll:
        # the trials sample every phase of the daemon's poll, not the one the last recovery left.
        time.sleep(3.0 + self.rng.uniform(0.0, self.poll_s))
        return placement

    def recover(self, kind: str) -> Trial:
        old = self.training()
        assert old.instance_id is not None
        home = self.provider.log_path(old.instance_id).parent
        t0 = datetime.now(UTC)
        if kind == "notice":
            self.provider.notify(old.instance_id, 120.0)
        elif kind == "lost":
            self.provider.reclaim(old.instance_id)
        else:
            raise SystemExit(f"--kinds: unknown kind {kind!r}; use notice or lost")
        new = _until(
            "the recovery's placement to launch",
            lambda: next((p for p in self.placements() if p.id > old.id and p.started_at), None),
            120.0,
        )
        exit_file = home / "exit_code"
        gone = datetime.fromtimestamp(exit_file.stat().st_mtime, UTC) if exit_file.exists() else t0
        assert new.started_at is not None

        def since(at: datetime) -> float:
            return (at - t0).total_seconds()

        return Trial(self.poll_s, kind, max(since(gone), 0.0), since(new.created_at), since(new.started_at))


@contextmanager
def daemon_world(poll: str, seed: int) -> Iterator[World]:
    """A fresh history, the example prices, the job, and the daemon process (stopped after)."""
    tmp = Path(tempfile.mkdtemp(prefix="spotopt-recovery-"))
    shutil.copy(EXAMPLES / "train_numpy.py", tmp)
    (tmp / "job.yaml").write_text(JOB, encoding="utf-8")
    url = f"sqlite:///{tmp / 'history.sqlite'}"
    cli = [sys.executable, "-m", "spotopt", "--db", url]
    # The job runs ``python train_numpy.py``: the interpreter spotopt is installed in comes first.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "SPOTOPT_POLL_EVERY": AGENT_POLL}
    for step in (["import", "csv", str(EXAMPLES / "prices.csv")], ["jobs", "submit", str(tmp / "job.yaml")]):
        subprocess.run([*cli, *step], check=True, capture_output=True, env=env)
    state = tmp / "local"
    log = (tmp / "daemon.log").open("wb")
    daemon = subprocess.Popen(
        [*cli, "daemon", "run", "--period", "1h", "--poll", poll, "--state-dir", str(state)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    db = open_history(url, Settings(auto_migrate=False))
    provider = LocalProvider(state)
    try:
        yield World(db, provider, parse_duration(poll, "--polls").total_seconds(), seed)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(60)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()
        # Whatever the daemon left running (none when it stopped cleanly, or never launched).
        for instance in provider.list_instances() if (state / "instances").is_dir() else []:
            provider.terminate(instance.instance_id)
        db.dispose()
        shutil.rmtree(tmp, ignore_errors=True)


T = TypeVar("T")


def _until(what: str, found: Callable[[], T | None], limit_s: float) -> T:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        value = found()
        if value is not None:
            return value
        time.sleep(0.02)
    raise SystemExit(f"recovery benchmark: gave up waiting for {what} after {limit_s:g} s")


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()
