"""``spotopt throughput profile``: run a job briefly on one GPU model and store what it measured.

Each run is one placement through the provider interface the daemon uses (``local`` runs the
job as a process on this machine, a cloud provider on the market's instance): the job starts from
an empty checkpoint store of its own (``profile-<token>``, so it neither resumes from nor writes
into the job's real checkpoints), its agent heartbeats every ``BEAT_S``, and the run ends once
``steps`` steps (or ``seconds`` seconds) past the warm-up were reported, when the job exits, or
at the run's time limit (what the budget leaves, at most ``LONGEST_S``, less ``STOP_S`` to end
the instance). The instance is terminated in a ``finally``, so an error or Ctrl-C ends it too
(by the id its launch returned: a cloud may not list it yet); one left by a killed command
(SIGKILL: no ``finally`` runs) is ended by the leak sweep once older than ``LEFTOVER_AFTER_S``.

On a cloud the instance is launched by the provider the daemon uses, so it carries what the
daemon's launches carry (the start-up script's pinned, sha256-checked install of the daemon's
own wheel and lock: ``spotopt.clouds.common.bootstrap``), and its agent's heartbeats come
through the job's checkpoint store. Before terminating, the profile fences the agent (a lease
of epoch 1 over its epoch 0), so the SIGTERM of the instance's shutdown writes no checkpoint,
and the store's ``profile-<token>`` prefix is removed only once the agent has fallen silent
(a cloud's terminate returns while the guest still runs). Runs are priced on the provider's
own clouds only: the history holds every cloud's list prices, and ``--provider aws`` cannot
launch a GCP market.

The steps/s come from the heartbeats' (time, step) pairs through ``spotopt.agent.steady``, the
rule the agent's own heartbeat rate follows: the first ``warmup_steps`` steps are left out.

Money: a run is priced as the cheapest market in the history with the GPU model and at least the
GPU count (the whole instance bills), under the cloud's billing rule (its minimum included). A
run's expected length is the job's ``restart_s`` (start-up) plus its steps at the low end of the
figure known before (or ``seconds``); the runs together must fit ``budget_usd`` before any
starts, and each run is stopped when its share of what is left would be spent.

It lives with the mover, not with the throughput model: it launches and prices instances
(providers, billing, the history), which the model, a base module, may not import.
"""

from __future__ import annotations

import shlex
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from tempfile import TemporaryDirectory

from sqlalchemy.orm import Session

from spotopt.agent.steady import SteadyRate, steady_rate
from spotopt.catalog import gpu_matches
from spotopt.checkpoints import Location, grant_lease, read_heartbeat, store_url
from spotopt.clouds.common.base import DATABASE_TAG, InstanceState, LaunchSpec, Provider, market_label
from spotopt.db.identity import database_id
from spotopt.db.queries import MarketFilter, Quote, prices_at
from spotopt.errors import InputError
from spotopt.history.throughput_store import import_rows, stored_figures, validate_row
from spotopt.jobspec import Job
from spotopt.mover.billing import interval_cost_usd
from spotopt.mover.ledger import market_key
from spotopt.render import usd
from spotopt.throughput import Figure, JobThroughput
from spotopt.types import MarketKey

BEAT_S = 1.0
"""The agent's heartbeat and poll period during a profile (30 s in production): a step count
every second, so the run stops within about a second of having measured enough."""
LONGEST_S = 900.0
"""No run lasts longer, budget or not: a job that never gets past its warm-up must not bill on."""
PROFILE_TAG = "spotopt:profile"
"""The tag on a run's instance (its value: the job's name), beside this database's id
(``DATABASE_TAG``): what the leak sweep (``spotopt.mover.sweep``) knows a profile's instance by."""
LEFTOVER_AFTER_S = LONGEST_S + 600.0
"""A profile's instance older than this is a leftover of a command that was killed (SIGKILL, a
lost machine) before its ``finally`` could end it: no run lasts past ``LONGEST_S`` from before
its launch, and ten minutes more cover a cloud's slow launch and terminate."""
DEFAULT_STEPS = 100
STOP_S = 5.0
"""A run stops measuring this long before its time limit: ending the instance (the last status
call, the terminate; a cloud's API answers in about a second, more with a retry) is billed too,
and the budget's limit is on what is billed."""
QUIET_S = 3 * BEAT_S
"""A cloud instance's agent that wrote no heartbeat for this long after the fence has stopped
writing (it polls the lease every ``BEAT_S``): only then is the profile's store removed."""
QUIET_LIMIT_S = 60.0
"""The longest the removal waits for that silence (an agent stuck in a write)."""


