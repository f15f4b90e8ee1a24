"""The fault-injection driver: one daemon process that the crash tests kill and restart.

``python -m tests.fault_driver --db URL --dir DIR [--crash KEY:PHASE] [--leader] [--events FILE]``
opens the database, builds the ``Daemon`` on the local provider (state in ``DIR/local``, the same
directory every run, so a restarted driver finds the instances of the one it replaces) and runs
tick/poll rounds until the job is done. With ``--crash m2:grant:before`` its failpoint SIGKILLs
the process itself when the executor reaches that side effect in that phase: no ``finally``, no
flushing, exactly what a power cut or an OOM kill leaves behind. The next run, without
``--crash``, must carry on from the journal.

With ``--leader`` it first takes the database's ``Leadership`` (waiting, as a standby daemon
does) and hands ``still_leader`` to the daemon. Every event line (the executor's logfmt lines,
plus ``leader`` and ``crash``) goes to ``--events`` prefixed with the wall time and this pid, so a
test can tell which process acted when.

Exit status: 0 the job is done, 3 the time limit passed, 4 the job ended in another state.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from spotopt.db.engine import Database
from spotopt.history.setup import open_history
from spotopt.mover import jobs as jobstore
from spotopt.mover.daemon import Daemon
from spotopt.mover.eventlog import log_event
from spotopt.mover.leader import Leadership
from tests.mover_world import AGENT_ENV, make_world

JOB = "mlp"
TICK_EVERY_S = 0.5
POLL_EVERY_S = 0.05


def crash_at(target: tuple[str, str] | None) -> Callable[[str, str], None]:
    """A failpoint that SIGKILLs this process at ``(key, phase)`` (never, for None)."""

    def failpoint(key: str, phase: str) -> None:
        if (key, phase) == target:
            log_event("crash", key=key, phase=phase)
            os.kill(os.getpid(), signal.SIGKILL)

    return failpoint


def _events_to(path: Path) -> None:
    handler = logging.FileHandler(path, encoding="utf-8")  # flushed after every line
    handler.setFormatter(logging.Formatter("t=%(created).6f pid=%(process)d %(message)s"))
    logger = logging.getLogger("spotopt.mover")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def run(db: Database, daemon: Daemon, limit_s: float) -> int:
    """Tick every ``TICK_EVERY_S`` and poll in between until the job ends; the exit status."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        daemon.tick()
        next_tick = time.monotonic() + TICK_EVERY_S
        while time.monotonic() < next_tick:
            daemon.poll()
            state = jobstore.get_job(db, JOB).state
            if state in jobstore.TERMINAL:
                daemon.tick()  # a daemon keeps reconciling after a job ends: one more round
                return 0 if state == "done" else 4
            time.sleep(POLL_EVERY_S)
    return 3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--db", required=True, help="database URL")
    parser.add_argument("--dir", required=True, type=Path, help="the world's directory (provider state)")
    parser.add_argument("--crash", help="KEY:PHASE, e.g. m2:stop-old:after: SIGKILL this process there")
    parser.add_argument("--leader", action="store_true", help="take the leader lock (waiting) before acting")
    parser.add_argument("--events", type=Path, help="append the event lines here (time, pid, logfmt)")
    parser.add_argument("--limit-s", type=float, default=180.0, help="give up after this long (exit 3)")
    args = parser.parse_args(argv)
    target = None
    if args.crash:
        key, phase = args.crash.rsplit(":", 1)
        target = (key, phase)
    if args.events is not None:
        _events_to(args.events)
    db = open_history(args.db)
    world = make_world(db, args.dir)
    leadership = Leadership(db) if args.leader else None
    if leadership is not None:
        leadership.acquire(poll_s=0.1)
        log_event("leader", pid=os.getpid())
    daemon = Daemon(
        db,
        world.provider,
        world.settings,
        agent_env=AGENT_ENV,
        still_leader=leadership.still_leader if leadership is not None else lambda: True,
        failpoint=crash_at(target),
    )
    try:
        return run(db, daemon, args.limit_s)
    finally:
        if leadership is not None:
            leadership.release()
        db.dispose()


if __name__ == "__main__":
    sys.exit(main())
