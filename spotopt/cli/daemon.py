"""``spotopt daemon``: run the mover (foreground, ``--once`` for cron) and show what it is doing."""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, cast

import platformdirs
import typer
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from spotopt.cli.common import FormatOption, WideOption, directory, parse_duration, parse_time, state
from spotopt.clouds.common.artifacts import check_install
from spotopt.clouds.common.base import Provider
from spotopt.clouds.common.router import CloudsProvider
from spotopt.clouds.registry import MARKET_CLOUDS, PROVIDERS, get_provider
from spotopt.db.engine import Database
from spotopt.db.models import DaemonTick, InstanceType, JobEvent, JobMove, ManagedJob, Market, NotifySink
from spotopt.decide.guardrails import Guardrails
from spotopt.errors import ConfigError, InputError, ProviderError
from spotopt.jobspec import MAX_USD
from spotopt.mover.daemon import Daemon, DaemonSettings, TickReport
from spotopt.mover.executor import Executor, Timeouts
from spotopt.mover.leader import LeaderRecord, Leadership, read_leader
from spotopt.mover.sweep import Leftover
from spotopt.notify.deliver import undelivered
from spotopt.notify.sinks import configured
from spotopt.render import Format, iso, render, say, to_json, usd
from spotopt.settings import Settings

app = typer.Typer(
    no_args_is_help=True, help="The mover: checkpoint and relaunch jobs where capacity is cheaper."
)

DECISION_COLUMNS = ("job", "kind", "reason", "to", "gpus", "usd_per_hour", "saving_usd", "cost_usd")
StateDirOption = Annotated[
    Path | None, typer.Option("--state-dir", help="local provider: where it records processes and logs.")
]


DEFAULT_POLL_S = 5.0
"""``daemon run``'s poll without ``--poll`` (the period instead, when that is shorter)."""
DEFAULT_STATE_DIR = Path(platformdirs.user_data_dir("spotopt")) / "local"
"""Where the local provider keeps its records and the jobs' logs unless --state-dir says."""


def _provider(name: str, state_dir: Path | None) -> Provider:
    if name != "local":
        return get_provider(name)  # the registry's own error: the names and a suggestion
    if state_dir is not None:
        directory(state_dir, "--state-dir")
    return get_provider("local", state_dir=state_dir or DEFAULT_STATE_DIR)


def _clouds(db: Database, name: str) -> tuple[CloudsProvider, tuple[str, ...]]:
    """The routing provider for ``--provider NAME`` (one cloud, or ``clouds``: every cloud with
    markets in the history) and the clouds it can use. A cloud whose provider cannot be built
    gets one warning line saying what to configure, and its markets are left out."""
    with db.session() as session:
        pairs = session.execute(
            select(InstanceType.cloud, Market.region)
            .join(Market, Market.instance_type_id == InstanceType.id)
            .distinct()
            .order_by(InstanceType.cloud, Market.region)
        ).all()
    regions: dict[str, list[str]] = {}
    for cloud, region in pairs:
        regions.setdefault(cloud, []).append(region)
    wanted = [name] if name in MARKET_CLOUDS else [c for c in MARKET_CLOUDS if c in regions]
    if not wanted:
        raise ConfigError(f"--provider {name}: the history has no market of any cloud; run spotopt collect")
    settings = Settings()
    if settings.bootstrap_install:  # before any round: a launch would be refused for the same reason
        check_install(settings)
    router = CloudsProvider(settings, {c: regions.get(c, []) for c in wanted})
    usable = router.usable()
    for problem in router.problems.values():
        say(f"{problem}; its markets are left out of this run", label="warning:", err=True)
    if not usable:
        raise ConfigError(f"--provider {name}: no cloud can be used; configure one (see the warnings)")
    return router, tuple(usable)


def _logging() -> None:
    """Event lines (logfmt) on stderr, one per decision and side effect, stamped in UTC."""
    handler = logging.StreamHandler(sys.stderr)
    formatter = logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%dT%H:%M:%SZ")
    formatter.converter = time.gmtime
    handler.setFormatter(formatter)
    mover = logging.getLogger("spotopt.mover")
    handler.set_name("spotopt-daemon")
    mover.handlers = [h for h in mover.handlers if h.get_name() != "spotopt-daemon"]
    mover.addHandler(handler)
    mover.setLevel(logging.INFO)
    mover.propagate = False