@dataclass(frozen=True, slots=True)
class Run:
    """One profile to do: a job on ``gpu_count`` GPUs of ``gpu_model``, priced as ``quote``."""

    job: Job
    workdir: Path
    gpu_model: str
    gpu_count: int
    quote: Quote
    market: MarketKey
    before: Figure | None
    """What the model said before the run (the estimate whose error the run shows)."""
    expected_s: float
    expected_usd: float
    database_id: str
    """The history's id (``spotopt.db.identity``), tagged on the run's instance so that this
    database's sweep ends it if the command is killed, and no other database's does."""


@dataclass(frozen=True, slots=True)
class Result:
    run: Run
    rate: SteadyRate | None
    ran_s: float
    cost_usd: float
    ended: str
    """Why the run ended: ``measured``, ``job exited``, ``time limit``."""
    heartbeats: int
    """Distinct heartbeats read: none means the job never reported (an instance that did not
    boot, install or start it), as opposed to too few past the warm-up."""

    def row(self, warmup_steps: int) -> dict[str, object]:
        run, before = self.run, self.run.before
        measured = None if self.rate is None else self.rate.steps_per_s
        low, high = before.interval if before is not None else (None, None)
        return {
            "job": run.job.name,
            "gpu_model": run.gpu_model,
            "gpu_count": run.gpu_count,
            "steps_per_s": measured,
            "estimated": None if before is None else before.steps_per_s,
            "low": low,
            "high": high,
            "estimate_source": None if before is None else before.source,
            "error": (None if before is None or not measured else before.steps_per_s / measured - 1.0),
            "steps": None if self.rate is None else self.rate.steps,
            "seconds": None if self.rate is None else round(self.rate.seconds, 3),
            "warmup_steps": warmup_steps,
            "market": market_label(run.market),
            "usd_per_hour": run.quote.usd_per_hour,
            "cost_usd": self.cost_usd,
            "ended": self.ended,
            "heartbeats": self.heartbeats,
        }


def cheapest_quote(
    session: Session, gpu_model: str, gpu_count: int, now: datetime, clouds: Collection[str] | None = None
) -> Quote:
    """The cheapest market in the history whose instance holds ``gpu_count`` GPUs of ``gpu_model``,
    on one of ``clouds`` (None: any; a cloud provider can only launch in its own clouds' markets,
    and the history holds every cloud's list prices)."""
    quotes = [
        q
        for q in prices_at(session, now, MarketFilter())
        if q.gpu is not None
        and (gpu_matches(q.gpu, gpu_model) or gpu_matches(gpu_model, q.gpu))  # a family row, or exact
        and (q.gpu_count or 0) >= gpu_count
        and (clouds is None or q.cloud in clouds)
    ]
    if not quotes:
        where = "" if clouds is None else f" on {', '.join(sorted(clouds))}"
        raise InputError(
            f"--gpu {gpu_model}: the history has no price of an instance with {gpu_count} such GPU(s)"
            f"{where}; run spotopt collect or spotopt import first"
        )
    return min(quotes, key=lambda q: (q.usd_per_hour, q.market_id))


