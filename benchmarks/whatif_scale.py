"""What-if at scale: 90 days of hourly prices × 5k markets × 100 jobs (target <= 30 s).

The timeline is built in memory from generated price points (``build_timeline``, the same code
that loads the history); generating the points is not timed, the database read is measured by
the ingest benchmarks. Timed (wall clock, and CPU seconds of this process, which other load on
the machine does not inflate): the timeline, option building, preemption drawing and each
strategy's replay. The oracle is a per-job DP and is benchmarked on a subset of jobs
(``--oracle-jobs``).

    python benchmarks/whatif_scale.py [--days 90] [--markets 5000] [--jobs 100]
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta

import numpy as np

from spotopt.catalog import instance_types
from spotopt.db.queries import Quote
from spotopt.decide.egress import transfer_matrix
from spotopt.jobspec import parse_jobs
from spotopt.whatif.jobs import build_jobs
from spotopt.whatif.preemptions import model_preemptions
from spotopt.whatif.run import STRATEGIES, run_strategy
from spotopt.whatif.timeline import build_timeline

T0 = datetime(2024, 1, 1, tzinfo=UTC)
GPUS = ("K80", "P100", "V100-16GB", "T4", "A10G", "L4", "A100-40GB")


def markets(n: int, rng: np.random.Generator) -> list[tuple[int, str, str, str, str, str, float, float]]:
    """``n`` markets over catalog GPU types, spread over 3 clouds × 8 regions × 3 zones."""
    types = [t for t in instance_types() if t.gpu_model in GPUS and t.gpu_count and t.gpu_count >= 1]
    out = []
    for mid in range(n):
        t = types[mid % len(types)]
        region = f"region-{(mid // len(types)) % 8}"
        kind = "on-demand" if mid % 10 == 0 else "spot"
        zone = "" if kind == "on-demand" else f"{region}{'abc'[mid % 3]}"
        base = float(t.gpu_count) * rng.uniform(0.4, 3.0)
        out.append((mid, t.cloud, region, zone, t.name, kind, base, float(t.gpu_count)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--days", type=int, default=90)
    parser.add_argument("--markets", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--oracle-jobs", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    quotes = []
    gpu_of = {t.name: t.gpu_model for t in instance_types()}
    for mid, cloud, region, zone, name, kind, base, count in markets(args.markets, rng):
        hours = (
            [0] if kind == "on-demand" else sorted({0, *rng.integers(0, args.days * 24, args.days).tolist()})
        )
        for h in hours:
            price = base * (1.0 if kind == "on-demand" else rng.uniform(0.25, 0.6))
            quotes.append(
                Quote(
                    mid,
                    cloud,
                    region,
                    zone,
                    name,
                    kind,
                    gpu_of[name],
                    count,
                    price,
                    T0 + timedelta(hours=h),
                    "bench",
                )
            )
    print(f"load average at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    clock = Clock()
    tl = build_timeline(quotes, T0, args.days * 24, 1.0)
    tl.rate[~tl.on_demand] = rng.uniform(1 / 72, 1 / 12, int((~tl.on_demand).sum()))
    t_timeline = clock.lap()
    jobs = [
        {
            "name": f"job{j}",
            "throughput": {"K80": 1.0, "P100": 3.0, "V100": 6.0, "T4": 2.0, "A10G": 5.0, "L4": 4.0},
            "work": {"gpu_days": float(rng.choice([0.5, 1, 2, 4, 8])), "gpu": "V100"},
            "deadline": None if j % 3 else f"{int(rng.integers(10, 40))}d",
            "checkpoint_gb": 1.0,
            "restart_s": 300,
        }
        for j in range(args.jobs)
    ]
    sim = build_jobs(parse_jobs({"jobs": jobs}), tl)
    events = model_preemptions(tl, 1)
    transfer = transfer_matrix(tl.locations, T0)
    t_build = clock.lap()
    print(
        f"{args.days} days × {tl.n_markets} markets × {args.jobs} jobs: {sim.n_options} options; "
        f"timeline {t_timeline}, options + preemptions {t_build}"
    )
    for name in (n for n in STRATEGIES if n != "oracle"):
        run = run_strategy(name, tl, sim, events, transfer, 0)
        lap = clock.lap()
        done = int(np.isfinite(run.result.finish_h).sum())
        print(
            f"  {name:12s} {lap}  total ${run.result.cost_usd.sum():,.0f}  "
            f"finished {done}/{sim.n_jobs} {run.notes}"
        )
    print(f"timeline + options + all strategies except the oracle: {clock.total()} (target <= 30 s)")
    if args.oracle_jobs:
        from spotopt.whatif.oracle import solve_job, undominated

        lo, hi = sim.bounds()[:2]
        kept = len(undominated(tl, sim, events, np.arange(lo, hi), 0))
        clock = Clock()
        for j in range(min(args.oracle_jobs, sim.n_jobs)):
            solve_job(tl, sim, events, transfer, j, 0)
        print(
            f"oracle bound: {clock.lap()} for {args.oracle_jobs} job(s); "
            f"job 0 has {hi - lo} options, {kept} after exact dominance"
        )


class Clock:
    """Wall and process CPU time since the last lap."""

    def __init__(self) -> None:
        self.start = self.last = (time.perf_counter(), time.process_time())

    def lap(self) -> str:
        now = (time.perf_counter(), time.process_time())
        wall, cpu = now[0] - self.last[0], now[1] - self.last[1]
        self.last = now
        return f"{wall:5.1f} s (cpu {cpu:5.1f} s)"

    def total(self) -> str:
        wall, cpu = time.perf_counter() - self.start[0], time.process_time() - self.start[1]
        return f"{wall:.1f} s (cpu {cpu:.1f} s)"


if __name__ == "__main__":
    main()