@app.command("run")
def run(
    ctx: typer.Context,
    once: Annotated[
        bool, typer.Option("--once", help="One reconcile + rebalance round, then exit (for cron).")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Plan and show every move; call no provider, change nothing.")
    ] = False,
    provider: Annotated[
        str,
        typer.Option(
            "--provider",
            help="Where placements run: local (processes on this machine), aws, gcp, azure, or "
            "clouds (each placement on its market's cloud).",
        ),
    ] = "local",
    period: Annotated[str, typer.Option("--period", help="Planning period, e.g. 1h, 15m, 5s.")] = "1h",
    poll: Annotated[
        str | None,
        typer.Option(
            "--poll", help="Heartbeat and notice polling interval [default: 5s, or --period if shorter]."
        ),
    ] = None,
    collect_cron: Annotated[
        str | None,
        typer.Option("--collect-cron", help="Run the collectors on this crontab schedule, e.g. '0 * * * *'."),
    ] = None,
    state_dir: StateDirOption = None,
    max_usd_per_hour: Annotated[
        float | None, typer.Option("--max-usd-per-hour", help="Cap on the whole fleet's spend rate.", min=0.0)
    ] = None,
    min_dwell: Annotated[
        str,
        typer.Option(
            "--min-dwell",
            envvar="SPOTOPT_MIN_DWELL",
            help="A placed job stays this long before a voluntary move (notices bypass it).",
        ),
    ] = "2h",
    move_margin: Annotated[
        float,
        typer.Option(
            "--move-margin",
            envvar="SPOTOPT_MOVE_MARGIN",
            min=0.0,
            max=100.0,
            help="A voluntary move needs a net saving above this multiple of its own cost.",
        ),
    ] = 0.5,
    max_moves_per_tick: Annotated[
        int | None,
        typer.Option(
            "--max-moves-per-tick",
            envvar="SPOTOPT_MAX_MOVES_PER_TICK",
            min=0,
            help="Voluntary moves per round at most (default: no cap).",
        ),
    ] = None,
    deadline_margin: Annotated[
        str,
        typer.Option(
            "--deadline-margin",
            envvar="SPOTOPT_DEADLINE_MARGIN",
            help="Slack kept before a deadline forces on-demand.",
        ),
    ] = "0s",
    launch_timeout: Annotated[
        str,
        typer.Option(
            "--launch-timeout",
            envvar="SPOTOPT_LAUNCH_TIMEOUT",
            help="A new placement's agent must heartbeat within this (progress within twice it).",
        ),
    ] = "15m",
    stop_timeout: Annotated[
        str,
        typer.Option(
            "--stop-timeout",
            envvar="SPOTOPT_STOP_TIMEOUT",
            help="An old placement must answer checkpoint-and-stop within this; then the lease moves anyway.",
        ),
    ] = "10m",
    unavailable_for: Annotated[
        str,
        typer.Option(
            "--unavailable-for",
            envvar="SPOTOPT_UNAVAILABLE_FOR",
            help="A market that refused a launch sits out this long.",
        ),
    ] = "1h",
    store_outage: Annotated[
        str,
        typer.Option(
            "--store-outage",
            envvar="SPOTOPT_STORE_OUTAGE",
            help="A job's checkpoint store may refuse the daemon this long before the job is failed.",
        ),
    ] = "5m",
    replay: Annotated[
        bool,
        typer.Option(
            "--replay",
            help="Replay the submitted jobs on a simulated clock from --start over the price history "
            "(local processes, a database of its own in --state-dir; nothing real is launched).",
        ),
    ] = False,
    start: Annotated[
        str | None,
        typer.Option(
            help="--replay: simulated start (ISO 8601); default one window before the latest price."
        ),
    ] = None,
    preemptions: Annotated[
        str,
        typer.Option(help="--replay: preemptions none, model (from the rates, --seed) or replay (recorded)."),
    ] = "none",
    seed: Annotated[int, typer.Option(min=0, help="--replay: seed of --preemptions model.")] = 0,
    until: Annotated[
        str | None, typer.Option(help="--replay: stop at this simulated time (default: every job done).")
    ] = None,
    fmt: FormatOption = Format.TABLE,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port", min=1, max=65535, help="Serve Prometheus metrics on this port (/metrics)."
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Address of the metrics endpoint (0.0.0.0: all).")
    ] = "127.0.0.1",
) -> None:
    """Run the mover. Without --once it runs until SIGTERM: collectors on --collect-cron, polling
    every --poll, reconcile + rebalance every --period. Only the leader acts; another daemon on
    the same database waits and takes over when the leader dies. --replay runs it instead on a
    simulated clock over the recorded market (docs/guides/daemon.md, "Fidelity")."""
    period_h = parse_duration(period, "--period").total_seconds() / 3600.0
    # The default poll follows a short period: a poll longer than the period is refused.
    poll_s = (
        min(DEFAULT_POLL_S, period_h * 3600.0)
        if poll is None
        else parse_duration(poll, "--poll").total_seconds()
    )
    if period_h <= 0 or poll_s <= 0:
        raise InputError("--period/--poll: give a duration above zero, e.g. 1h or 5s")
    if poll_s > period_h * 3600.0:
        raise InputError(f"--poll {poll}: longer than --period {period}; poll at least once a period")
    if max_usd_per_hour is not None and not (0 < max_usd_per_hour <= MAX_USD):
        raise InputError(
            f"--max-usd-per-hour: {max_usd_per_hour!r} is not a spend rate; give dollars per hour > 0 "
            f"(at most {MAX_USD:g})"
        )
    if collect_cron is not None:
        _check_cron(collect_cron)
    if metrics_port is not None and (once or dry_run or replay):
        raise InputError(
            "--metrics-port: only for a daemon that keeps running; drop --once/--dry-run/--replay or it"
        )
    db = state(ctx).db()
    if replay:
        given = {"--once": once, "--dry-run": dry_run, "--collect-cron": collect_cron is not None}
        given |= {"--provider": provider != "local", "--max-usd-per-hour": max_usd_per_hour is not None}
        given |= {"--poll": poll is not None}
        if clash := [name for name, on in given.items() if on]:
            raise InputError(
                f"--replay with {', '.join(clash)}: a replay runs every placement as a local process on "
                "a simulated clock; drop those options"
            )
        _replay_run(db, start, until, preemptions, seed, period_h, state_dir, fmt)
        return
    if start is not None or until is not None or preemptions != "none" or seed != 0:
        raise InputError(
            "--start/--until/--preemptions/--seed: only with --replay; add --replay or drop them"
        )
    guardrails = Guardrails(
        move_margin=move_margin,
        min_dwell_h=_hours(min_dwell, "--min-dwell", zero=True),
        max_moves_per_tick=max_moves_per_tick,
        max_usd_per_hour=max_usd_per_hour,
        period_h=period_h,
        deadline_margin_h=_hours(deadline_margin, "--deadline-margin", zero=True),
    )
    timeouts = Timeouts(
        launch_s=_hours(launch_timeout, "--launch-timeout") * 3600.0,
        stop_s=_hours(stop_timeout, "--stop-timeout") * 3600.0,
        unavailable_s=_hours(unavailable_for, "--unavailable-for", zero=True) * 3600.0,
        store_s=_hours(store_outage, "--store-outage", zero=True) * 3600.0,
    )
    router, clouds = _clouds(db, provider) if provider in PROVIDERS and provider != "local" else (None, None)
    notify = Settings()
    settings = DaemonSettings(
        period_h=period_h,
        guardrails=guardrails,
        timeouts=timeouts,
        dry_run=dry_run,
        clouds=clouds,
        sinks=tuple(configured(notify)),
        notify_timeout_s=notify.notify_timeout_s,
        round_failures=notify.notify_round_failures,
        prices_stale_h=notify.notify_prices_stale_h,
    )
    _logging()
    if dry_run:
        report = Daemon(db, None, settings).tick()
        _show(report, fmt, "Moves the daemon would make (dry run: nothing done)")
        return
    placements = router or _provider(provider, state_dir)
    leadership = Leadership(db)
    if once:
        if not leadership.try_acquire():
            holder = read_leader(db)
            who = f"host {holder.host}, pid {holder.pid}" if holder else "another process"
            say(f"another daemon leads ({who}); this round did nothing", label="note:", err=True)
            return
        try:
            report = Daemon(db, placements, settings, still_leader=leadership.still_leader).tick()
        finally:
            leadership.release()
        _show(report, fmt, "Moves started this round")
        return
    if not leadership.try_acquire():
        holder = read_leader(db)
        who = f"host {holder.host}, pid {holder.pid}" if holder else "another process"
        say(f"another daemon leads ({who}); standing by to take over", label="daemon:", err=True)
        leadership.acquire()
    from spotopt.mover.scheduler import Schedule, run_forever

    daemon = Daemon(db, placements, settings, still_leader=leadership.still_leader)
    if metrics_port is not None:
        _serve_metrics(db, metrics_host, metrics_port)
    try:
        run_forever(daemon, Schedule(period_h * 3600.0, poll_s, collect_cron), _collector(db))
    finally:
        leadership.release()


