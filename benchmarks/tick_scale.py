"""The daemon at scale: one dry-run tick over 10,000 managed jobs and 5,000 markets (target <= 10 s).

The world is generated with a seeded RNG and written through the normal paths: the markets'
price history (a few days, spot prices changing every few hours, on-demand list prices) through
``spotopt.history.ingest.run_ingest``; the managed jobs as the rows ``spotopt.mover.jobs.submit`` writes
(same canonical spec JSON and sha256, a ``submitted`` event), inserted in bulk, then moved along
their lives: most are running with a ``Placement`` (and earlier placements ended by a move or a
preemption, which the ledger bills), some pending, some recovering from a preemption, some done.
Jobs differ in throughputs (1-3 GPU models), GPU ranges, deadlines and ``allow`` filters.

Timed: one ``Daemon.tick()`` with ``DaemonSettings(dry_run=True)`` and no provider, broken down
by phase (each phase's wall seconds; ``rest`` is the tick's own bookkeeping between them: the
job counts of its report). A dry run writes no round record and watches no instance, so neither
is a phase here: ``watch`` is its read of the running jobs, all a dry run does of it.
Building the world is not timed. ``--backend postgresql`` needs ``--pg-url`` (or
``SPOTOPT_BENCH_PG_URL``): an empty database on a server you run (it is migrated, then filled).

    python benchmarks/tick_scale.py [--jobs 10000] [--markets 5000] [--backend sqlite|postgresql]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import insert, select, update

from spotopt.catalog import gpu_matches, instance_types
from spotopt.db.engine import Database
from spotopt.db.models import JobEvent, ManagedJob, Placement
from spotopt.decide.options import allowed, gpu_choices
from spotopt.history.ingest import run_ingest
from spotopt.history.market import MarketState, snapshot
from spotopt.history.setup import open_history, upgrade_history
from spotopt.jobspec import Job, parse_jobs
from spotopt.mover import daemon as daemon_mod
from spotopt.mover import jobs as jobstore
from spotopt.mover import market_view as view_mod
from spotopt.mover.daemon import Daemon, DaemonSettings, TickReport
from spotopt.types import MarketKey, MarketKind, PriceObservation

Array = np.ndarray[Any, Any]
AT = datetime(2026, 3, 2, 12, tzinfo=UTC)
"""The tick's time (the history ends here)."""
HISTORY_DAYS = 3
GPU_USD = {
    "K80": 0.4,
    "P100": 0.9,
    "T4": 0.5,
    "A10": 0.9,
    "A10G": 1.0,
    "L4": 0.8,
    "V100": 2.5,
    "L40S": 1.9,
    "A100": 3.5,
    "H100": 7.0,
}
"""GPU families the jobs use and a list price per GPU-hour (jobs are faster on the later ones);
markets of the catalog's other GPUs (priced at $2 per GPU-hour) are in the snapshot, unused."""
GPUS = tuple(GPU_USD)
REGIONS = {
    "aws": (
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
        "eu-west-1",
        "eu-west-2",
        "eu-central-1",
        "ap-northeast-1",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-south-1",
        "ca-central-1",
    ),
    "gcp": (
        "us-central1",
        "us-east1",
        "us-east4",
        "us-west1",
        "us-west4",
        "europe-west1",
        "europe-west4",
        "asia-east1",
        "asia-northeast1",
        "asia-southeast1",
    ),
    "azure": (
        "eastus",
        "eastus2",
        "westus2",
        "westus3",
        "southcentralus",
        "westeurope",
        "northeurope",
        "uksouth",
        "japaneast",
        "australiaeast",
    ),
}
STATES = (("running", 0.55), ("pending", 0.25), ("recovering", 0.05), ("done", 0.15))
"""Share of jobs in each state when the tick runs."""


@dataclass(frozen=True)
class MarketRow:
    key: MarketKey
    gpu: str
    gpu_count: float
    list_usd: float


def market_rows(n: int, rng: np.random.Generator) -> list[MarketRow]:
    """``n`` markets: catalog GPU instance types × regions × (on-demand, spot per zone), shuffled."""
    rows: list[MarketRow] = []
    for t in instance_types():
        if t.gpu_model is None or t.retired or not t.gpu_count or t.gpu_count < 1:
            continue
        gpu = next((g for g in GPUS if gpu_matches(g, t.gpu_model)), t.gpu_model)
        for region in REGIONS[t.cloud]:
            list_usd = float(t.gpu_count) * GPU_USD.get(gpu, 2.0) * float(rng.uniform(0.9, 1.3))
            rows.append(
                MarketRow(
                    MarketKey(t.cloud, region, None, t.name, MarketKind.ON_DEMAND), gpu, t.gpu_count, list_usd
                )
            )
            zones = (
                [None]
                if t.cloud == "azure"
                else [f"{region}{z}" if t.cloud == "aws" else f"{region}-{z}" for z in "abc"]
            )
            for zone in zones:
                rows.append(
                    MarketRow(
                        MarketKey(t.cloud, region, zone, t.name, MarketKind.SPOT), gpu, t.gpu_count, list_usd
                    )
                )
    if len(rows) < n:
        raise SystemExit(f"--markets: at most {len(rows)} markets can be generated from the catalog")
    order = rng.permutation(len(rows))[:n]
    return [rows[i] for i in sorted(order.tolist())]