def plan_runs(
    session: Session,
    jobs: list[Job],
    workdir: Path,
    gpu_model: str,
    counts: list[int],
    *,
    steps: int | None,
    seconds: float | None,
    warmup_steps: int,
    budget_usd: float | None,
    now: datetime,
    clouds: Collection[str] | None = None,
) -> list[Run]:
    """Every (job, count) run, priced on the cheapest market of ``clouds`` (None: any); an
    ``InputError`` when they would cost more than ``budget_usd`` or a job has no command."""
    figures = stored_figures(session)
    runs = []
    for i, job in enumerate(jobs):
        if not job.run:
            raise InputError(f"jobs[{i}].run: {job.name} has no command; profiling runs the job")
        book = JobThroughput(job, figures)
        for count in counts:
            quote = cheapest_quote(session, gpu_model, count, now, clouds)
            before = book.at(gpu_model, count)
            if seconds is not None:
                work_s = seconds
            elif before is not None:
                work_s = (warmup_steps + (steps or DEFAULT_STEPS)) / before.interval[0]
            else:
                work_s = LONGEST_S  # nothing says how fast it goes: the longest a run may take
            expected_s = min(job.restart_s + work_s, LONGEST_S)
            cost = interval_cost_usd(
                quote.cloud, quote.usd_per_hour, now, now + timedelta(seconds=expected_s)
            )
            runs.append(
                Run(
                    job,
                    workdir,
                    gpu_model,
                    count,
                    quote,
                    market_key(session, quote.market_id),
                    before,
                    expected_s,
                    cost,
                    database_id(session),
                )
            )
    total = sum(r.expected_usd for r in runs)
    if budget_usd is not None and total > budget_usd:
        longest = max(runs, key=lambda r: r.expected_s)
        raise InputError(
            f"--budget-usd: {len(runs)} profile run(s) would cost about {usd(total)} "
            f"(up to {longest.expected_s:.0f} s each at {usd(longest.quote.usd_per_hour)}/h on "
            f"{market_label(longest.market)}, minimum billing included), above {usd(budget_usd)}; "
            "raise --budget-usd or profile fewer --steps, --seconds or --counts"
        )
    return runs


@contextmanager
def _store(run: Run, provider: Provider, name: str) -> Iterator[Location]:
    """The profile's own store: a temporary directory for processes on this machine, else job
    ``name`` beside the job's checkpoints, removed afterwards."""
    if not provider.runs_on_market:
        with TemporaryDirectory(prefix="spotopt-profile-") as tmp:
            yield Location(f"file://{tmp}")
        return
    if run.job.checkpoint is None:
        raise InputError(
            f"{run.job.name}: checkpoint.uri is required to profile on {provider.name}: "
            "the instance writes its heartbeats there"
        )
    loc = Location(store_url(run.job.checkpoint.uri, run.workdir))
    try:
        yield loc
    finally:
        _await_silence(loc, name)
        loc.remove(loc.path(name))


def _await_silence(loc: Location, name: str) -> None:
    """Wait (at most ``QUIET_LIMIT_S``) until the run's heartbeat has not changed for ``QUIET_S``.

    A cloud's terminate returns while the instance's processes still run (EC2: ``shutting-down``);
    its agent stops writing once it has read the fence ``profile`` leaves, and one that saw it
    never writes again, fence or not. A store removed before that would get the agent's last
    heartbeat, or the checkpoint its SIGTERM asks for, written into it afterwards, for good."""
    start = changed = time.monotonic()
    last = read_heartbeat(loc, name, 0)
    while time.monotonic() - changed < QUIET_S and time.monotonic() - start < QUIET_LIMIT_S:
        time.sleep(BEAT_S / 4)
        beat = read_heartbeat(loc, name, 0)
        if beat != last:
            last, changed = beat, time.monotonic()