def _serve_metrics(db: Database, host: str, port: int) -> None:
    """Start the Prometheus endpoint (``spotopt.mover.metrics``) in a background thread."""
    try:
        from spotopt.mover.metrics import serve
    except ImportError:
        raise ConfigError(
            "--metrics-port needs prometheus_client: pip install 'spotopt-gpu[metrics]'"
        ) from None
    try:
        serve(db, port, host)
    except OSError as exc:
        raise InputError(f"--metrics-port {port}: cannot listen on {host}:{port} ({exc.strerror})") from None
    say(f"metrics at http://{host}:{port}/metrics", label="daemon:", err=True)


REPLAY_COLUMNS = ("job", "state", "cost_usd", "finish_hours", "moves", "preemptions", "failed_moves")


def _replay_run(
    db: Database,
    start: str | None,
    until: str | None,
    preemptions: str,
    seed: int,
    period_h: float,
    state_dir: Path | None,
    fmt: Format,
) -> None:
    """``daemon run --replay``: the database's unfinished managed jobs, replayed from ``start``."""
    from spotopt.jobspec import JobSpec
    from spotopt.mover import jobs as jobstore
    from spotopt.replay.harness import FidelityRequest, replay_daemon

    mode = _preemption_mode(preemptions)
    when = parse_time(start, "--start")
    with db.session() as session:
        managed = session.scalars(
            select(ManagedJob)
            .where(ManagedJob.state.not_in(jobstore.TERMINAL | {"over-budget"}))
            .order_by(ManagedJob.id)
        ).all()
        specs = [jobstore.job_spec(j).model_copy(update={"budget_usd": j.budget_usd}) for j in managed]
    if not specs:
        raise InputError(
            "--replay: no unfinished managed job to replay; submit some with spotopt jobs submit FILE"
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    where = state_dir or Path(platformdirs.user_data_dir("spotopt")) / "replays" / stamp
    if where.exists() and (not where.is_dir() or any(where.iterdir())):
        raise InputError(f"--state-dir {where}: exists and is not an empty directory; name a new one")
    request = FidelityRequest(JobSpec(jobs=specs), when, mode, seed, period_h, parse_time(until, "--until"))
    with _replay_progress() as on_round:
        run = replay_daemon(db, request, where, on_round)
    rows = [
        {
            "job": name,
            "state": got.state,
            "cost_usd": got.cost_usd,
            "finish_hours": got.finish_hours,
            "moves": got.moves,
            "preemptions": got.preemptions,
            "failed_moves": got.failed_moves,
        }
        for name, got in run.realised.items()
    ]
    if fmt is Format.JSON:
        sys.stdout.write(to_json(rows) + "\n")
    else:
        render(
            rows,
            fmt,
            title=f"The daemon replayed from {run.whatif.first_start:%Y-%m-%d %H:%M} to "
            f"{run.ended:%Y-%m-%d %H:%M} UTC, preemptions {mode.value}",
            columns=REPLAY_COLUMNS,
        )
    say(
        f"the replay's own database (its ledger): spotopt --db sqlite:///{run.database} jobs cost NAME",
        label="note:",
        err=True,
    )


def _preemption_mode(name: str) -> Any:
    from spotopt.whatif.preemptions import PreemptionMode

    modes = {m.value: m for m in PreemptionMode}
    if name not in modes:
        raise InputError(f"--preemptions {name!r}: must be one of {', '.join(modes)}")
    return modes[name]


def _collector(db: Database) -> Any:
    def collect() -> None:
        from spotopt.cli.collect import FACTORY, RETRY
        from spotopt.history.collect import CollectRequest, run_collect

        run_collect(db, CollectRequest(), FACTORY, retry=RETRY)

    return collect


def _check_cron(expr: str) -> None:
    from apscheduler.triggers.cron import CronTrigger

    try:
        CronTrigger.from_crontab(expr, timezone="UTC")
    except ValueError as exc:
        raise InputError(
            f"--collect-cron: {expr!r} is not a crontab schedule ({exc}); e.g. '0 * * * *'"
        ) from None


def _show(report: TickReport, fmt: Format, title: str) -> None:
    for note in report.notes:
        say(note, label="warning:", style="yellow", err=True)
    if fmt is Format.JSON:
        sys.stdout.write(to_json(report.to_dict()) + "\n")
        return
    render(report.decisions, fmt, title=title, columns=DECISION_COLUMNS, empty="no moves")


SWEEP_COLUMNS = ("cloud", "instance", "job", "state", "bills", "usd_per_hour", "why", "action")


@app.command("sweep")
def sweep(
    ctx: typer.Context,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List what bills with no live placement; terminate nothing.")
    ] = False,
    provider: Annotated[
        str,
        typer.Option(
            "--provider",
            help="Where to look: clouds (every cloud with markets in the history), aws, gcp, azure, "
            "or local.",
        ),
    ] = "clouds",
    state_dir: StateDirOption = None,
    fmt: FormatOption = Format.TABLE,
) -> None:
    """End what bills with no live placement: this database's instances that no running
    placement owns (a launch whose move failed, a duplicate), an ended placement's VM the guest
    powered off, an evicted VM's NIC. Per cloud, with the cost per hour it stops. The daemon
    does the same at every round; this runs it now. Exit 3 if a terminate failed."""
    db = state(ctx).db()
    if provider not in PROVIDERS:
        get_provider(provider)  # the registry's own error: the names and a suggestion
    placements = _clouds(db, provider)[0] if provider != "local" else _provider(provider, state_dir)
    if dry_run:
        leftovers = Executor(db, placements).sweep(dry_run=True)
    else:
        leadership = Leadership(db)
        if not leadership.try_acquire():
            holder = read_leader(db)
            who = f"host {holder.host}, pid {holder.pid}" if holder else "another process"
            raise ConfigError(
                f"another daemon leads ({who}) and sweeps at every round; "
                "spotopt daemon sweep --dry-run lists what is left"
            )
        try:
            leftovers = Executor(db, placements, still_leader=leadership.still_leader).sweep()
        finally:
            leadership.release()
    rows = [leftover.as_row() for leftover in leftovers]
    by_cloud = _per_cloud(leftovers)
    if fmt is Format.JSON:
        sys.stdout.write(to_json({"dry_run": dry_run, "leftovers": rows, "by_cloud": by_cloud}) + "\n")
    elif fmt is Format.CSV:
        render(rows, fmt, columns=SWEEP_COLUMNS)
    else:
        verb = "would end (dry run: nothing done)" if dry_run else "ended"
        render(
            rows, fmt, title=f"Billing with no live placement: {verb}", columns=SWEEP_COLUMNS, empty="none"
        )
        if by_cloud:
            render(by_cloud, fmt, title="Per cloud ($/h: what they cost while left)")
    failed = [leftover for leftover in leftovers if leftover.error]
    if failed:
        say("the next sweep tries them again", label=f"{len(failed)} terminate(s) failed;", err=True)
        raise typer.Exit(ProviderError.exit_code)


