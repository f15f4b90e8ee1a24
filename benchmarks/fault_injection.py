"""The long fault-injection sweep: the mover's daemon SIGKILLed at every journaled step on both
backends and at seeded random times, restarted each time, and on top of a random daemon kill the
training process killed (SIGKILL, as the OOM killer does), exiting 137 (as a wrapper reports an
OOM kill), or the job's checkpoint store refusing writes through the move (``store-errors``),
with the issue's invariants checked after every run (``tests.fault_harness``;
``tests/test_fault_injection.py`` is the fast subset).

    python benchmarks/fault_injection.py [--runs 200] [--seed 0] [--jobs 2] [--skip-pg]

The crash points come from a clean run's journal (every key, before and after its call); the
remaining runs are random-time kills with delays drawn from ``--seed``, each in turn with no
other fault or one of ``FAULTS``. PostgreSQL is a
throwaway server from ``tests/pg.py``. Prints one row per (backend, kind) and the total: runs,
crashes that landed, and the violations (lost progress or a wrong result, orphaned processes,
overlapping epochs, budget overruns, ledger mismatches, faults the job did not get over), all of
which must be 0; exit 1 if not.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from spotopt.history.setup import upgrade_history  # noqa: E402
from tests import fault_harness as harness  # noqa: E402

RANDOM_WINDOW_S = 12.0
COLUMNS = ("lost/wrong", "orphans", "overlaps", "budget", "ledger", "journal", "unresumed", "errors")


@dataclass(frozen=True)
class Planned:
    backend: str
    kind: str  # "point", "random", or "random+<fault>"
    crash: tuple[str, str] | None = None
    kill_after_s: float | None = None
    fault: str | None = None


@dataclass
class Result:
    planned: Planned
    outcome: harness.Outcome | None
    error: str = ""
    seconds: float = 0.0

    def violations(self) -> Counter[str]:
        found: Counter[str] = Counter()
        if self.outcome is None:
            found["errors"] += 1
            return found
        f = self.outcome.findings
        found["lost/wrong"] += bool(f.lost_progress or f.wrong_result)
        found["orphans"] += bool(f.orphans)
        found["overlaps"] += bool(f.overlaps)
        found["budget"] += bool(f.budget_overruns)
        found["ledger"] += bool(f.ledger_mismatches)
        found["journal"] += bool(f.journal)
        found["unresumed"] += bool(f.unresumed)
        return +found  # without the zero counts: empty when the run broke nothing


class Databases:
    """Fresh migrated databases: SQLite copies of a template, PostgreSQL databases cloned from a
    template on a throwaway server."""

    def __init__(self, tmp: Path, with_pg: bool) -> None:
        self.tmp = tmp
        self.template = tmp / "template.sqlite"
        upgrade_history(f"sqlite:///{self.template}")
        self.server = None
        self.count = 0
        if with_pg:
            from tests.pg import PostgresServer, find_bindir

            bindir = find_bindir()
            if bindir is None:
                raise SystemExit("no PostgreSQL binaries (pg_ctl): install postgresql or pass --skip-pg")
            self.server = PostgresServer(bindir)
            self.server.start()
            with create_engine(self.server.url(), isolation_level="AUTOCOMMIT").connect() as conn:
                conn.execute(text("CREATE DATABASE spotopt_template"))
            upgrade_history(self.server.url("spotopt_template"))

    def new(self, backend: str, name: str) -> str:
        if backend == "sqlite":
            return harness.copy_sqlite(self.template, self.tmp / name / "db.sqlite")
        assert self.server is not None
        with create_engine(self.server.url(), isolation_level="AUTOCOMMIT").connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name} TEMPLATE spotopt_template"))
        return self.server.url(name)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


def run_one(dbs: Databases, reference: harness.Reference, planned: Planned, index: int) -> Result:
    name = f"r{index}"
    world = harness.new_world(dbs.new(planned.backend, name), dbs.tmp / name / "world", planned.fault)
    started = time.monotonic()
    try:
        outcome = harness.play(world, reference, crash=planned.crash, kill_after_s=planned.kill_after_s)
        return Result(planned, outcome, seconds=time.monotonic() - started)
    except Exception as exc:  # a driver that failed or hung: counted, the sweep goes on
        return Result(planned, None, f"{type(exc).__name__}: {exc}", time.monotonic() - started)
    finally:
        world.stop_all()


def plan_runs(points: list[tuple[str, str]], backends: list[str], runs: int, seed: int) -> list[Planned]:
    planned = [Planned(b, "point", crash=p) for b in backends for p in points]
    extra = max(0, runs - len(planned))
    delays = harness.kill_delays(seed, extra, RANDOM_WINDOW_S)
    faults: list[str | None] = [None, *harness.FAULTS]
    for i, delay in enumerate(delays):
        fault = faults[(i // len(backends)) % len(faults)]
        kind = "random" if fault is None else f"random+{fault}"
        planned.append(Planned(backends[i % len(backends)], kind, kill_after_s=delay, fault=fault))
    return planned


def table(results: list[Result], wall_s: float) -> str:
    groups: dict[tuple[str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.planned.backend, r.planned.kind), []).append(r)
    groups[("all", "all")] = results
    header = ["backend", "kind", "runs", "crashes landed", *COLUMNS, "mean run (s)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (backend, kind), rows in groups.items():
        total: Counter[str] = Counter()
        for r in rows:
            total.update(r.violations())
        landed = sum(1 for r in rows if r.outcome is not None and r.outcome.crashed)
        mean = sum(r.seconds for r in rows) / len(rows)
        cells = [backend, kind, str(len(rows)), str(landed), *(str(total[c]) for c in COLUMNS), f"{mean:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(f"\nwall time {wall_s:.0f} s for {len(results)} runs")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=200, help="runs in all (at least the crash points)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random kill delays")
    parser.add_argument("--jobs", type=int, default=2, help="scenarios played at once")
    parser.add_argument("--skip-pg", action="store_true", help="SQLite only")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="spotopt-faults-"))
    dbs = Databases(tmp, with_pg=not args.skip_pg)
    results: list[Result] = []
    try:
        started = time.monotonic()
        reference = harness.reference_run(tmp)
        clean = run_one(dbs, reference, Planned("sqlite", "clean"), 0)
        if clean.outcome is None or clean.outcome.findings.problems():
            print(f"the clean run failed: {clean.error or clean.outcome}", file=sys.stderr)
            return 1
        points = harness.crash_points(harness.journal_keys(f"sqlite:///{tmp / 'r0' / 'db.sqlite'}"))
        backends = ["sqlite"] if args.skip_pg else ["sqlite", "postgresql"]
        planned = plan_runs(points, backends, args.runs, args.seed)
        print(f"{len(points)} crash points on {', '.join(backends)}, {len(planned)} runs", flush=True)
        results = _run_all(dbs, reference, planned, args.jobs, tmp)
        print(table(results, time.monotonic() - started))
        for r in results:
            if r.violations():
                print(f"VIOLATION {r.planned}: {r.error or r.outcome}", file=sys.stderr)
        return 1 if any(r.violations() for r in results) else 0
    finally:
        dbs.close()
        if not any(r.violations() for r in results):
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"failed runs kept in {tmp}", file=sys.stderr)


def _run_all(
    dbs: Databases, reference: harness.Reference, planned: list[Planned], jobs: int, tmp: Path
) -> list[Result]:
    done = 0

    def one(item: tuple[int, Planned]) -> Result:
        nonlocal done
        index, p = item
        result = run_one(dbs, reference, p, index)
        if not result.violations():  # keep the disk small over 200 runs; keep failures to read
            shutil.rmtree(tmp / f"r{index}", ignore_errors=True)
        done += 1
        print(f"[{done}/{len(planned)}] {_describe(result)}", flush=True)
        return result

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, enumerate(planned, start=1)))


def _describe(r: Result) -> str:
    what = ":".join(r.planned.crash) if r.planned.crash else f"kill after {r.planned.kill_after_s} s"
    what += f" + {r.planned.fault}" if r.planned.fault else ""
    flag = (
        f" VIOLATION {r.error or r.outcome.findings.problems() if r.outcome else ''}"
        if r.violations()
        else ""
    )
    return f"{r.planned.backend} {what} {r.seconds:.1f}s{flag}"


if __name__ == "__main__":
    sys.exit(main())
