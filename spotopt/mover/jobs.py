"""Managed jobs: what the mover has been asked to run, and every state it has been in.

A managed job is one job of the planner's spec plus what it takes to run it (``run``,
``checkpoint: {uri, every}``, ``budget_usd``, optional ``max_usd_per_hour``). It is stored
validated, as canonical JSON, with the sha256 of that JSON *without its budget fields*: the
budget lives in the row and ``set_budget`` (``spotopt jobs budget``) changes it, in the row and
in the stored spec alike, so re-submitting the original file after a budget change is still the
same job (a no-op that keeps the budget in effect, with a warning) while any other difference
under the same name is refused. Its state changes only through
``record_transition``, which checks ``TRANSITIONS`` and writes a ``job_events`` row: the
executor and the CLI share that one path, so no transition goes unrecorded or unchecked.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from spotopt.agent.config import JOB_NAME
from spotopt.checkpoints.location import Location, store_url
from spotopt.checkpoints.store import parse_checkpoint_name
from spotopt.db.engine import Database
from spotopt.db.models import JOB_STATES, InstanceType, JobEvent, ManagedJob, Market, Placement
from spotopt.errors import ConfigError, InputError, one_line
from spotopt.history.throughput_store import stored_figures
from spotopt.jobspec import MAX_USD, Job, Retry, load_jobs, parse_jobs, read_yaml
from spotopt.mover.ledger import interval, price_in_effect, spent_usd
from spotopt.notify import outbox
from spotopt.price import per_slot, usd_for
from spotopt.render import shown, usd
from spotopt.throughput import JobThroughput

__all__ = [
    "JOB_STATES",
    "TERMINAL",
    "TRANSITIONS",
    "BudgetChange",
    "TransitionError",
    "after_failure",
    "cancel",
    "check_transition",
    "events",
    "find_job",
    "get_job",
    "job_events",
    "job_spec",
    "list_jobs",
    "record_transition",
    "resume",
    "retries_in_a_row",
    "set_budget",
    "submit",
]

log = logging.getLogger("spotopt")

BUDGET_FIELDS = ("budget_usd", "max_usd_per_hour")
"""Spec fields that live in the row and may change after submission (not part of the hash)."""

TRANSITIONS: dict[str, frozenset[str]] = {
    # Waiting for the planner to pick a market; the budget may already be spent (a resubmission).
    "pending": frozenset({"launching", "cancelled", "failed", "over-budget"}),
    # A launch in flight: up, back to pending (no capacity), or preempted before it came up.
    "launching": frozenset({"running", "pending", "recovering", "failed", "cancelled", "over-budget"}),
    "running": frozenset({"moving", "recovering", "done", "failed", "cancelled", "over-budget"}),
    # A voluntary move ends running (done, or aborted where it was) or becomes a recovery when a
    # preemption notice arrives mid-move.
    "moving": frozenset({"running", "recovering", "done", "failed", "cancelled", "over-budget"}),
    # Emergency checkpoint and relaunch: running again, relaunching, or nowhere left to run.
    "recovering": frozenset({"launching", "running", "pending", "failed", "cancelled", "over-budget"}),
    # Stopped at its budget; runs again only when the budget is raised (back to pending).
    "over-budget": frozenset({"pending", "cancelled"}),
    "done": frozenset(),
    # Final for the daemon; ``spotopt jobs retry`` (``resume``) alone takes them back to pending.
    "failed": frozenset({"pending"}),
    "cancelled": frozenset({"pending"}),
}
"""Which state may follow which; the only source of truth (the CLI and the executor use it)."""

TERMINAL = frozenset({"done", "failed", "cancelled"})
"""States the daemon never takes a job out of (a person may resume a failed or cancelled one)."""


class TransitionError(InputError):
    """A state change that ``TRANSITIONS`` does not allow (e.g. cancelling a finished job)."""


def check_transition(from_state: str, to_state: str) -> None:
    """Raise ``TransitionError`` unless ``from_state`` → ``to_state`` is allowed."""
    for state in (from_state, to_state):
        if state not in TRANSITIONS:
            raise TransitionError(f"state: {state!r} is not a job state; use one of {', '.join(JOB_STATES)}")
    allowed = TRANSITIONS[from_state]
    if to_state not in allowed:
        if from_state in TERMINAL:
            after = "that state is final" + (
                " (`spotopt jobs retry NAME` resumes it from its newest verified checkpoint)"
                if allowed
                else ""
            )
        else:
            after = f"it may only become {', '.join(sorted(allowed))}"
        raise TransitionError(f"a {from_state} job cannot become {to_state}: {after}")


def record_transition(
    session: Session,
    job: ManagedJob,
    to_state: str,
    reason: str,
    at: datetime | None = None,
    *,
    announce: bool = True,
    payload: dict[str, Any] | None = None,
) -> JobEvent:
    """Move ``job`` to ``to_state`` and record the event, inside the caller's transaction, with
    the notification it calls for (``notice_kind``) in the outbox of that same transaction.
    ``announce=False``: the change is no news (a voluntary move aborted where the job runs);
    ``payload``: what the caller knows beyond the state (the move's saving, a log's tail)."""
    if not reason.strip():
        raise InputError("reason: give a reason for the state change")
    try:
        check_transition(job.state, to_state)
    except TransitionError as exc:
        raise TransitionError(f"job {job.name!r}: {exc}") from None
    at = at or datetime.now(UTC)
    event = JobEvent(job_id=job.id, at=at, from_state=job.state, to_state=to_state, reason=reason)
    kind = notice_kind(job.state, to_state, reason) if announce else None
    job.state = to_state
    job.updated_at = at
    session.add(event)
    if kind is not None:
        facts = {"reason": reason, "from_state": event.from_state, "to_state": to_state, **(payload or {})}
        if kind in ("job.done", "job.failed", "job.cancelled"):
            facts["total_usd"] = round(spent_usd(session, job.id, at), 6)
        if kind == "job.done":
            on_demand = on_demand_usd(session, job.id, at)
            facts["on_demand_usd"] = None if on_demand is None else round(on_demand, 6)
            facts["saving_vs_on_demand_usd"] = (
                None if on_demand is None else round(on_demand - facts["total_usd"], 6)
            )
        if kind == "budget.threshold":
            facts.update(percent=100, budget_usd=job.budget_usd)
        outbox.add(session, kind, at, job=job, payload=facts, dedupe=_dedupe(kind, job))
    return event


def on_demand_usd(session: Session, job_id: int, at: datetime) -> float | None:
    """What the job's billed time would have cost on the on-demand market of each placement's
    instance type and region, at its price then, slot for slot (None: one of them has no
    on-demand price in the history). ``job.done`` tells the saving against it: the total the
    ledger billed, egress included, an on-demand run that never moved would not have paid."""
    total = 0.0
    placements = session.scalars(
        select(Placement).where(Placement.job_id == job_id, Placement.started_at.is_not(None))
    ).all()
    for placement, row in zip(placements, [interval(session, p, at) for p in placements], strict=True):
        market = session.get(Market, placement.market_id)
        assert market is not None
        on_demand = session.scalar(
            select(Market.id).where(
                Market.instance_type_id == market.instance_type_id,
                Market.region == market.region,
                Market.kind == "on-demand",
            )
        )
        if on_demand is None:
            return None
        end = row.ended_at or max(at, row.started_at)
        usd = price_in_effect(session, on_demand, row.started_at, end, math.nan)
        if math.isnan(usd):
            return None
        total += usd_for(per_slot(usd, placement.price.jobs_per_instance), row.billed_s)
    return total


def _dedupe(kind: str, job: ManagedJob) -> str | None:
    """The 100 % threshold is the one the 50 and 80 % checks share a key scheme with
    (``budget_dedupe``): a job stopped at its budget is told once per budget."""
    return budget_dedupe(job, 100) if kind == "budget.threshold" else None


def budget_dedupe(job: ManagedJob, percent: int) -> str:
    """The dedupe string of ``job``'s ``percent`` threshold of its current budget: raising the
    budget makes its thresholds news again."""
    return f"budget.threshold:{job.id}:{job.budget_usd!r}:{percent}"


def notice_kind(from_state: str, to_state: str, reason: str) -> str | None:
    """The notification a transition calls for (None: none): up after a start, a move or a
    recovery; a placement lost (preempted) or a try retried (an automatic retry's reason begins
    ``RETRY_REASON``); the final states; a job stopped at its budget (its 100 % threshold)."""
    if to_state == "running":
        return {"launching": "job.started", "moving": "job.moved", "recovering": "job.recovered"}.get(
            from_state
        )
    if to_state in ("recovering", "pending") and reason.startswith(RETRY_REASON):
        return "job.retried"
    if to_state == "recovering":
        return "job.preempted"
    if to_state == "over-budget":
        return "budget.threshold"
    return {"failed": "job.failed", "done": "job.done", "cancelled": "job.cancelled"}.get(to_state)


def _load(spec: str | Path, check_store: bool = True) -> tuple[Job, str | None, str]:
    """The one job of a spec file (``Path``) or YAML text (``str``), its directory and its source."""
    if isinstance(spec, Path):
        parsed, workdir, source = load_jobs(spec), str(spec.resolve().parent), str(spec)
    else:
        source = "the job spec"
        parsed, workdir = parse_jobs(read_yaml(spec, source), source), None
    if len(parsed.jobs) != 1:
        raise InputError(
            f"{source}: jobs: a managed job spec holds exactly one job (found {len(parsed.jobs)}); "
            "write one file per job"
        )
    job = parsed.jobs[0]
    where = f"jobs[0] ({shown(job.name)})"
    missing = [field for field in ("run", "checkpoint", "budget_usd") if getattr(job, field) is None]
    if missing:
        lines = "\n  ".join(f"{where}.{field}: is required for a managed job" for field in missing)
        raise InputError(f"{source}: invalid job spec:\n  {lines}")
    if not JOB_NAME.match(job.name):
        raise InputError(
            f"{source}: {where}.name: {job.name!r} is not a managed job name; "
            "use letters, digits, '.', '_' and '-' (it names the checkpoint directory)"
        )
    if check_store:
        _check_store(job, Path(workdir) if workdir else Path.cwd(), f"{source}: {where}.checkpoint.uri")
    return job, workdir, source


def _check_store(job: Job, base: Path, field: str) -> None:
    """Refuse a checkpoint store the job could never use, before it is stored: an unknown URL
    scheme, a back-end that is not installed, a local directory that cannot be made, a bucket
    that does not exist or refuses this process.

    Caught here, such a store fails the submit in one line; caught at run time it used to fail
    every daemon round, for every job. Where this machine cannot tell (no credentials for the
    cloud, no network: the daemon's machine may have both) the store is accepted with a
    warning."""
    assert job.checkpoint is not None
    url = store_url(job.checkpoint.uri, base)
    try:
        loc = Location(url, setting=field)
    except ConfigError as exc:
        raise InputError(str(exc)) from None
    except Exception as exc:  # a back-end that cannot even be built here (Azure without an account)
        log.warning("%s: %s not checked (%s)", field, url, one_line(exc))
        return
    try:
        loc.check_reachable()
    except ConfigError as exc:
        if loc.is_local or isinstance(exc.__cause__, (FileNotFoundError, PermissionError)):
            raise InputError(str(exc)) from None
        log.warning("%s: %s not checked (%s)", field, url, one_line(exc.__cause__ or exc))


def _check_placeable(session: Session, job: Job, where: str, at: datetime) -> None:
    """The checks ``spotopt plan`` makes, made at submit so a job the daemon could never place
    is refused in one line rather than left pending for ever: a deadline already past, no
    steps/s figure anywhere (the spec, or stored for its workload) are refused; ``allow``
    naming regions or instance types this history has never priced is warned about (their
    prices may be collected after the submit). On a history with no market at all (nothing
    collected yet) that check is skipped."""
    due = job.deadline_hours(at)
    if due is not None and due <= 0:
        raise InputError(
            f"{where}.deadline: {job.deadline} is already past (now {at:%Y-%m-%dT%H:%MZ}); give a later one"
        )
    if not JobThroughput(job, stored_figures(session)).points:
        raise InputError(
            f"{where}.throughput: no steps/s figure for this job in the spec or stored for workload "
            f"{job.store_name!r}; add throughput: {{V100: 2.4}} (steps/s on one GPU) or "
            "`spotopt throughput import`"
        )
    priced = session.execute(
        select(InstanceType.cloud, InstanceType.name, Market.region).join(
            Market, Market.instance_type_id == InstanceType.id
        )
    ).all()
    if not priced:
        return
    for field, wanted, known in (
        ("allow.regions", job.allow.regions, {region for *_c, region in priced}),
        ("allow.instance_types", job.allow.instance_types, {name for _c, name, _r in priced}),
    ):
        unknown = [value for value in wanted if value not in known]
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            log.warning(
                "%s.%s: %r has no market in this history; %sthe job waits until one is priced "
                "(`spotopt prices show` lists the priced ones)",
                where,
                field,
                unknown[0],
                hint,
            )


def _canonical(spec: dict[str, Any]) -> str:
    """A spec as JSON with sorted keys: the same spec always gives the same text."""
    return json.dumps(spec, sort_keys=True, separators=(",", ":"))


def _identity_sha256(spec: dict[str, Any]) -> str:
    """The sha256 that says whether two submissions are the same job: the canonical spec without
    ``BUDGET_FIELDS`` (the budget may be raised after submission without making it another job)."""
    kept = {k: v for k, v in spec.items() if k not in BUDGET_FIELDS}
    return hashlib.sha256(_canonical(kept).encode()).hexdigest()


def submit(
    db: Database,
    spec: str | Path,
    dry_run: bool = False,
    now: datetime | None = None,
    check_store: bool = True,
) -> ManagedJob:
    """Validate and store one managed job (state ``pending``); return it.

    ``spec`` is a job file (``Path``, its directory becomes the job's ``workdir``) or YAML text.
    Re-submitting an identical spec returns the stored job unchanged; a different spec under an
    existing name is an ``InputError``. ``dry_run`` validates and checks the name, stores nothing
    and returns the job as it would be stored (``id`` None). ``check_store=False`` skips the
    write probe of the checkpoint store (generated worlds whose stores are names only).
    """
    job, workdir, source = _load(spec, check_store)
    assert job.run is not None and job.checkpoint is not None and job.budget_usd is not None
    dumped = job.model_dump(mode="json")
    for newer in ("retry", "guardrails"):  # left out as before they existed: a stored job stays the same job
        if dumped[newer] is None:
            del dumped[newer]
    at = now or datetime.now(UTC)
    created = ManagedJob(
        name=job.name,
        spec_json=_canonical(dumped),
        spec_sha256=_identity_sha256(dumped),
        run_command=job.run,
        workdir=workdir,
        checkpoint_uri=job.checkpoint.uri,
        budget_usd=job.budget_usd,
        max_usd_per_hour=job.max_usd_per_hour,
        state="pending",
        created_at=at,
        updated_at=at,
    )
    with db.session() as session:
        _check_placeable(session, job, f"{source}: jobs[0] ({shown(job.name)})", at)
    try:
        return _store(db, created, source, dry_run)
    except IntegrityError:
        # Another process stored this name between our look-up and our insert (the unique
        # constraint caught it): compare with what it stored, as if it had come first.
        return _store(db, created, source, dry_run)


def _existing(session: Session, name: str) -> ManagedJob | None:
    return session.scalar(select(ManagedJob).where(ManagedJob.name == name))


def _store(db: Database, created: ManagedJob, source: str, dry_run: bool) -> ManagedJob:
    """Insert ``created`` with its first event, or return the identical stored job, in one transaction."""
    with db.session() as session:
        stored = _existing(session, created.name)
        if stored is not None:
            if (stored.spec_sha256, stored.workdir) != (created.spec_sha256, created.workdir):
                what = (
                    "spec" if stored.spec_sha256 != created.spec_sha256 else f"directory ({stored.workdir})"
                )
                raise InputError(
                    f"{source}: jobs[0].name: job {created.name!r} exists with another {what} "
                    f"(state {stored.state}); submit this one under a new name"
                )
            if (stored.budget_usd, stored.max_usd_per_hour) != (created.budget_usd, created.max_usd_per_hour):
                log.warning(
                    "job %r is already submitted with budget %s; the file's budget (%s) is not applied: "
                    "`spotopt jobs budget %s USD` changes it",
                    stored.name,
                    _budget_text(stored.budget_usd, stored.max_usd_per_hour),
                    _budget_text(created.budget_usd, created.max_usd_per_hour),
                    stored.name,
                )
            return stored
        if dry_run:
            return created
        session.add(created)
        session.flush()
        at = created.created_at
        session.add(
            JobEvent(job_id=created.id, at=at, from_state=None, to_state="pending", reason="submitted")
        )
    return created


def job_spec(job: ManagedJob) -> Job:
    """The validated spec a managed job was submitted with."""
    return Job.model_validate(json.loads(job.spec_json))


def list_jobs(db: Database, states: tuple[str, ...] = ()) -> list[ManagedJob]:
    """Managed jobs (in ``states`` when given), oldest first."""
    unknown = [s for s in states if s not in JOB_STATES]
    if unknown:
        raise InputError(f"--state: {unknown[0]!r} is not a job state; use one of {', '.join(JOB_STATES)}")
    query = select(ManagedJob).order_by(ManagedJob.created_at, ManagedJob.id)
    if states:
        query = query.where(ManagedJob.state.in_(states))
    with db.session() as session:
        return list(session.scalars(query))


def find_job(session: Session, name: str, lock: bool = False) -> ManagedJob:
    """The job called ``name`` in ``session`` (locked for update with ``lock``); ``InputError``
    naming ``NAME`` if there is none."""
    query = select(ManagedJob).where(ManagedJob.name == name)
    job = session.scalar(query.with_for_update() if lock else query)
    if job is None:
        raise InputError(f"NAME: no managed job named {name!r}; `spotopt jobs list` shows them")
    return job


def get_job(db: Database, name: str) -> ManagedJob:
    """The managed job called ``name``; ``InputError`` if there is none."""
    with db.session() as session:
        return find_job(session, name)


AT_ONCE = "at once, no checkpoint: "
"""How the reason of a cancellation made with ``jobs cancel --now`` begins: the daemon then
terminates the job's instance without asking its agent for a checkpoint (``cancelled_at_once``)."""


def cancel(
    db: Database, name: str, reason: str, now: datetime | None = None, *, at_once: bool = False
) -> ManagedJob:
    """Cancel ``name`` (recorded in ``job_events``); a finished or cancelled job is an error.
    ``at_once``: the daemon terminates its instance without the checkpoint-and-stop (a run
    that is wrong or costly, whose state is not worth the wait).

    One exception: a job cancelled without ``at_once`` whose placement is still up (its
    checkpoint-and-stop under way: a slow store, a long step) may be cancelled again
    ``at_once``. That escalation is recorded as a cancelled → cancelled event, the newest
    cancellation, so the daemon abandons the stop and halts the placement (``cancelled_at_once``).

    The row is locked (``SELECT … FOR UPDATE`` on PostgreSQL) so a concurrent executor
    transition cannot interleave between the check and the write.
    """
    with db.session() as session:
        job = find_job(session, name, lock=True)
        if at_once and job.state == "cancelled" and not cancelled_at_once(session, job):
            placement = session.get(Placement, job.placement_id) if job.placement_id else None
            if placement is None or placement.state not in ("launching", "running"):
                raise TransitionError(
                    f"job {name!r}: already cancelled and its placement has stopped; nothing to halt "
                    "(`spotopt jobs retry NAME` resumes it)"
                )
            at = now or datetime.now(UTC)
            session.add(
                JobEvent(
                    job_id=job.id, at=at, from_state=job.state, to_state=job.state, reason=AT_ONCE + reason
                )
            )
            job.updated_at = at
        else:
            record_transition(session, job, "cancelled", AT_ONCE + reason if at_once else reason, now)
    return job


def cancelled_at_once(session: Session, job: ManagedJob) -> bool:
    """Whether ``job``'s newest cancellation skips the checkpoint (``cancel(..., at_once=True)``)."""
    cancels = [e for e in job_events(session, job) if e.to_state == "cancelled"]
    return bool(cancels) and cancels[-1].reason.startswith(AT_ONCE)


RETRY_REASON = "retry "
"""How the reason of an automatic retry's transition begins (``retry 2 of 3: …``): its number is
the count ``retries_in_a_row`` reads back."""
_RETRY = re.compile(rf"^{RETRY_REASON}(\d+) of \d+: ")


def retries_in_a_row(session: Session, job: ManagedJob) -> int:
    """Automatic retries of ``job`` since it was submitted, last resumed by hand or last made
    progress: the number of its newest ``retry N of M`` since the newest resume (0: none).

    ``after_failure`` numbers a retry from 1 again after a try that made progress, so a job
    that crashes once a day after hours of training is not failed after ``retry.max`` days."""
    count = 0
    for event in job_events(session, job):
        if event.to_state == "pending" and event.from_state in TERMINAL:
            count = 0
        elif event.to_state in ("recovering", "pending") and (match := _RETRY.match(event.reason)):
            count = int(match.group(1))
    return count


def _try_progressed(session: Session, job: ManagedJob) -> bool:
    """Whether the try of ``job`` that just failed made progress that a retry keeps: the newest
    verified checkpoint the daemon read was written by the try's own placement (its name
    carries the writer's epoch), so the next try resumes past where this one started."""
    placement = session.get(Placement, job.placement_id) if job.placement_id is not None else None
    written = parse_checkpoint_name(job.checkpoint_name) if job.checkpoint_name else None
    return placement is not None and written is not None and written[1] == placement.epoch


def after_failure(
    session: Session,
    job: ManagedJob,
    why: str,
    exit_code: int | None,
    at: datetime,
    log_path: str | None = None,
) -> str:
    """Apply ``job``'s retry policy to a failed training process (``why``: what happened in one
    line; ``exit_code``: its status, None when it has none, as for a placement that never made
    progress; ``log_path``: where its output is, when known), inside the caller's transaction;
    the state it leaves the job in.

    A retry is a recorded transition whose reason begins ``retry N of M:``: back to
    ``recovering`` from a running job (the daemon places it again at once, like a preempted
    one), to ``pending`` from a start or recovery (the next round places it). The agent of the
    new placement resumes from the newest verified checkpoint. Retries count "in a row": a try
    that wrote a verified checkpoint starts the count again (``retries_in_a_row``). Otherwise
    the job fails, the reason saying why it was not retried."""
    policy = job_spec(job).retry or Retry()
    done = 0 if _try_progressed(session, job) else retries_in_a_row(session, job)
    if policy.retries(exit_code) and done < policy.max:
        to_state = "pending" if job.state in ("pending", "launching", "recovering") else "recovering"
        reason = f"{RETRY_REASON}{done + 1} of {policy.max}: {why}"
    else:
        to_state = "failed"
        if done:
            reason = f"{why} (after {done} retr{'y' if done == 1 else 'ies'})"
        elif policy.retries(exit_code):
            reason = f"{why} (retry.max is 0)"
        elif policy.on_exit_codes is not None:
            reason = f"{why} (not retried: not in retry.on_exit_codes)"
        else:
            reason = f"{why} (not retried: a retry does not cure that status)"
    if log_path is not None:
        reason += f"; its log: {log_path}"
    tail = log_tail(log_path) if log_path is not None else None
    record_transition(
        session, job, to_state, reason, at, payload=None if tail is None else {"log_tail": tail}
    )
    log.info("job %s: %s", job.name, reason)
    return to_state


LOG_TAIL_BYTES = 4000
"""How much of the end of a failed try's log its notification carries."""


def log_tail(path: str) -> str | None:
    """The last ``LOG_TAIL_BYTES`` of the log at ``path`` when this machine can read it (the local
    provider's; a cloud instance's log lives on the instance: None)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - LOG_TAIL_BYTES))
            return f.read().decode(errors="replace")
    except OSError:
        return None


def resume(db: Database, name: str, reason: str = "", now: datetime | None = None) -> ManagedJob:
    """Take a failed or cancelled job back to ``pending`` (``spotopt jobs retry``): the daemon
    places it again and its agent resumes from the newest verified checkpoint, which the store
    kept. A job whose instance the daemon is still stopping is refused until it has stopped."""
    with db.session() as session:
        job = find_job(session, name, lock=True)
        if job.state not in ("failed", "cancelled"):
            raise InputError(
                f"NAME: job {name!r} is {job.state}; only a failed or cancelled job can be retried"
            )
        busy = session.scalar(
            select(Placement.id).where(
                Placement.job_id == job.id, Placement.state.in_(("launching", "running"))
            )
        )
        if busy is not None:
            raise InputError(
                f"NAME: job {name!r} still has an instance the daemon is stopping; retry once it has stopped"
            )
        record_transition(session, job, "pending", reason or "retried by hand", now)
    return job


def events(db: Database, name: str) -> list[JobEvent]:
    """Every state transition of ``name``, in the order they happened."""
    with db.session() as session:
        return job_events(session, find_job(session, name))


def job_events(session: Session, job: ManagedJob) -> list[JobEvent]:
    """``job``'s transitions in ``session``, in the order they happened."""
    query = select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.at, JobEvent.id)
    return list(session.scalars(query))


@dataclass(frozen=True)
class BudgetChange:
    """What ``set_budget`` did: the job as it is now, its spend and its state before."""

    job: ManagedJob
    spent_usd: float
    from_state: str


def _budget_text(budget_usd: float, max_usd_per_hour: float | None) -> str:
    per_hour = f", at most {usd(max_usd_per_hour)}/h" if max_usd_per_hour is not None else ""
    return f"{usd(budget_usd)}{per_hour}"


def set_budget(
    db: Database,
    name: str,
    budget_usd: float,
    max_usd_per_hour: float | None = None,
    now: datetime | None = None,
) -> BudgetChange:
    """Set ``name``'s total budget (and, when given, its spend-rate cap); return the job, its
    spend so far (the ledger at ``now``) and the state it had before.

    The new budget must exceed what the job has already spent (a smaller one could buy nothing
    and would hide an overrun): otherwise an ``InputError`` and nothing changes. An
    ``over-budget`` job goes back to ``pending`` (a recorded transition), so the daemon may
    launch it again; a final job (done, failed, cancelled) is refused. The row and the stored
    spec change together; the spec's hash leaves the budget out, so the job stays the same job.
    The row is locked (``SELECT … FOR UPDATE`` on PostgreSQL) against a concurrent executor.
    """
    for field, value in (("USD", budget_usd), ("--max-usd-per-hour", max_usd_per_hour)):
        if value is not None and (not math.isfinite(value) or not 0 < value <= MAX_USD):
            raise InputError(f"{field}: {value!r} is not a budget; give dollars > 0 (at most {MAX_USD:g})")
    at = now or datetime.now(UTC)
    with db.session() as session:
        job = find_job(session, name, lock=True)
        if job.state in TERMINAL:
            raise InputError(f"NAME: job {name!r} is {job.state}; a final job's budget cannot change")
        spent = spent_usd(session, job.id, at)
        if budget_usd <= spent:
            raise InputError(
                f"USD: {usd(budget_usd)} is not above the {usd(spent)} job {name!r} has already spent; "
                "give a larger budget"
            )
        before = _budget_text(job.budget_usd, job.max_usd_per_hour)
        job.budget_usd = budget_usd
        if max_usd_per_hour is not None:
            job.max_usd_per_hour = max_usd_per_hour
        spec = json.loads(job.spec_json)
        spec.update(budget_usd=job.budget_usd, max_usd_per_hour=job.max_usd_per_hour)
        job.spec_json = _canonical(spec)
        job.updated_at = at
        change = BudgetChange(job, spent, job.state)
        if job.state == "over-budget":
            after = _budget_text(job.budget_usd, job.max_usd_per_hour)
            record_transition(session, job, "pending", f"budget raised from {before} to {after}", at)
    return change