def _per_cloud(leftovers: list[Leftover]) -> list[dict[str, Any]]:
    """Per cloud: how many leftovers, how many ended, and the $/h they cost while left (the
    priced ones: a disk or NIC alone counts 0; an unknown price is left out and counted)."""
    clouds: dict[str, dict[str, Any]] = {}
    for leftover in leftovers:
        row = clouds.setdefault(
            leftover.cloud,
            {"cloud": leftover.cloud, "leftovers": 0, "ended": 0, "usd_per_hour": 0.0, "unpriced": 0},
        )
        row["leftovers"] += 1
        row["ended"] += int(leftover.ended)
        if leftover.usd_per_hour is None:
            row["unpriced"] += 1
        else:
            row["usd_per_hour"] += leftover.usd_per_hour
    return [clouds[c] for c in sorted(clouds)]


@app.command("status")
def status(ctx: typer.Context, fmt: FormatOption = Format.TABLE) -> None:
    """Who leads, the last round, jobs by state and the moves under way (the next actions)."""
    db = state(ctx).db()
    leader = read_leader(db)
    with db.session() as session:
        tick = session.scalar(
            select(DaemonTick).order_by(DaemonTick.started_at.desc(), DaemonTick.id.desc()).limit(1)
        )
        by_state = {
            str(s): int(n)
            for s, n in session.execute(select(ManagedJob.state, func.count()).group_by(ManagedJob.state))
        }
        open_moves = [
            {"job": name, "kind": m.kind, "step": m.step, "reason": m.reason, "since": m.created_at}
            for m, name in session.execute(
                select(JobMove, ManagedJob.name)
                .join(ManagedJob, ManagedJob.id == JobMove.job_id)
                .where(JobMove.outcome.is_(None))
                .order_by(JobMove.id)
            )
        ]
        last = (
            {
                "started_at": tick.started_at,
                "finished_at": tick.finished_at,
                "host": tick.host,
                "pid": tick.pid,
                "dry_run": tick.dry_run,
                **(json.loads(tick.summary) if tick.summary else {}),
            }
            if tick is not None
            else None
        )
        waiting = _waiting(session)
        sinks = _sinks(session)
    alive = None if leader is None else _alive(leader)
    data = {
        "leader": None
        if leader is None
        else {"host": leader.host, "pid": leader.pid, "since": leader.since, "alive": alive},
        "last_tick": last,
        "jobs": by_state,
        "open_moves": open_moves,
        "waiting": waiting,
        "notify_sinks": sinks,
    }
    if fmt is Format.JSON:
        sys.stdout.write(to_json(data) + "\n")
        return
    now = datetime.now(UTC)
    if leader is None:
        lead = "none: no daemon runs now (`spotopt daemon run` starts one)"
    else:
        lead = (
            f"{leader.host} pid {leader.pid}, since {_when(leader.since, now)}"
            + {
                True: "",
                False: " (that process is gone: it died without handing over; the next daemon takes over)",
                None: " (on another host: not checked)",
            }[alive]
        )
    if last is None:
        round_ = "never"
    elif last["finished_at"] is None:
        round_ = f"started {_when(last['started_at'], now)}, did not finish (see the daemon's log)"
    else:
        round_ = f"{_when(last['started_at'], now)}, finished" + (" (dry run)" if last["dry_run"] else "")
    rows = [
        {"field": "leader", "value": lead},
        {"field": "last round", "value": round_},
        {"field": "jobs", "value": ", ".join(f"{k} {v}" for k, v in sorted(by_state.items())) or "none"},
        {"field": "swept last round", "value": _swept(last)},
        {"field": "notifications", "value": _sinks_line(sinks)},
    ]
    if fmt is Format.CSV:  # one CSV document: the moves as rows of the same two columns
        rows += [
            {
                "field": "move",
                "value": f"{m['job']} {m['kind']} step {m['step']}: {m['reason']} "
                f"since {iso(cast(datetime, m['since']))}",
            }
            for m in open_moves
        ]
        rows += [{"field": "waiting", "value": f"{w['job']} {w['state']}: {w['why']}"} for w in waiting]
        render(rows, fmt, title="Daemon")
        return
    render(rows, fmt, title="Daemon")
    if waiting:
        render(
            [w | {"since": _when(w["since"], now)} for w in waiting],
            fmt,
            title="Jobs waiting, and why",
            columns=("job", "state", "since", "why"),
        )
    render(
        open_moves,
        fmt,
        title="Moves under way (next actions)",
        empty="none",
        columns=("job", "kind", "step", "reason", "since"),
    )


