"""Fidelity: what the replayed daemon really pays against what ``spotopt whatif`` predicted.

For the bundled example jobs on the bundled (synthetic) example market, and optionally for
ResNet-50 and A3C on the real AWS spot history in ``benchmarks/data/dime-aws`` (``--dime``), it
runs ``spotopt.replay.harness.fidelity``: the what-if engine (strategy ``spotopt``) and the real
daemon (executor, journal, lease, checkpoints, the stand-in workload as ``local`` processes) on
a simulated clock from the same start, on a throwaway copy of the history, with no preemptions
and with preemptions drawn from the markets' rates (``--preemptions model``, the same table for
both).
Per job it prints the predicted and realised cost, finish time, moves and preemptions and their
relative differences, then the rounds and the real time the replay took.

    python benchmarks/fidelity.py [--start 2020-02-03] [--dime] [--dime-start 2020-01-05]
        [--preemptions none,model] [--seed 0] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from spotopt.db.engine import Database
from spotopt.history.setup import open_history
from spotopt.jobspec import JobSpec, parse_jobs
from spotopt.replay.harness import Fidelity, FidelityRequest, fidelity
from spotopt.settings import Settings
from spotopt.types import Record
from spotopt.whatif.example_market import example_jobs
from spotopt.whatif.preemptions import PreemptionMode
from spotopt.whatif.replay import example_history

DATA = Path(__file__).resolve().parent / "data" / "dime-aws"
RESNET = {"throughput": {"K80": 0.25, "P100": 0.925, "V100": 2.4}, "work": {"gpu_days": 4, "gpu": "V100"}}
A3C = {"throughput": {"K80": 1.0, "P100": 1.2, "V100": 2.2}, "work": {"steps": 400_000}}
COMMON = {"gpus": 1, "allow": {"clouds": ["aws"]}, "restart_s": 300}
DIME_JOBS = [
    {"name": "resnet50-5d", **RESNET, **COMMON, "checkpoint_gb": 0.1, "deadline": "5d"},
    {"name": "a3c", **A3C, **COMMON, "checkpoint_gb": 0.05},
]
"""The jobs of ``benchmarks/oracle_gap.py`` (thesis Table 6.1 throughputs), restricted to AWS."""


@contextmanager
def dime_history(data: Path) -> Iterator[Database]:
    """The dime AWS spot history in a throwaway SQLite database (as ``oracle_gap.py`` loads it)."""
    from spotopt.history.importers.cloud_dumps import read_spot_history
    from spotopt.history.ingest import run_ingest

    def records() -> Iterator[Record]:
        for path in sorted(data.glob("*.json.gz")):
            yield from read_spot_history(path, None)

    with tempfile.TemporaryDirectory(prefix="spotopt-dime-") as tmp:
        db = open_history(f"sqlite:///{Path(tmp) / 'dime.sqlite'}", Settings(auto_migrate=True))
        try:
            run_ingest(db, "aws-spot-history", "dime-aws", records())
            yield db
        finally:
            db.dispose()


def measure(
    db: Database, spec: JobSpec, start: datetime, label: str, mode: PreemptionMode, seed: int
) -> Fidelity:
    request = FidelityRequest(spec=spec, start=start, preemptions=mode, seed=seed)
    with tempfile.TemporaryDirectory(prefix="spotopt-fidelity-") as tmp:
        out = fidelity(db, request, Path(tmp))
    drawn = f" (seed {seed})" if mode is PreemptionMode.MODEL else ""
    print(f"\n{label}: from {out.whatif.first_start:%Y-%m-%d %H:%M} UTC, preemptions {mode.value}{drawn}")
    print(
        f"{'job':<14}{'pred $':>9}{'egress $':>9}{'real $':>9}{'Δcost':>9}"
        f"{'pred h':>9}{'real h':>9}{'Δfinish':>9}{'moves':>8}{'preempt':>9}"
    )
    for r in out.rows:
        print(
            f"{r['job']:<14}{r['predicted_cost_usd']:>9.2f}{r['predicted_egress_usd']:>9.2f}"
            f"{r['realised_cost_usd']:>9.2f}{_pct(r['cost_diff']):>9}"
            f"{r['predicted_finish_hours']:>9.2f}{r['realised_finish_hours']:>9.2f}"
            f"{_pct(r['finish_diff']):>9}{r['predicted_moves']:>4}/{r['realised_moves']:<3}"
            f"{r['predicted_preemptions']:>5}/{r['realised_preemptions']:<3}"
        )
    print(f"{out.rounds} daemon rounds in {out.real_seconds:.0f} s real time")
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--start", default="2020-02-03", help="example market start (ISO date)")
    parser.add_argument("--dime", action="store_true", help="also replay the dime AWS history")
    parser.add_argument("--dime-start", default="2020-01-05")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument(
        "--preemptions",
        default="none,model",
        help="comma-separated modes to run, each a whole replay (default: none,model)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of --preemptions model")
    parser.add_argument("--json", type=Path, help="also write every row to this JSON file")
    args = parser.parse_args()
    modes = [PreemptionMode(m) for m in args.preemptions.split(",")]
    results: dict[str, Any] = {}
    for mode in modes:
        with example_history() as db:
            start = datetime.fromisoformat(args.start).replace(tzinfo=UTC)
            label = "example market (SYNTHETIC)"
            out = measure(db, example_jobs(), start, label, mode, args.seed)
            results[f"example/{mode.value}"] = out.rows
        if args.dime:
            with dime_history(args.data) as db:
                start = datetime.fromisoformat(args.dime_start).replace(tzinfo=UTC)
                spec = parse_jobs({"jobs": DIME_JOBS})
                out = measure(db, spec, start, "dime AWS spot history", mode, args.seed)
                results[f"dime-aws/{mode.value}"] = out.rows
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")


if __name__ == "__main__":
    main()
