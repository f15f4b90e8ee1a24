"""Issue 36, item 2, as a user met it: the installed ``spotopt`` console script, the local provider,
real daemons. Two spot zones ($0.90 and $0.80/h); the job starts on the $0.80/h one; a $0.20/h
price is imported for the other; the daemon is SIGKILLed and started again; the trainer is
SIGKILLed. The job is recovered onto the $0.20/h zone, the one ``spotopt plan`` picks on the
same database (it went back to $0.80/h in 3 of 3 runs: the decision core's targets took the dead
instance's option for the leg the job is on; ``tests/test_recovery_target.py``).

Every wait is for a condition in the database, with a limit only a broken build reaches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from spotopt.clouds.local.provider import LocalProvider, group_members
from spotopt.db.engine import Database
from spotopt.db.models import DaemonTick, Market, Placement
from spotopt.history.setup import open_history
from spotopt.mover import jobs as jobstore

SPOTOPT = Path(sys.executable).parent / "spotopt"
TRAIN = Path(__file__).resolve().parents[1] / "data" / "examples" / "train_numpy.py"
LIMIT_S = 120.0
HOLD = 40
"""The trainer stops at this step (``--until-file``) until the test ends: it runs while the
test checks what it checks, whatever the machine's speed."""
CSV_HEAD = "timestamp,cloud,region,zone,instance_type,market,usd_per_hour\n"


class Scene:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.url = f"sqlite:///{tmp / 'history.sqlite'}"
        self.state_dir = tmp / "local"
        self.env = {**os.environ, "SPOTOPT_DB_URL": self.url, "XDG_DATA_HOME": str(tmp / "xdg")}
        self.daemons: list[subprocess.Popen[str]] = []
        self._db: Database | None = None

    @property
    def db(self) -> Database:
        if self._db is None:
            self._db = open_history(self.url)
        return self._db

    def spotopt(self, *args: str) -> str:
        done = subprocess.run(
            [str(SPOTOPT), *args], env=self.env, cwd=self.tmp, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, (args, done.stderr)
        return done.stdout

    def prices(self, name: str, at: datetime, *rows: tuple[str, float]) -> None:
        stamp = at.strftime("%Y-%m-%dT%H:%M:%SZ")
        lines = [f"{stamp},aws,us-east-1,{zone},p3.2xlarge,spot,{usd}\n" for zone, usd in rows]
        path = self.tmp / name
        path.write_text(CSV_HEAD + "".join(lines), encoding="utf-8")
        self.spotopt("import", "csv", str(path))

    def start_daemon(self) -> subprocess.Popen[str]:
        argv = [str(SPOTOPT), "daemon", "run", "--period", "2s", "--poll", "1s"]
        argv += ["--state-dir", str(self.state_dir)]
        log = (self.tmp / f"daemon-{len(self.daemons)}.err").open("w", encoding="utf-8")
        proc = subprocess.Popen(argv, env=self.env, cwd=self.tmp, text=True, stdout=log, stderr=log)
        self.daemons.append(proc)
        return proc

    def until(self, what: str, condition: Callable[[], bool]) -> None:
        limit = time.monotonic() + LIMIT_S
        while not condition():
            for n, proc in enumerate(self.daemons):
                if proc.poll() not in (None, -signal.SIGKILL):
                    log = (self.tmp / f"daemon-{n}.err").read_text(encoding="utf-8")
                    raise AssertionError(f"daemon {n} exited with {proc.returncode}: {log}")
            assert time.monotonic() < limit, f"gave up waiting for {what}"
            time.sleep(0.2)

    def placements(self) -> list[tuple[Placement, Market]]:
        with self.db.session() as session:
            rows = session.execute(
                select(Placement, Market)
                .join(Market, Market.id == Placement.market_id)
                .order_by(Placement.id)
            ).all()
            return [(p, m) for p, m in rows]

    def ticked_after(self, since: datetime, pid: int) -> bool:
        """A round of daemon ``pid`` that started after ``since`` has finished."""
        with self.db.session() as session:
            found = session.scalar(
                select(DaemonTick.id).where(
                    DaemonTick.pid == pid, DaemonTick.started_at > since, DaemonTick.finished_at.is_not(None)
                )
            )
        return found is not None

    def stop(self) -> None:
        for proc in self.daemons:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.state_dir.exists():
            provider = LocalProvider(self.state_dir)
            for instance in provider.list_instances():
                provider.terminate(instance.instance_id)
        if self._db is not None:
            self._db.engine.dispose()


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    s = Scene(tmp_path)
    yield s
    s.stop()


def job_file(tmp: Path) -> Path:
    path = tmp / "job.yaml"
    path.write_text(
        "jobs:\n"
        "  - name: mlp\n"
        "    throughput: {V100: 40}\n"
        "    work: {steps: 400}\n"
        "    restart_s: 10\n"
        "    checkpoint_s: 1\n"
        f"    run: {sys.executable} {TRAIN} --steps 400 --out out --until-file {tmp / 'hold'}\n"
        f"    checkpoint: {{uri: {tmp / 'store'}}}\n"
        "    budget_usd: 5\n"
        "    retry: {max: 2}\n"
        "    allow: {instance_types: [p3.2xlarge]}\n",
        encoding="utf-8",
    )
    return path


def trainer_of(scene: Scene, placement: Placement) -> int:
    """The training process of ``placement``'s local instance (the runner's child)."""
    assert placement.instance_id is not None
    record = scene.state_dir / "instances" / placement.instance_id / "record.json"
    runner = int(json.loads(record.read_text(encoding="utf-8"))["pid"])
    return next(pid for pid in group_members(runner) if pid != runner)


def test_a_restarted_daemon_recovers_a_killed_trainer_onto_the_market_plan_picks(scene: Scene) -> None:
    (scene.tmp / "hold").write_text(str(HOLD), encoding="utf-8")
    scene.prices(
        "start.csv", datetime.now(UTC) - timedelta(hours=1), ("us-east-1a", 0.90), ("us-east-1b", 0.80)
    )
    job = job_file(scene.tmp)
    scene.spotopt("jobs", "submit", str(job))
    first = scene.start_daemon()
    scene.until("the job to run", lambda: jobstore.get_job(scene.db, "mlp").steps >= HOLD)
    ((placement, market),) = scene.placements()
    assert (market.zone, placement.state) == ("us-east-1b", "running")

    dropped = datetime.now(UTC)
    scene.prices("drop.csv", dropped, ("us-east-1a", 0.20))
    scene.until("a round at the new price", lambda: scene.ticked_after(dropped, first.pid))
    assert len(scene.placements()) == 1  # the job's dwell keeps it where it is: no voluntary move

    first.send_signal(signal.SIGKILL)
    first.wait()
    restarted = datetime.now(UTC)
    second = scene.start_daemon()
    scene.until("the restarted daemon's round", lambda: scene.ticked_after(restarted, second.pid))
    os.kill(trainer_of(scene, placement), signal.SIGKILL)
    scene.until("the recovery", lambda: len(scene.placements()) == 2)

    planned = json.loads(scene.spotopt("plan", str(job), "--format", "json"))
    (chosen,) = planned["jobs"][0]["allocation"]
    assert (chosen["zone"], chosen["usd_per_hour"]) == ("us-east-1a", 0.2)
    _, (_, where) = scene.placements()
    assert (where.zone, where.kind) == (chosen["zone"], "spot")