def _sinks(session: Session) -> list[dict[str, Any]]:
    """Each notification sink the daemon has used: its run of failures, whether that run is long
    enough to report (``notify_failures_alert``), its last error and what it has yet to get."""
    alert = Settings().notify_failures_alert
    return [
        {
            "sink": row.name,
            "failing": row.failures_in_a_row >= alert,
            "failures_in_a_row": row.failures_in_a_row,
            "last_error": row.last_error,
            "last_delivered_at": row.last_delivered_at,
            "undelivered": undelivered(session, row.name),
        }
        for row in session.scalars(select(NotifySink).order_by(NotifySink.name))
    ]


def _sinks_line(sinks: list[dict[str, Any]]) -> str:
    """The sinks in one line: each one's state, a failing one with its last error."""
    if not sinks:
        return "no sink has been used (docs/guides/notifications.md)"
    return "; ".join(
        f"{s['sink']} FAILING ({s['failures_in_a_row']} in a row: {s['last_error']}), "
        f"{s['undelivered']} waiting"
        if s["failing"]
        else f"{s['sink']} ok, {s['undelivered']} waiting"
        for s in sinks
    )


def _hours(text: str, option: str, *, zero: bool = False) -> float:
    """A duration option in hours; above zero unless ``zero`` allows it."""
    hours = parse_duration(text, option).total_seconds() / 3600.0
    if hours < 0 or (hours == 0 and not zero):
        raise InputError(f"{option}: {text!r} must be longer than 0s")
    return hours


