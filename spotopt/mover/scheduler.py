"""The long-running daemon: APScheduler (3.x) drives the rounds of ``spotopt.mover.daemon``.

Three jobs on one ``BlockingScheduler``:

- ``tick`` (reconcile + rebalance) every planning period;
- ``poll`` (heartbeats, notices, waiting steps of open moves) every few seconds;
- ``collect`` (the collectors, as ``spotopt collect`` runs them) on a cron expression, if set.

Each has ``max_instances=1`` (a slow round is never run twice at once), ``coalesce=True``
(rounds missed while one was slow run once, not in a burst) and a misfire grace of one period.
The rounds also share one lock, so a poll never interleaves with a tick. Acting needs leadership
(``spotopt.mover.leader``): a standby waits for it before starting, and the executor checks it
before every side effect. SIGTERM and SIGINT shut the scheduler down after the round under way
(``shutdown(wait=True)``), so the daemon stops between steps, never inside one.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from spotopt.mover.daemon import Daemon
from spotopt.mover.eventlog import log_event
from spotopt.mover.executor import LostLeadership

log = logging.getLogger("spotopt.mover")


@dataclass(frozen=True, slots=True)
class Schedule:
    period_s: float
    poll_s: float = 5.0
    collect_cron: str | None = None
    """A crontab line's five fields (``0 * * * *``: hourly), or None: no collection."""


def run_forever(daemon: Daemon, schedule: Schedule, collect: Callable[[], None] | None = None) -> None:
    """Run the daemon's rounds until SIGTERM/SIGINT or a lost leadership."""
    from apscheduler.schedulers.blocking import BlockingScheduler
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    scheduler = BlockingScheduler(timezone="UTC")
    lock = threading.Lock()
    stopping = threading.Event()

    def shut_down() -> None:
        """Stop after the round under way; before the scheduler runs, just say so."""
        stopping.set()
        if scheduler.running:
            scheduler.shutdown(wait=True)

    def guarded(name: str, round_: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            with lock:
                try:
                    round_()
                except LostLeadership as exc:
                    log_event("leadership-lost", detail=str(exc))
                    daemon.round_ended(name, exc)
                    threading.Thread(target=shut_down, daemon=True).start()
                except Exception as exc:  # one failed round must not end the daemon: log and go on
                    log_event(f"{name}-failed", error=f"{type(exc).__name__}: {exc}")
                    log.exception("round %s failed", name)
                    daemon.round_ended(name, exc)
                else:
                    daemon.round_ended(name, None)

        return run

    grace = max(1, int(schedule.period_s))
    common = {"max_instances": 1, "coalesce": True, "misfire_grace_time": grace}
    scheduler.add_job(
        guarded("tick", daemon.tick), IntervalTrigger(seconds=schedule.period_s), id="tick", **common
    )
    scheduler.add_job(
        guarded("poll", daemon.poll), IntervalTrigger(seconds=schedule.poll_s), id="poll", **common
    )
    if schedule.collect_cron and collect is not None:
        trigger = CronTrigger.from_crontab(schedule.collect_cron, timezone="UTC")
        scheduler.add_job(guarded("collect", collect), trigger, id="collect", **common)

    def stop(signum: int, _frame: FrameType | None) -> None:
        log_event("shutdown", signal=signal.Signals(signum).name)
        threading.Thread(target=shut_down, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    guarded("tick", daemon.tick)()  # the first round now, not one period from now
    if not stopping.is_set():
        scheduler.start()
