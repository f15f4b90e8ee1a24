"""Prometheus metrics of the mover (``spotopt daemon run --metrics-port N``).

Every value is read from the history when Prometheus scrapes, not counted in the daemon's
memory: the numbers then agree with ``jobs show`` / ``jobs cost`` / ``daemon status`` by
construction, survive a daemon restart, and a standby daemon (not leading) exports the same
fleet as the leader. Only ``spotopt_round_errors_total`` is counted in the process, because a
failed poll leaves no row: the scheduler logs each failed round as ``event=<round>-failed``
(``spotopt.mover.scheduler``), and ``RoundFailures`` counts those lines.

Metric names follow Prometheus' conventions (base units, ``_total`` for counters, ``spotopt_``
prefix). A counter only grows: ``spotopt_moves_total`` counts finished moves (a finished move
stays finished), the moves under way are the gauge ``spotopt_moves_open``.
``docs/grafana/spotopt.json`` graphs them; a test checks it queries only these.

On loopback the endpoint answers only requests addressed to this machine (``spotopt.webguard``:
no page renamed to 127.0.0.1 reads the fleet's jobs and spend).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotopt.clouds.common.base import market_label
from spotopt.db.engine import Database
from spotopt.db.models import JOB_STATES, DaemonTick, JobMove, ManagedJob, NotifySink, Placement
from spotopt.mover.eventlog import parse
from spotopt.mover.leader import read_leader
from spotopt.mover.ledger import market_key, slot_usd_per_hour, spent_by_job
from spotopt.mover.observed import PREEMPTION_ENDS
from spotopt.notify.deliver import undelivered
from spotopt.webguard import PLAIN_CSP, guard_wsgi, loopback_hosts

LIVE_PLACEMENTS = ("launching", "running")
"""Placement states that bill (or are about to): the spend rate counts these."""
ROUNDS = ("tick", "poll")


class HistoryCollector(Collector):
    """The fleet's metrics, read from ``db`` at each scrape (``collect``)."""

    def __init__(self, db: Database, clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.db = db
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        with self.db.session() as session:
            jobs = session.execute(
                select(ManagedJob.id, ManagedJob.name, ManagedJob.state, ManagedJob.budget_usd)
            )
            jobs_rows = jobs.all()
            by_state = GaugeMetricFamily("spotopt_jobs", "Managed jobs by state.", labels=["state"])
            for state in JOB_STATES:
                by_state.add_metric([state], sum(1 for row in jobs_rows if row.state == state))
            yield by_state

            spent = spent_by_job(session, [row.id for row in jobs_rows], now)
            spent_metric = GaugeMetricFamily(
                "spotopt_job_spent_usd", "What the job has cost so far (jobs cost's total).", labels=["job"]
            )
            budget_metric = GaugeMetricFamily("spotopt_job_budget_usd", "The job's budget.", labels=["job"])
            for row in jobs_rows:
                spent_metric.add_metric([row.name], spent[row.id])
                budget_metric.add_metric([row.name], row.budget_usd)
            yield spent_metric
            yield budget_metric

            names = {row.id: row.name for row in jobs_rows}
            rate = GaugeMetricFamily(
                "spotopt_job_spend_usd_per_hour",
                "The job's slot price in effect now, for each live placement.",
                labels=["job", "market"],
            )
            fleet_rate = 0.0
            live = session.scalars(
                select(Placement).where(
                    Placement.state.in_(LIVE_PLACEMENTS), Placement.started_at.is_not(None)
                )
            )
            for p in live:
                usd = slot_usd_per_hour(session, p, now, now)
                fleet_rate += usd
                rate.add_metric([names[p.job_id], market_label(market_key(session, p.market_id))], usd)
            yield rate
            yield GaugeMetricFamily(
                "spotopt_spend_usd_per_hour", "The whole fleet's spend rate now.", value=fleet_rate
            )

            moves = CounterMetricFamily(
                "spotopt_moves",
                "Moves finished, by kind, outcome and target market.",
                labels=["kind", "outcome", "market"],
            )
            open_moves = GaugeMetricFamily(
                "spotopt_moves_open",
                "Moves under way now, by kind and target market.",
                labels=["kind", "market"],
            )
            target = func.coalesce(JobMove.market_id, Placement.market_id)
            counted = session.execute(
                select(JobMove.kind, JobMove.outcome, target, func.count())
                .outerjoin(Placement, Placement.id == JobMove.to_placement_id)
                .group_by(JobMove.kind, JobMove.outcome, target)
            ).all()
            for kind, outcome, market_id, n in counted:
                where = "" if market_id is None else market_label(market_key(session, market_id))
                if outcome is None:
                    open_moves.add_metric([kind, where], n)
                else:
                    moves.add_metric([kind, outcome, where], n)
            yield moves
            yield open_moves

            preemptions = CounterMetricFamily(
                "spotopt_preemptions",
                "Instances the cloud took away (preempted) or warned (noticed), by market.",
                labels=["kind", "market"],
            )
            ended = session.execute(
                select(Placement.end_reason, Placement.market_id, func.count())
                .where(Placement.end_reason.in_(PREEMPTION_ENDS))
                .group_by(Placement.end_reason, Placement.market_id)
            ).all()
            for reason, market_id, n in ended:
                preemptions.add_metric([str(reason), market_label(market_key(session, market_id))], n)
            yield preemptions

            yield from _rounds(session)
            yield from _sinks(session)
        yield from _leader(self.db)


def _sinks(session: Session) -> Iterator[Metric]:
    """Each notification sink's run of failed deliveries and the events it has yet to get
    (``spotopt.notify``): an alert on the first says a sink keeps failing, on the second that
    people are not being told."""
    failures = GaugeMetricFamily(
        "spotopt_notify_failures_in_a_row", "Failed deliveries in a row, by sink.", labels=["sink"]
    )
    waiting = GaugeMetricFamily(
        "spotopt_notify_undelivered", "Events the sink has yet to acknowledge.", labels=["sink"]
    )
    for row in session.scalars(select(NotifySink).order_by(NotifySink.name)):
        failures.add_metric([row.name], row.failures_in_a_row)
        waiting.add_metric([row.name], undelivered(session, row.name))
    yield failures
    yield waiting


def _rounds(session: Session) -> Iterator[Metric]:
    """Ticks from ``daemon_ticks``: finished, unfinished (a tick that raised or whose daemon died
    leaves ``finished_at`` empty; the newest may still be running and is not counted), and the
    last finished one's duration and time."""
    ticks = session.execute(
        select(DaemonTick.id, DaemonTick.started_at, DaemonTick.finished_at).where(
            DaemonTick.dry_run.is_(False)
        )
    ).all()
    newest = max((t.id for t in ticks), default=None)
    finished = [t for t in ticks if t.finished_at is not None]
    yield CounterMetricFamily(
        "spotopt_ticks", "Ticks (reconcile + rebalance rounds) finished.", value=len(finished)
    )
    yield CounterMetricFamily(
        "spotopt_ticks_unfinished",
        "Ticks that never finished (raised, or the daemon died), the one running now left out.",
        value=sum(1 for t in ticks if t.finished_at is None and t.id != newest),
    )
    last = max(finished, key=lambda t: t.id, default=None)
    duration = GaugeMetricFamily(
        "spotopt_last_tick_duration_seconds", "How long the last finished tick took."
    )
    at = GaugeMetricFamily(
        "spotopt_last_tick_timestamp_seconds", "When the last finished tick ended (Unix time)."
    )
    if last is not None:
        duration.add_metric([], (last.finished_at - last.started_at).total_seconds())
        at.add_metric([], last.finished_at.timestamp())
    yield duration
    yield at


def _leader(db: Database) -> Iterator[Metric]:
    """Who leads (``meta.mover_leader``) and whether it is this process."""
    holder = read_leader(db)
    here = holder is not None and holder.host == socket.gethostname() and holder.pid == os.getpid()
    yield GaugeMetricFamily("spotopt_leader", "1 if this process leads the mover, else 0.", value=float(here))
    info = GaugeMetricFamily(
        "spotopt_leader_info", "The leading daemon's host and pid (value 1).", labels=["host", "pid"]
    )
    if holder is not None:
        info.add_metric([holder.host, str(holder.pid)], 1.0)
    yield info


class RoundFailures(logging.Handler):
    """Counts the scheduler's ``event=<round>-failed`` log lines, per round (``tick``/``poll``)."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.failed = dict.fromkeys(ROUNDS, 0)

    def emit(self, record: logging.LogRecord) -> None:
        event = parse(record.getMessage()).get("event", "")
        round_ = event.removesuffix("-failed")
        if event.endswith("-failed") and round_ in self.failed:
            self.failed[round_] += 1


class FailureCollector(Collector):
    def __init__(self, counts: RoundFailures) -> None:
        self.counts = counts

    def collect(self) -> Iterator[Metric]:
        metric = CounterMetricFamily(
            "spotopt_round_errors", "Rounds of this process that raised, by round.", labels=["round"]
        )
        for round_, n in self.counts.failed.items():
            metric.add_metric([round_], n)
        yield metric


def registry(
    db: Database, clock: Callable[[], datetime] | None = None
) -> tuple[CollectorRegistry, RoundFailures]:
    """A registry with the history's metrics and this process's round failures (the handler is
    returned so the caller attaches it to the ``spotopt.mover`` logger)."""
    found = CollectorRegistry()
    found.register(HistoryCollector(db, clock) if clock else HistoryCollector(db))
    failures = RoundFailures()
    found.register(FailureCollector(failures))
    return found, failures


class _Quiet(WSGIRequestHandler):
    """The exporter's request handler, without wsgiref's access log line per scrape on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged."""


def serve(
    db: Database, port: int, host: str = "127.0.0.1", clock: Callable[[], datetime] | None = None
) -> WSGIServer:
    """Serve ``/metrics`` on ``host:port`` from a background thread for the life of the process
    (the server is returned so a caller may ``shutdown()`` it); on loopback, only to requests
    addressed to this machine."""
    found, failures = registry(db, clock)
    logging.getLogger("spotopt.mover").addHandler(failures)
    family, *_ = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family  # IPv4 or IPv6, as the host is

    app = guard_wsgi(make_wsgi_app(found), loopback_hosts(host), PLAIN_CSP)
    server = make_server(host, port, app, Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