WAITING = ("pending", "recovering", "over-budget")
"""Job states in which a job runs nowhere until something changes (a round, a budget)."""


def _waiting(session: Session) -> list[dict[str, Any]]:
    """The jobs that run nowhere and why, newest word first: the last move that failed or was
    aborted (no capacity, a budget, a launch refused) when it is newer than the job's last
    transition, else that transition's reason."""
    found = []
    for job in session.scalars(
        select(ManagedJob).where(ManagedJob.state.in_(WAITING)).order_by(ManagedJob.id)
    ):
        event = session.scalar(
            select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.at.desc(), JobEvent.id.desc())
        )
        move = session.scalar(
            select(JobMove)
            .where(JobMove.job_id == job.id, JobMove.outcome.in_(("failed", "aborted")))
            .order_by(JobMove.id.desc())
        )
        why, since = (event.reason, event.at) if event is not None else ("submitted", job.created_at)
        if move is not None and move.finished_at is not None and move.finished_at >= since:
            why, since = f"{move.kind} {move.outcome}: {move.detail}", move.finished_at
        if job.state == "pending" and event is not None and event.reason == "submitted" and move is None:
            why = "submitted; no round has placed it yet (is a daemon running, and is any market priced?)"
        found.append({"job": job.name, "state": job.state, "since": since, "why": why})
    return found