def price_records(markets: list[MarketRow], rng: np.random.Generator) -> Iterator[PriceObservation]:
    """On-demand: the list price at the start; spot: a change every 1-8 hours, with spikes."""
    start = AT - timedelta(days=HISTORY_DAYS)
    for m in markets:
        if m.key.kind is MarketKind.ON_DEMAND:
            yield PriceObservation(m.key, start, round(m.list_usd, 4))
            continue
        level = m.list_usd * float(rng.uniform(0.25, 0.6))
        at = start
        while at <= AT:
            spike = float(rng.uniform(1.5, 2.5)) if rng.random() < 0.1 else 1.0
            yield PriceObservation(m.key, at, round(level * spike * float(rng.uniform(0.95, 1.05)), 4))
            at += timedelta(minutes=int(rng.integers(60, 8 * 60)))


def job_specs(n: int, rng: np.random.Generator) -> list[tuple[Job, datetime]]:
    """``n`` managed job specs (validated by the spec parser) and when each was submitted."""
    raw: list[dict[str, Any]] = []
    created: list[datetime] = []
    for i in range(n):
        gpus = rng.choice(GPUS, size=int(rng.integers(1, 4)), replace=False).tolist()
        speed = float(rng.uniform(0.5, 3.0))
        tput = {g: round(speed * (1 + GPUS.index(g)) * float(rng.uniform(0.8, 1.2)), 3) for g in gpus}
        hours = float(rng.uniform(5, 150))  # on one GPU of its slowest model
        job: dict[str, Any] = {
            "name": f"job-{i:05d}",
            "throughput": tput,
            "work": {"steps": round(min(tput.values()) * 3600 * hours)},
            "checkpoint_gb": round(float(rng.uniform(0.1, 20.0)), 2),
            "restart_s": float(rng.integers(60, 900)),
            "run": f"python train.py --config cfg/{i}.yaml",
            "checkpoint": {"uri": f"s3://spotopt-bench/ckpt/job-{i:05d}"},
            "budget_usd": float(rng.integers(50, 5000)),
        }
        u = rng.random()
        if u < 0.2:
            job["gpus"] = {"min": 1, "max": 4}
        elif u < 0.3:
            job["gpus"] = {"min": 2, "max": 8}
        submitted = AT - timedelta(hours=float(rng.uniform(1, 72)))
        d = rng.random()
        if d < 0.3:
            job["deadline"] = f"{int(hours * float(rng.uniform(2, 4)) / 24) + 4}d"
        elif d < 0.5:
            job["deadline"] = (AT + timedelta(hours=hours * float(rng.uniform(2, 4)) + 48)).isoformat()
        allow: dict[str, Any] = {}
        if rng.random() < 0.5:
            allow["clouds"] = rng.choice(list(REGIONS), size=int(rng.integers(1, 3)), replace=False).tolist()
        if rng.random() < 0.2:
            allow["markets"] = ["spot"]
        if rng.random() < 0.2:
            allow["regions"] = [r for regions in REGIONS.values() for r in regions[:2]]
        if allow:
            job["allow"] = allow
        if rng.random() < 0.1:
            job["max_usd_per_hour"] = float(rng.integers(5, 40))
        raw.append(job)
        created.append(submitted)
    spec = parse_jobs({"jobs": raw}, "benchmark")
    return list(zip(spec.jobs, created, strict=True))


ROW_COLUMNS = (
    "name",
    "spec_json",
    "spec_sha256",
    "run_command",
    "workdir",
    "checkpoint_uri",
    "budget_usd",
    "max_usd_per_hour",
    "state",
    "created_at",
    "updated_at",
)


def job_row(db: Database, job: Job, created: datetime) -> dict[str, Any]:
    """The ``managed_jobs`` row ``spotopt.mover.jobs.submit`` writes for ``job`` (state pending):
    submit's own dry run makes it (the spec as JSON, which is YAML), so the rows are the same.
    The generated buckets do not exist: their write probe is skipped."""
    text = json.dumps({"jobs": [job.model_dump(mode="json")]})
    stored = jobstore.submit(db, text, dry_run=True, now=created, check_store=False)
    return {column: getattr(stored, column) for column in ROW_COLUMNS}