def profile(
    provider: Provider,
    run: Run,
    *,
    steps: int | None,
    seconds: float | None,
    warmup_steps: int,
    limit_s: float,
    clock: Callable[[], float] = time.monotonic,
    wait: Callable[[float], None] = time.sleep,
) -> Result:
    """Launch ``run``, read its heartbeats until enough was measured (or the job exited, or
    ``limit_s`` passed), terminate every instance of the run whatever happens (a launch that
    failed after starting one too), and return the steady rate."""
    name = f"profile-{uuid.uuid4().hex[:16]}"
    with _store(run, provider, name) as loc:
        spec = LaunchSpec(
            job=name,
            epoch=0,
            command=tuple(shlex.split(run.job.run or "")),
            checkpoint_uri=loc.url,
            checkpoint_every_s=LONGEST_S,  # a checkpoint write would be measured as slow steps
            env={
                "SPOTOPT_POLL_EVERY": f"{BEAT_S:g}s",
                "SPOTOPT_HEARTBEAT_EVERY": f"{BEAT_S:g}s",
                "SPOTOPT_MARKET": market_label(run.market),
                "SPOTOPT_GPUS": str(run.gpu_count),
            },
            workdir=str(run.workdir),
            tags={PROFILE_TAG: run.job.name, DATABASE_TAG: run.database_id},
        )
        reports: list[tuple[float, int]] = []
        ended = "time limit"

        def heard() -> None:
            beat = read_heartbeat(loc, name, 0)
            if beat is not None and (not reports or beat.at.timestamp() > reports[-1][0]):
                reports.append((beat.at.timestamp(), beat.step))

        launched: list[str] = []
        reclaimed = False  # the market took the instance back: a spot interruption bills by its own rule
        started_at, start = datetime.now(UTC), clock()
        try:
            instance = provider.launch(spec, run.market, name)
            launched.append(instance.instance_id)
            while clock() - start < limit_s - STOP_S:
                heard()
                rate = steady_rate(reports, 0, warmup_steps)
                if rate is not None and (
                    rate.seconds >= seconds if seconds is not None else rate.steps >= (steps or DEFAULT_STEPS)
                ):
                    ended = "measured"
                    break
                status = provider.status(instance.instance_id)
                if status.state not in (InstanceState.PENDING, InstanceState.RUNNING):
                    reclaimed = status.state is InstanceState.PREEMPTED
                    code = "" if status.exit_code is None else f", status {status.exit_code}"
                    ended = f"job exited ({status.state}{code})"
                    break
                wait(BEAT_S / 4)
        finally:
            try:  # fence the agent (its epoch 0 superseded): nothing more, no SIGTERM checkpoint
                grant_lease(loc, name, datetime.now(UTC), epoch=1)
            finally:
                _terminate(provider, name, launched)
            ended_at = datetime.now(UTC)
        heard()  # the last word: a stopped or finished agent's final heartbeat
    cost = interval_cost_usd(
        run.quote.cloud, run.quote.usd_per_hour, started_at, ended_at, interrupted_by_cloud=reclaimed
    )
    rate = steady_rate(reports, 0, warmup_steps)
    return Result(run, rate, (ended_at - started_at).total_seconds(), cost, ended, len(reports))


def _terminate(provider: Provider, name: str, launched: list[str]) -> None:
    """End every instance of the run: first the launched id itself (it bills until then; and a
    cloud may not list an instance launched moments ago: EC2's eventual consistency), then any
    other the listing shows (one a launch started before it failed)."""
    for instance_id in launched:
        provider.terminate(instance_id)
    for instance in provider.list_instances(job=name):
        if instance.instance_id not in launched:
            provider.terminate(instance.instance_id)


def store_result(session: Session, result: Result, warmup_steps: int, at: datetime) -> None:
    """Keep a run's rate as the job's ``measured`` figure on that GPU model and count (replacing
    the one there: a profile is a deliberate measurement; the daemon's heartbeats then refine it)."""
    rate, run = result.rate, result.run
    if rate is None or rate.steps_per_s <= 0:
        return
    note = (
        f"profiled {at:%Y-%m-%d %H:%M} UTC: {rate.steps} steps in {rate.seconds:.1f} s "
        f"after {warmup_steps} warm-up steps (spotopt throughput profile)"
    )
    row = validate_row(
        f"profile of {run.job.name}",
        {
            "workload": run.job.store_name,
            "gpu_model": run.gpu_model,
            "gpu_count": run.gpu_count,
            "steps_per_s": rate.steps_per_s,
            "source": "measured",
            "note": note,
        },
    )
    import_rows(session, [row], now=at)
