"""The oracle's bound against its own replayed schedule on the real AWS spot history (dime-aws).

Imports ``benchmarks/data/dime-aws/*.json.gz`` (five AWS regions, Dec 2019 - Mar 2020; see that
folder's README) into a throwaway SQLite history, then replays the ``oracle`` strategy through
the library (``spotopt.whatif.run.run_strategy``, as ``spotopt whatif`` does) for ResNet-50 and
A3C with the thesis' Table 6.1 throughputs (as in ``data/examples/jobs.yaml``), restricted to AWS,
with and without deadlines, over several starts, without preemptions and with modelled ones for
several seeds. Per job and start it prints the bound, the replayed schedule and the gap
``(schedule - bound) / schedule``, then the mean and largest gap and the time per oracle run.

    python benchmarks/oracle_gap.py [--data DIR] [--start 2020-01-05] [--starts 10] [--every 31]
                                    [--seeds 0,1,2,3,4] [--no-none]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from spotopt.db.queries import MarketFilter
from spotopt.decide.egress import transfer_matrix
from spotopt.history.importers.cloud_dumps import read_spot_history
from spotopt.history.ingest import run_ingest
from spotopt.history.setup import open_history, upgrade_history
from spotopt.history.throughput_store import stored_figures
from spotopt.jobspec import parse_jobs
from spotopt.types import Record
from spotopt.whatif.jobs import build_jobs
from spotopt.whatif.preemptions import PreemptionMode, preemption_table
from spotopt.whatif.run import run_strategy, window_hours
from spotopt.whatif.timeline import load_timeline

DATA = Path(__file__).resolve().parent / "data" / "dime-aws"
RESNET = {"throughput": {"K80": 0.25, "P100": 0.925, "V100": 2.4}, "work": {"gpu_days": 4, "gpu": "V100"}}
A3C = {"throughput": {"K80": 1.0, "P100": 1.2, "V100": 2.2}, "work": {"steps": 400_000}}
COMMON = {"gpus": 1, "allow": {"clouds": ["aws"]}, "restart_s": 300}
JOBS = [
    {"name": "resnet50", **RESNET, **COMMON, "checkpoint_gb": 0.1},
    {"name": "resnet50-5d", **RESNET, **COMMON, "checkpoint_gb": 0.1, "deadline": "5d"},
    {"name": "a3c", **A3C, **COMMON, "checkpoint_gb": 0.05},
    {"name": "a3c-4d", **A3C, **COMMON, "checkpoint_gb": 0.05, "deadline": "4d"},
]
"""ResNet-50's deadline is 1.25x its V100 time, A3C's about 1.9x (50.5 h on a V100)."""


def records(files: list[Path]) -> Iterator[Record]:
    for path in files:
        yield from read_spot_history(path, None)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--start", default="2020-01-05")
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--every", type=float, default=31.0, help="hours between starts")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="seeds of --preemptions model ('' for none)")
    parser.add_argument("--no-none", action="store_true", help="skip the run without preemptions")
    args = parser.parse_args()
    files = sorted(args.data.glob("*.json.gz"))
    if not files:
        raise SystemExit(f"--data {args.data}: no *.json.gz dumps there; pass the dime-aws folder")
    modes = [] if args.no_none else [(PreemptionMode.NONE, 0)]
    modes += [(PreemptionMode.MODEL, int(s)) for s in args.seeds.split(",") if s.strip()]
    spec = parse_jobs({"jobs": JOBS})
    first = datetime.fromisoformat(args.start).replace(tzinfo=UTC)
    rows: list[tuple[str, str, float, float]] = []
    took: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/dime.sqlite"
        upgrade_history(url)
        db = open_history(url)
        summary = run_ingest(db, "aws-spot-history", "dime-aws", records(files))
        print(f"imported {summary.stats.inserted:,} price points from {len(files)} files")
        hours = window_hours(spec, first, args.starts, args.every)
        print(f"{'preemptions':12s} {'start':16s} {'job':12s} {'bound $':>9s} {'schedule $':>10s} gap %")
        for mode, seed in modes:
            with db.session() as session:
                tl = load_timeline(session, first, hours, 1.0, MarketFilter(clouds=["aws"]))
                figures = stored_figures(session)
                events = preemption_table(session, tl, mode, seed)
            sim = build_jobs(spec, tl, figures)
            transfer = transfer_matrix(tl.locations, first)
            label = "none" if mode is PreemptionMode.NONE else "model"
            for k in range(args.starts):
                start = round(k * args.every)
                began = time.process_time()
                run = run_strategy("oracle", tl, sim, events, transfer, start)
                took.append(time.process_time() - began)
                assert run.lower_bound_usd is not None
                for j, name in enumerate(sim.names):
                    bound = float(run.lower_bound_usd[j])
                    finished = math.isfinite(run.result.finish_h[j])
                    schedule = float(run.result.cost_usd[j]) if finished else math.inf
                    rows.append((label, name, bound, schedule))
                    print(
                        f"{label + ('' if mode is PreemptionMode.NONE else f'/{seed}'):12s} "
                        f"{first + timedelta(hours=start):%Y-%m-%d %H:%M} {name:12s} {bound:9.2f} "
                        f"{schedule:10.2f} {100 * _gap(bound, schedule):6.2f}"
                    )
        db.engine.dispose()
    print("\n| job | preemptions | runs | mean bound $ | mean schedule $ | mean gap % | max gap % |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in [str(job["name"]) for job in JOBS]:
        for label in dict.fromkeys(r[0] for r in rows):
            mine = [r for r in rows if r[0] == label and r[1] == name]
            gaps = [_gap(r[2], r[3]) for r in mine]
            print(
                f"| {name} | {label} | {len(mine)} | {_mean([r[2] for r in mine]):.2f} | "
                f"{_mean([r[3] for r in mine]):.2f} | {100 * _mean(gaps):.3f} | {100 * max(gaps):.3f} |"
            )
    gaps = [_gap(r[2], r[3]) for r in rows]
    print(
        f"\n{len(gaps)} job runs: gap mean {100 * _mean(gaps):.3f} %, max {100 * max(gaps):.3f} %; "
        f"oracle {sum(took):.1f} s CPU for {len(took)} starts x {len(JOBS)} jobs "
        f"({sum(took) / len(took):.2f} s per start: bound, path and replay)"
    )


def _gap(bound: float, schedule: float) -> float:
    """How far the bound is below the schedule, as a fraction of the schedule (inf: unfinished)."""
    return (schedule - bound) / schedule if math.isfinite(schedule) else math.inf


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


if __name__ == "__main__":
    main()