def build_world(db: Database, n_jobs: int, n_markets: int, seed: int = 0) -> dict[str, int]:
    """Fill ``db`` (migrated, empty) with the generated markets, history and jobs; counts back."""
    rng = np.random.default_rng(seed)
    summary = run_ingest(db, "bench", "tick_scale", price_records(market_rows(n_markets, rng), rng))
    specs = job_specs(n_jobs, rng)
    events: list[dict[str, Any]] = []
    placements: list[dict[str, Any]] = []
    with db.session() as session:
        markets = snapshot(session, AT)
        session.execute(insert(ManagedJob), [job_row(db, job, created) for job, created in specs])
        job_ids = {name: jid for name, jid in session.execute(select(ManagedJob.name, ManagedJob.id))}
        shares = np.array([s for _, s in STATES])
        states = rng.choice([s for s, _ in STATES], size=n_jobs, p=shares / shares.sum()).tolist()
        by_gpu: dict[str, list[int]] = {}
        for i, m in enumerate(markets):
            by_gpu.setdefault(m.quote.gpu or "", []).append(i)
        updates: list[dict[str, Any]] = []
        for (job, created), state in zip(specs, states, strict=True):
            jid = job_ids[job.name]
            events.append(_event(jid, created, None, "pending", "submitted"))
            fits = [
                i
                for gpu, idx in by_gpu.items()
                if any(gpu_matches(g, gpu) for g in job.throughput)
                for i in idx
                if allowed(job, markets[i]) and gpu_choices(job, markets[i].quote.gpu_count or 0)
            ]
            if state == "pending" or not fits:
                continue
            at = created + timedelta(minutes=5)
            for before, after in itertools.pairwise(("pending", *LIFE[state])):
                events.append(_event(jid, at, before, after, "benchmark world"))
            placements += _placements(job, jid, state, created, [markets[i] for i in fits], rng)
            steps = int(float(job.work.steps or 0) * float(rng.uniform(0.05, 0.6)))
            updates.append(
                {
                    "id": jid,
                    "state": state,
                    "epoch": placements[-1]["epoch"],
                    "steps": steps,
                    "checkpoint_step": int(steps * 0.9),
                    "checkpoint_name": f"step-{int(steps * 0.9)}",
                    "heartbeat_at": AT - timedelta(seconds=30) if state == "running" else None,
                    "updated_at": at,
                }
            )
        session.execute(insert(JobEvent), events)
        session.execute(insert(Placement), placements)
        newest = {
            jid: pid
            for jid, pid in session.execute(
                select(Placement.job_id, Placement.id).order_by(Placement.job_id, Placement.epoch)
            )
        }
        session.execute(update(ManagedJob), [{**row, "placement_id": newest[row["id"]]} for row in updates])
    return {
        "markets": len(markets),
        "price_points": summary.stats.inserted,
        "jobs": n_jobs,
        "placements": len(placements),
        "job_events": len(events),
    }


LIFE = {
    "running": ("launching", "running"),
    "recovering": ("launching", "running", "recovering"),
    "done": ("launching", "running", "done"),
}
"""The transitions each state's jobs went through after ``submitted`` (pending: none)."""


def _event(job_id: int, at: datetime, before: str | None, after: str, reason: str) -> dict[str, Any]:
    return {"job_id": job_id, "at": at, "from_state": before, "to_state": after, "reason": reason}