def _alive(leader: LeaderRecord) -> bool | None:
    """Whether the recorded leader's process still runs (None: on another host, not checked)."""
    if leader.host != socket.gethostname():
        return None
    try:
        os.kill(leader.pid, 0)  # signal 0: no signal, only the check that the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _when(at: datetime, now: datetime) -> str:
    """A time for a person: ``2026-11-25 05:19 UTC (3 min ago)``."""
    ago = max(0.0, (now - at).total_seconds())
    span = f"{ago:.0f} s" if ago < 120 else f"{ago / 60:.0f} min" if ago < 7200 else f"{ago / 3600:.1f} h"
    return f"{at:%Y-%m-%d %H:%M} UTC ({span} ago)"


def _swept(last: dict[str, Any] | None) -> str:
    """The last round's sweep in one line: how many leftovers, ended, and their $/h."""
    swept = (last or {}).get("swept") or []
    if not swept:
        return "nothing" if last is not None else "never"
    ended = sum(1 for row in swept if row.get("action") == "terminated")
    hourly = sum(row.get("usd_per_hour") or 0.0 for row in swept)
    return f"{len(swept)} billing with no live placement, {ended} terminated ({usd(hourly)}/h)"


@app.command("replay")
def replay_cmd(
    ctx: typer.Context,
    jobs_file: Annotated[Path, typer.Argument(metavar="JOBS.yaml", help="Job spec (any what-if job file).")],
    start: Annotated[
        str | None,
        typer.Option(help="Simulated start (ISO 8601); default: one window before the latest price."),
    ] = None,
    preemptions: Annotated[
        str,
        typer.Option(
            help="Preemptions, the what-if's table: none, model (drawn from the rates, --seed) or "
            "replay (the recorded ones)."
        ),
    ] = "none",
    seed: Annotated[int, typer.Option(min=0, help="Seed for --preemptions model.")] = 0,
    example: Annotated[
        bool,
        typer.Option(
            "--example", help="Replay over the bundled SYNTHETIC example market instead of the history."
        ),
    ] = False,
    keep: Annotated[
        Path | None,
        typer.Option(
            "--keep",
            help="Keep the replay's database, store and logs in this new directory (default: thrown away).",
        ),
    ] = None,
    wide: WideOption = False,
    fmt: FormatOption = Format.TABLE,
) -> None:
    """Replay the jobs through the what-if engine and through the real daemon (local processes, a
    simulated clock) from the same start, on a throwaway copy of the history; compare per job."""
    import tempfile
    from contextlib import AbstractContextManager, nullcontext

    from spotopt.jobspec import load_jobs
    from spotopt.replay.harness import COLUMNS as FIDELITY_COLUMNS
    from spotopt.replay.harness import FidelityRequest, fidelity
    from spotopt.whatif.replay import example_history

    request = FidelityRequest(
        spec=load_jobs(jobs_file),
        start=parse_time(start, "--start"),
        preemptions=_preemption_mode(preemptions),
        seed=seed,
    )
    if keep is not None:
        directory(keep, "--keep", new=True)
    history: AbstractContextManager[Database] = example_history() if example else nullcontext(state(ctx).db())
    workdir: AbstractContextManager[str] = (
        nullcontext(str(keep)) if keep is not None else tempfile.TemporaryDirectory(prefix="spotopt-replay-")
    )
    with history as db, workdir as tmp, _replay_progress() as on_round:
        result = fidelity(db, request, Path(tmp), on_round)
    if fmt is Format.JSON:
        sys.stdout.write(to_json(result.rows) + "\n")
        return
    title = (
        f"What-if (spotopt) vs the replayed daemon from {result.whatif.first_start:%Y-%m-%d %H:%M} UTC, "
        f"preemptions {preemptions}"
    )
    if fmt is Format.CSV:
        render(result.rows, fmt, columns=FIDELITY_COLUMNS)
        return
    render(
        [_side_by_side(r) for r in result.rows],
        fmt,
        title=title,
        caption="predicted → realised (Δ relative); moves and preemptions predicted/realised",
        wide_only=("egress $", "failed moves"),
        wide=wide,
    )


