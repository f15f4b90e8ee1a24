"""All tables, in one module (the Alembic revisions are written against these).

Money is ``Float`` (double precision) with the unit in the column name (``usd_per_hour``).
Why not NUMERIC: every consumer (pandas reports, cvxpy policies, the simulator) computes in
float64 anyway; list and spot prices carry at most ~8 significant digits, which float64 holds
exactly enough to print back; and NUMERIC would make 10 M-row ingests and scans slower on
both databases. Amounts are never accumulated in the database.

Times are timezone-aware UTC on the Python side (``UTCDateTime``). A price point means "this
price from ``observed_at`` until the next point of the same market" (AWS's semantics): the price
at t is the last point at or before t.

``zone`` is stored as ``''`` for region-wide markets (GCP and Azure prices, on-demand prices):
SQL unique constraints treat NULLs as distinct, so NULL would let duplicate markets in.
"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from spotopt.price import SlotPrice

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out, on SQLite (naive storage) and PostgreSQL."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} reached the database; use UTC")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # raw SQL results on SQLite
            value = datetime.fromisoformat(value)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Meta(Base):
    """Key/value facts about this database, e.g. the hash of the bundled catalog last synced."""

    __tablename__ = "meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class InstanceType(Base):
    __tablename__ = "instance_types"
    __table_args__ = (UniqueConstraint("cloud", "name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    cloud: Mapped[str] = mapped_column(String(16))
    name: Mapped[str] = mapped_column(String(64))
    # None when the GPU is unknown (an imported type missing from the catalog).
    gpu_model: Mapped[str | None] = mapped_column(String(32), index=True)
    # Fractional for GPU slices (e.g. Azure NVadsA10 v5 with 1/6 of an A10).
    gpu_count: Mapped[float | None] = mapped_column(Float)
    gpu_memory_gib: Mapped[float | None] = mapped_column(Float)
    vcpus: Mapped[int | None] = mapped_column(Integer)
    memory_gib: Mapped[float | None] = mapped_column(Float)
    retired: Mapped[bool] = mapped_column(Boolean, default=False)
    gpu_name_raw: Mapped[str | None] = mapped_column(String(64))
    # Where the row came from: "catalog" (bundled data), "import", or a collector name.
    origin: Mapped[str] = mapped_column(String(32), default="catalog")


class Market(Base):
    __tablename__ = "markets"
    __table_args__ = (UniqueConstraint("instance_type_id", "region", "zone", "kind"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_type_id: Mapped[int] = mapped_column(ForeignKey("instance_types.id"))
    region: Mapped[str] = mapped_column(String(32))
    zone: Mapped[str] = mapped_column(String(32), default="")
    # AWS AZ ID (use1-az4): zone names are shuffled per account, IDs are not.
    zone_id: Mapped[str | None] = mapped_column(String(32))
    kind: Mapped[str] = mapped_column(String(16))  # "spot" | "on-demand"


class Run(Base):
    """One import or collector run over one scope, recorded before and after it writes."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source: Mapped[str] = mapped_column(String(64))
    scope: Mapped[str] = mapped_column(String(255), default="")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    inserted: Mapped[int] = mapped_column(Integer, default=0)
    duplicate: Mapped[int] = mapped_column(Integer, default=0)
    # Same key as a stored observation but another value: the first is kept, this is counted.
    conflicting: Mapped[int] = mapped_column(Integer, default=0)
    rejected: Mapped[int] = mapped_column(Integer, default=0)
    # running | ok | failed | skipped (a collector scope without credentials or permission)
    status: Mapped[str] = mapped_column(String(16), default="running")
    error: Mapped[str | None] = mapped_column(Text)
    # JSON {"reasons": {reason: count}, "examples": ["where: reason", ...]} of rejected records
    # (first 20 examples), the same for imports and collector runs; NULL when none were rejected.
    rejections: Mapped[str | None] = mapped_column(Text)
    # The process that writes the run: a "running" run whose process is gone was killed
    # (spotopt.history.setup.fail_stale_runs). Filled in by default wherever a run is created.
    pid: Mapped[int | None] = mapped_column(Integer, default=os.getpid)
    host: Mapped[str | None] = mapped_column(String(255), default=socket.gethostname)