def _placements(
    job: Job,
    job_id: int,
    state: str,
    created: datetime,
    fits: list[MarketState],
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    """1-3 placements on markets the job may use, one after the other: the last one runs (a
    running job), was preempted (recovering) or finished (done); earlier ones ended by a move."""
    n = int(rng.integers(1, 4))
    starts = sorted(created + (AT - created) * float(x) for x in rng.uniform(0.05, 0.9, n))
    ends: list[datetime | None] = [*starts[1:], None if state == "running" else AT - timedelta(minutes=10)]
    last_reason = {"running": None, "recovering": "preempted", "done": "terminated"}[state]
    rows = []
    for k, (start, end) in enumerate(zip(starts, ends, strict=True)):
        m = fits[int(rng.integers(len(fits)))]
        rows.append(
            {
                "job_id": job_id,
                "epoch": k + 1,
                "key": f"{job.name}-e{k + 1}",
                "provider": "local",
                "market_id": m.quote.market_id,
                "gpus": gpu_choices(job, m.quote.gpu_count or 0)[0],
                "instances": 1.0,
                "usd_per_hour": m.quote.usd_per_hour,
                "instance_id": f"local-{job_id}-{k + 1}",
                "state": "running" if end is None else "ended",
                "created_at": start - timedelta(minutes=2),
                "started_at": start,
                "ended_at": end,
                "end_reason": last_reason if k == n - 1 else "terminated",
            }
        )
    return rows


PHASES: tuple[tuple[str, Any, str], ...] = (
    (WATCH := "watch (running jobs, read)", Daemon, "_watch"),
    ("snapshot (prices, rates)", view_mod, "snapshot"),
    ("options (enumerate)", view_mod, "enumerate_options"),
    ("forecast (history)", view_mod, "market_forecast"),
    ("options (price)", view_mod, "price_options"),
    ("fleet state (+ ledger)", Daemon, "_fleet_state"),
    ("decide (core)", daemon_mod, "decide"),
    ("log decisions", Daemon, "_act"),
    (DECIDE_ROUND := "decide round", Daemon, "_decide"),
)
"""The tick's phases, each timed by wrapping the function the tick calls for it."""
REST = "rest (job counts)"


def clocks() -> Array:
    """Wall and CPU seconds now (CPU: this process' own, which other load does not inflate)."""
    return np.array([time.perf_counter(), time.process_time()])


@contextmanager
def timed_phases() -> Iterator[tuple[dict[str, Array], Counter[str]]]:
    """Wrap every phase's function to add up its wall and CPU seconds, and its calls, while the
    block runs."""
    spent = {name: np.zeros(2) for name, _, _ in PHASES}
    calls: Counter[str] = Counter()
    saved = []

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = clocks()
            calls[name] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += clocks() - start

        return timed

    for name, owner, attr in PHASES:
        fn = getattr(owner, attr)
        saved.append((owner, attr, fn))
        setattr(owner, attr, wrap(name, fn))
    try:
        yield spent, calls
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


def timed_tick(db: Database) -> tuple[TickReport, dict[str, Array]]:
    """One dry-run tick at ``AT`` (no provider): its report and (wall, CPU) seconds per phase,
    with ``state read`` (``_decide`` less the phases it calls), ``rest`` and ``total``. A phase
    the tick never ran is an error: every row printed is time the tick spent."""
    daemon = Daemon(db, None, DaemonSettings(dry_run=True), clock=lambda: AT)
    with timed_phases() as (spent, calls):
        start = clocks()
        report = daemon.tick()
        total = clocks() - start
    if idle := [name for name, _, _ in PHASES if not calls[name]]:
        raise RuntimeError(f"phases the dry-run tick did not run: {', '.join(idle)}; drop them from PHASES")
    phases = dict(spent)
    round_s = phases.pop(DECIDE_ROUND)
    phases["state read (jobs, specs)"] = round_s - sum(
        (v for k, v in phases.items() if k != WATCH),
        np.zeros(2),
    )
    phases[REST] = total - sum(phases.values(), np.zeros(2))
    phases["total"] = total
    return report, phases


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--markets", type=int, default=5_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--pg-url", default=os.environ.get("SPOTOPT_BENCH_PG_URL"))
    parser.add_argument("--sqlite", type=Path, help="SQLite file to build (default: a temporary one)")
    parser.add_argument(
        "--reuse", action="store_true", help="tick on --sqlite/--pg-url as it is (built before)"
    )
    parser.add_argument("--ticks", type=int, default=2, help="dry-run ticks to time (each solves afresh)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.backend == "postgresql":
            if not args.pg_url:
                raise SystemExit("--pg-url: give an empty PostgreSQL database URL (or SPOTOPT_BENCH_PG_URL)")
            url = args.pg_url
        else:
            url = f"sqlite:///{args.sqlite or Path(tmp) / 'tick.sqlite'}"
        upgrade_history(url)
        db = open_history(url)
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; backend {args.backend}")
        if not args.reuse:
            t = time.perf_counter()
            counts = build_world(db, args.jobs, args.markets, args.seed)
            took = time.perf_counter() - t
            print(f"built in {took:.1f} s: " + ", ".join(f"{v:,} {k}" for k, v in counts.items()))
        rows = []
        for _ in range(args.ticks):
            report, phases = timed_tick(db)
            rows.append(phases)
            print(f"tick: {len(report.decisions):,} decisions; jobs {report.jobs}")
        print(
            f"{'phase':<28}" + "".join(f"{f'tick {k + 1} wall s':>14}{'cpu s':>7}" for k in range(len(rows)))
        )
        for name in rows[0]:
            print(f"{name:<28}" + "".join(f"{r[name][0]:>14.2f}{r[name][1]:>7.2f}" for r in rows))
        db.dispose()


if __name__ == "__main__":
    main()