def _side_by_side(row: dict[str, Any]) -> dict[str, Any]:
    """One fidelity row for people: each predicted figure beside the realised one."""

    def pair(pred: float, real: float, fmt: str, unfinished: str) -> str:
        return f"{_num(pred, fmt, unfinished)} → {_num(real, fmt, unfinished)}"

    return {
        "job": row["job"],
        "cost $": pair(row["predicted_cost_usd"], row["realised_cost_usd"], ".2f", "–"),
        "Δ cost": _pct(row["cost_diff"]),
        "finish h": pair(row["predicted_finish_hours"], row["realised_finish_hours"], ".1f", "never"),
        "Δ finish": _pct(row["finish_diff"]),
        "moves": f"{row['predicted_moves']}/{row['realised_moves']}",
        "preemptions": f"{row['predicted_preemptions']}/{row['realised_preemptions']}",
        "egress $": _num(row["predicted_egress_usd"], ".2f", "–"),
        "failed moves": row["failed_moves"],
    }


def _num(x: float, fmt: str, unfinished: str) -> str:
    """``x`` as ``fmt``; ``unfinished`` for the infinity of a job that did not finish."""
    return format(x, fmt) if math.isfinite(x) else unfinished


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:+.2f} %"


@contextmanager
def _replay_progress() -> Iterator[Any]:
    """A progress bar over simulated time on stderr (a terminal only); yields the round hook."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    with Progress(
        TextColumn("[bold]replay[/bold] {task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    ) as progress:
        task = progress.add_task("starting", total=1.0)

        def on_round(now: datetime, first: datetime, end: datetime) -> None:
            done = (now - first) / (end - first) if end > first else 1.0
            progress.update(task, completed=done, description=f"simulated {now:%Y-%m-%d %H:%M} UTC")

        yield on_round