# Index: "last run per source" (coverage report, collector watermarks).
Index("ix_runs_source_started", Run.source, Run.started_at)


class PricePoint(Base):
    """Append-only. The primary key is the idempotency key: re-importing inserts nothing."""

    __tablename__ = "price_points"

    market_id: Mapped[int] = mapped_column(ForeignKey("markets.id"), primary_key=True)
    observed_at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    usd_per_hour: Mapped[float] = mapped_column(Float)
    # Provenance only, deliberately without a foreign key: runs are never deleted, and the
    # per-row FK check cost a third of PostgreSQL's bulk-insert time (measured, 22k-row batch).
    run_id: Mapped[int | None] = mapped_column(Integer)


# Index: "price at t" and time-range scans across all markets (cheapest, price-board, reports)
# filter on observed_at first; the PK (market_id, observed_at, ...) serves per-market lookups.
Index("ix_price_points_observed_at", PricePoint.observed_at)


class CapacityObservation(Base):
    """Append-only: whether a spot market had capacity when someone tried (or probed) it.

    An observation states the market's spot capacity from ``observed_at`` until the next
    observation of the same market, whatever its source: the step rule prices follow. ``available``
    means "one more instance of this market could be launched then"; ``launched`` of
    ``requested`` says, where the source knows, how many instances a request for several got
    (a 16-node probe that got 3: ``available`` true, 3 of 16), so a consumer that needs k
    instances at once can ask for ``launched >= k``. ``source`` says who observed it: an import
    (``import-availability``), the daemon's own launch attempts (``daemon``), a collector.

    Only spot markets have capacity observations (an on-demand launch refused for capacity is a
    fact about the cloud's on-demand pool, which nothing here models); ``spotopt.history.ingest`` and
    ``spotopt.mover.observed`` refuse or skip on-demand markets. The primary key is the
    idempotency key, as for ``PricePoint``: re-importing inserts nothing.
    """

    __tablename__ = "capacity_observations"

    market_id: Mapped[int] = mapped_column(ForeignKey("markets.id"), primary_key=True)
    observed_at: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    source: Mapped[str] = mapped_column(String(32), primary_key=True)
    available: Mapped[bool] = mapped_column(Boolean)
    launched: Mapped[int | None] = mapped_column(Integer)
    requested: Mapped[int | None] = mapped_column(Integer)
    run_id: Mapped[int | None] = mapped_column(Integer)  # provenance, no FK (see PricePoint)


# Index: the ``availability`` report's window across all markets filters on observed_at first;
# the primary key (market_id, observed_at, ...) serves ``capacity_history``'s per-market seeks.
Index("ix_capacity_observations_observed_at", CapacityObservation.observed_at)


class Interruption(Base):
    """Append-only interruption observations (advisor buckets, placement scores, evictions)."""

    __tablename__ = "interruptions"
    __table_args__ = (
        UniqueConstraint("instance_type_id", "region", "zone", "kind", "observed_at", "source"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    instance_type_id: Mapped[int] = mapped_column(ForeignKey("instance_types.id"))
    region: Mapped[str] = mapped_column(String(32))
    zone: Mapped[str] = mapped_column(String(32), default="")
    observed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(32))
    value: Mapped[float | None] = mapped_column(Float)
    raw: Mapped[str] = mapped_column(Text)
    source: Mapped[str] = mapped_column(String(32))
    run_id: Mapped[int | None] = mapped_column(Integer)  # provenance, no FK (see PricePoint)


class InstanceLifetime(Base):
    """Observed life of one spot instance; ``ended_at`` None means still running (censored)."""

    __tablename__ = "instance_lifetimes"
    __table_args__ = (UniqueConstraint("market_id", "instance_ref", "source"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    market_id: Mapped[int] = mapped_column(ForeignKey("markets.id"), index=True)
    instance_ref: Mapped[str] = mapped_column(String(128))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    end_reason: Mapped[str | None] = mapped_column(String(16))  # preempted|terminated|None
    source: Mapped[str] = mapped_column(String(32))


class Watermark(Base):
    """Per (collector, scope): observations up to ``until`` are stored and need not be fetched again."""

    __tablename__ = "watermarks"

    collector: Mapped[str] = mapped_column(String(64), primary_key=True)
    scope: Mapped[str] = mapped_column(String(255), primary_key=True)
    until: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class Throughput(Base):
    """Training throughput of a workload (job or model name) on ``gpu_count`` GPUs of ``gpu_model``.

    ``source`` is ``measured``, ``imported`` or ``estimated``; estimates are always labelled so.
    """

    __tablename__ = "throughputs"
    __table_args__ = (UniqueConstraint("workload", "gpu_model", "gpu_count", "source"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload: Mapped[str] = mapped_column(String(128))
    gpu_model: Mapped[str] = mapped_column(String(32))
    gpu_count: Mapped[int] = mapped_column(Integer)
    steps_per_s: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime)
    note: Mapped[str | None] = mapped_column(Text)


# Report indexes (revision 0002; the reports also read the views price_intervals and latest_prices
# that the same revision creates: views are not tables, so they are not declared here).
# Index: interruptions report, observations inside [since, until) across all instance types.
Index("ix_interruptions_observed_at", Interruption.observed_at)
# Index: interruptions report (survival section), lifetimes started inside [since, until).
Index("ix_instance_lifetimes_started_at", InstanceLifetime.started_at)


JOB_STATES = (
    "pending",
    "launching",
    "running",
    "moving",
    "recovering",
    "done",
    "failed",
    "cancelled",
    "over-budget",
)
"""Every state a managed job can be in (``spotopt.mover.jobs.TRANSITIONS`` says which follow which)."""


def _state_in(column: str) -> str:
    """The CHECK that keeps ``column`` inside ``JOB_STATES`` (SQL any backend understands)."""
    return "{} IN ({})".format(column, ", ".join(f"'{s}'" for s in JOB_STATES))


class ManagedJob(Base):
    """A job submitted to the mover: the validated spec, what it may spend, and where it stands.

    ``spec_json`` is the validated job (canonical JSON, sorted keys) and ``spec_sha256`` its hash:
    re-submitting the same name is idempotent exactly when the hash (and the directory) agree.
    """

    __tablename__ = "managed_jobs"
    __table_args__ = (CheckConstraint(_state_in("state"), name="state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    spec_json: Mapped[str] = mapped_column(Text)
    spec_sha256: Mapped[str] = mapped_column(String(64))
    run_command: Mapped[str] = mapped_column(Text)
    # Where ``run_command`` runs and a relative checkpoint path is resolved: the job file's
    # directory; NULL when the spec was submitted as text.
    workdir: Mapped[str | None] = mapped_column(Text)
    checkpoint_uri: Mapped[str] = mapped_column(Text)
    budget_usd: Mapped[float] = mapped_column(Float)
    max_usd_per_hour: Mapped[float | None] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    # What the executor knows (revision 0005). ``epoch`` is the newest epoch handed to a placement
    # (0: none yet); ``placement_id`` the placement that holds (or will hold) the lease.
    epoch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    placement_id: Mapped[int | None] = mapped_column(Integer)
    # The newest heartbeat the daemon read: progress, measured rate, newest verified checkpoint.
    steps: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    steps_per_s: Mapped[float | None] = mapped_column(Float)
    checkpoint_name: Mapped[str | None] = mapped_column(Text)
    checkpoint_step: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


# Index: "jobs in these states" (the executor's tick, ``jobs list`` by state, daemon status).
Index("ix_managed_jobs_state", ManagedJob.state)


class JobEvent(Base):
    """Append-only: one row per state transition of a managed job, with its time and reason.

    ``from_state`` is NULL for the submission (the job's first state).
    """

    __tablename__ = "job_events"
    __table_args__ = (CheckConstraint(_state_in("to_state"), name="to_state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("managed_jobs.id"))
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)


# Index: "the transitions of one job, in order" (``jobs show``, ``jobs events``).
Index("ix_job_events_job_at", JobEvent.job_id, JobEvent.at)


class JobProgress(Base):
    """Append-only: a managed job's steps as its agent reported them, over time.

    The job row keeps only the newest heartbeat (``ManagedJob.steps``); these rows are the
    history behind the dashboard's progress chart, written by ``spotopt.mover.progress`` at most
    every few minutes per job and at every new epoch. ``epoch`` is the placement's: a job moved
    or recovered restarts from its checkpoint, so its steps can go down when the epoch changes
    (the work lost since that checkpoint).
    """

    __tablename__ = "job_progress"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("managed_jobs.id"))
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    epoch: Mapped[int] = mapped_column(Integer)
    steps: Mapped[int] = mapped_column(Integer)


# Index: "one job's points in time order" (the job page's chart, the recorder's newest point).
Index("ix_job_progress_job_at", JobProgress.job_id, JobProgress.at)


PLACEMENT_STATES = ("launching", "running", "ended", "failed")
"""``launching``: the launch is journaled (it may or may not have happened); ``running``: the
provider returned an instance; ``ended``: it is gone (``end_reason`` says why); ``failed``: the
launch never produced an instance (no capacity, an error)."""


class Placement(Base):
    """One instance of a managed job: where it ran, at what price, from when to when.

    The ledger (``spotopt.mover.ledger``) bills each placement from ``started_at`` (the launch
    call returned) to ``ended_at`` (the terminate call returned, or when we saw it gone).
    ``key`` is the idempotency key handed to the provider, so a launch re-done after a crash
    finds the same instance.
    """

    __tablename__ = "placements"
    __table_args__ = (
        UniqueConstraint("key"),
        CheckConstraint("state IN ({})".format(", ".join(f"'{s}'" for s in PLACEMENT_STATES)), name="state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("managed_jobs.id"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(128))
    provider: Mapped[str] = mapped_column(String(32))
    market_id: Mapped[int] = mapped_column(ForeignKey("markets.id"))
    gpus: Mapped[int] = mapped_column(Integer)
    instances: Mapped[float] = mapped_column(Float)
    """Instances billed per job slot (``Options.instances_per_hour``: 1, or a share of one)."""
    usd_per_hour: Mapped[float] = mapped_column(Float)
    """The job slot's price when it was launched (the ledger bills the price in effect)."""
    instance_id: Mapped[str | None] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    end_reason: Mapped[str | None] = mapped_column(String(32))

    @property
    def price(self) -> SlotPrice:
        """The slot's launch price (``usd_per_hour``, ``instances``) as one value."""
        return SlotPrice.recorded(self.usd_per_hour, self.instances)


class JobMove(Base):
    """One run of the move state machine (``spotopt.mover.executor``): a start, a voluntary move,
    a recovery after a preemption, or a stop (budget, cancel, finish)."""

    __tablename__ = "job_moves"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("managed_jobs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    step: Mapped[str] = mapped_column(String(32))
    """Where the state machine stands (``spotopt.mover.executor.STEPS``)."""
    from_placement_id: Mapped[int | None] = mapped_column(ForeignKey("placements.id"))
    to_placement_id: Mapped[int | None] = mapped_column(ForeignKey("placements.id"))
    market_id: Mapped[int | None] = mapped_column(ForeignKey("markets.id"))
    gpus: Mapped[int | None] = mapped_column(Integer)
    instances: Mapped[float | None] = mapped_column(Float)
    usd_per_hour: Mapped[float | None] = mapped_column(Float)
    """The target slot's price when the move was decided (the launch re-checks the budget with it)."""
    epoch: Mapped[int | None] = mapped_column(Integer)
    """The epoch of the placement this move launches (allocated when the move opens)."""
    then_state: Mapped[str | None] = mapped_column(String(16))
    """A stop's final job state (``over-budget``, ``done``); None for cancelled jobs."""
    saving_usd: Mapped[float] = mapped_column(Float, default=0.0)
    cost_usd: Mapped[float] = mapped_column(Float, default=0.0)
    checkpoint_name: Mapped[str | None] = mapped_column(Text)
    checkpoint_step: Mapped[int | None] = mapped_column(Integer)
    # The data egress entering the new placement caused (revision 0006), priced by the one egress
    # rule when the lease is granted to the new epoch (``spotopt.mover.ledger.record_entry_egress``);
    # the ledger bills it with the placement the move launched.
    egress_usd: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    egress_gb: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    """GB that crossed a region or cloud (checkpoint and, where needed, dataset)."""
    egress_from: Mapped[str | None] = mapped_column(Text)
    """``cloud/region`` of the checkpoint the new placement restores (None: none)."""
    egress_to: Mapped[str | None] = mapped_column(Text)
    """``cloud/region`` entered; None until the egress is recorded (recorded once per move)."""
    outcome: Mapped[str | None] = mapped_column(String(16))
    """None while open; ``done``, ``aborted`` (the job stayed where it was) or ``failed``."""
    detail: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    @property
    def price(self) -> SlotPrice:
        """The target slot's price (``usd_per_hour``, ``instances``) as one value: the launch
        records it on the placement as it is."""
        return SlotPrice.recorded(self.usd_per_hour, self.instances)


class JournalEntry(Base):
    """One side effect: its intent is committed before the call and its result after it.

    ``key`` (``m<move id>:<step>``) is unique, so a step is journaled once however often a
    crashed daemon resumes it, and it is what the provider sees as the idempotency key.
    """

    __tablename__ = "journal"
    __table_args__ = (UniqueConstraint("key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("managed_jobs.id"), index=True)
    move_id: Mapped[int | None] = mapped_column(ForeignKey("job_moves.id"))
    action: Mapped[str] = mapped_column(String(32))
    key: Mapped[str] = mapped_column(String(160))
    status: Mapped[str] = mapped_column(String(16))
    """``intent`` (the call may or may not have happened), ``done`` or ``failed``."""
    detail: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class DaemonTick(Base):
    """One reconcile + rebalance round of the daemon (``daemon status`` shows the newest)."""

    __tablename__ = "daemon_ticks"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    dry_run: Mapped[bool] = mapped_column(Boolean)
    summary: Mapped[str | None] = mapped_column(Text)
    """JSON: jobs by state, decisions, side effects, errors."""


# Index: "open moves" (every tick) and "moves of one job" (``jobs show``).
Index("ix_job_moves_open", JobMove.outcome, JobMove.job_id)
# Index: "unfinished journal steps" (reconcile on start and every tick).
Index("ix_journal_status", JournalEntry.status)


class WhatifRun(Base):
    """A what-if replay stored under a name (``spotopt whatif --save NAME``) for the dashboard's
    what-if page: its parameters here, its strategies' results and placements beside it."""

    __tablename__ = "whatif_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    saved_at: Mapped[datetime] = mapped_column(UTCDateTime)
    synthetic: Mapped[bool] = mapped_column(Boolean)
    """Replayed over the bundled example market, not this history."""
    first_start: Mapped[datetime] = mapped_column(UTCDateTime)
    starts: Mapped[int] = mapped_column(Integer)
    every_hours: Mapped[float] = mapped_column(Float)
    window_hours: Mapped[float] = mapped_column(Float)
    preemptions: Mapped[str] = mapped_column(String(16))
    seed: Mapped[int | None] = mapped_column(Integer)
    billing: Mapped[str] = mapped_column(String(16))
    notes: Mapped[str] = mapped_column(Text)
    """JSON list of the replay's notes."""


class WhatifResult(Base):
    """One job x strategy row of a stored replay (``spotopt whatif``'s table, means over starts)."""

    __tablename__ = "whatif_results"
    __table_args__ = (UniqueConstraint("run_id", "job", "strategy"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("whatif_runs.id", ondelete="CASCADE"))
    job: Mapped[str] = mapped_column(Text)
    strategy: Mapped[str] = mapped_column(String(64))
    cost_usd: Mapped[float | None] = mapped_column(Float)
    """None: the strategy did not finish the job in every start."""
    bound_usd: Mapped[float | None] = mapped_column(Float)
    ratio_vs_spot: Mapped[float | None] = mapped_column(Float)
    finish_hours: Mapped[float | None] = mapped_column(Float)
    deadline_met: Mapped[float | None] = mapped_column(Float)
    """Share of the starts that met the deadline (1.0 / 0.0 for one start); None: no deadline."""
    moves: Mapped[float] = mapped_column(Float)
    preemptions: Mapped[float] = mapped_column(Float)
    unfinished_starts: Mapped[int] = mapped_column(Integer)


class WhatifPlacement(Base):
    """Where a job ran under a strategy in a stored one-start replay (one row per stretch)."""

    __tablename__ = "whatif_placements"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("whatif_runs.id", ondelete="CASCADE"))
    job: Mapped[str] = mapped_column(Text)
    strategy: Mapped[str] = mapped_column(String(64))
    from_at: Mapped[datetime] = mapped_column(UTCDateTime)
    to_at: Mapped[datetime] = mapped_column(UTCDateTime)
    cloud: Mapped[str] = mapped_column(String(16))
    region: Mapped[str] = mapped_column(String(64))
    zone: Mapped[str | None] = mapped_column(String(64))
    instance_type: Mapped[str] = mapped_column(String(128))
    market: Mapped[str] = mapped_column(String(16))
    gpu: Mapped[str | None] = mapped_column(String(64))
    gpus: Mapped[int] = mapped_column(Integer)


# Index: the what-if page reads one run's results and placements.
Index("ix_whatif_results_run_id", WhatifResult.run_id)
Index("ix_whatif_placements_run_id", WhatifPlacement.run_id)


class Notification(Base):
    """The outbox (issue 40): one row per event a person may want to hear of, written in the same
    transaction as the state change that causes it, so an event is never sent for a change that
    was rolled back nor lost for one that was committed (``spotopt.notify``).

    ``key`` is the event's stable id, sent as ``X-Spotopt-Event-Id`` and in the body: a receiver
    drops a repeat by it (delivery is at least once). ``payload`` is JSON (what the event says:
    reason, cost, saving...), never a secret. ``job_id``/``job_name`` are NULL for the daemon's
    own events (``daemon.*``)."""

    __tablename__ = "notifications"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("managed_jobs.id"))
    job_name: Mapped[str | None] = mapped_column(String(128))
    at: Mapped[datetime] = mapped_column(UTCDateTime)
    payload: Mapped[str] = mapped_column(Text)


class NotifySink(Base):
    """A sink (``webhook``, ``slack``, ``email``, ``command``) as the deliverer has seen it:
    ``since_id`` is the first event it takes (a sink set up today is not sent the history's
    backlog), and its run of failures (``daemon status`` and the metrics report a sink failing
    ``notify_failures_alert`` times in a row)."""

    __tablename__ = "notify_sinks"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    since_id: Mapped[int] = mapped_column(Integer)
    failures_in_a_row: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_error: Mapped[str | None] = mapped_column(Text)
    last_delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class NotifyDelivery(Base):
    """One event's delivery to one sink: tried ``attempts`` times, next tried at ``next_try_at``
    (exponential backoff), acknowledged at ``delivered_at`` (NULL: not yet); ``last_error`` is
    one line (the sink's URL and secrets never in it)."""

    __tablename__ = "notify_deliveries"

    notification_id: Mapped[int] = mapped_column(ForeignKey("notifications.id"), primary_key=True)
    sink: Mapped[str] = mapped_column(String(32), primary_key=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_try_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_error: Mapped[str | None] = mapped_column(Text)


# Index: "one job's events in order" (a job's notifications; the budget thresholds already sent).
Index("ix_notifications_job_id", Notification.job_id, Notification.id)
# Index: "a sink's undelivered events" (every round's delivery step, ``notify list --failed``).
Index("ix_notify_deliveries_sink_delivered", NotifyDelivery.sink, NotifyDelivery.delivered_at)
