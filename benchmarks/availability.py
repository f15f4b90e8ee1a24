"""Can't Be Late's setting on real spot availability traces: every strategy against the oracle.

    python benchmarks/availability.py --traces ../shared/data/spot-traces-dev [--starts 45]

PATH is a directory laid out like the public skypilot-org/spot-traces repository: the
availability traces ``availability/<layout>/<folder>/<zone>_<gpu>_<n>.json``, each
``{"metadata": {"gap_seconds": G}, "data": [n, ...]}``, ``n`` the instances that could be
launched of those requested (1 of 1 in ``1-node``, 0-16 of 16 in ``16-node``). The job needs one
instance: a probe with ``n >= 1`` is available (``--layout`` picks the folder).
Nothing of it is bundled (it has no license): the benchmark reads the path it is given.

The setting (Wu et al., NSDI '24, §6.1): one job of 48 h of work, its deadline 60 h after its
start, a changeover (restart) of 0.2 h, on-demand $3.06/h and spot $0.9731/h (p3.2xlarge), the
tick the trace's gap; ``--starts`` starts every ``--every`` hours from ``--offset`` hours into
the trace. Per trace (one zone) and for every pair of zones of one GPU at once (the job may
fail over between them), each strategy's mean cost as a fraction of on-demand's, its mean
on-demand and spot hours, and the share of deadlines met. ``--format json`` for scripts.
``--work``, ``--deadline`` and ``--restart`` (hours) and ``--spot-price`` change the setting,
to see how a rule holds beyond the paper's (tighter or looser slack, slower changeovers, other
discounts).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from spotopt.db.queries import Quote
from spotopt.decide.egress import transfer_matrix
from spotopt.decide.guardrails import Guardrails
from spotopt.history.capacity import Capacity
from spotopt.jobspec import parse_jobs
from spotopt.whatif.jobs import build_jobs
from spotopt.whatif.preemptions import no_preemptions, with_capacity
from spotopt.whatif.run import run_strategy
from spotopt.whatif.timeline import build_timeline

STRATEGIES = ("on-demand", "spot", "greedy", "uniform-progress", "up-failover", "spotopt", "oracle")
ON_DEMAND_USD = 3.06


@dataclass(frozen=True)
class Setting:
    """One job's terms: Can't Be Late's by default (§6.1)."""

    work_h: float = 48.0
    deadline_h: float = 60.0
    restart_h: float = 0.2
    spot_usd: float = 0.9731


T0 = datetime(2022, 1, 1, tzinfo=UTC)
"""Nominal start of every trace: only times relative to it matter (prices are constant)."""
TYPES = {("v100", 1): ("p3.2xlarge", "V100-16GB"), ("v100", 8): ("p3.16xlarge", "V100-16GB")}
TYPES |= {("k80", 1): ("p2.xlarge", "K80"), ("k80", 8): ("p2.8xlarge", "K80")}


@dataclass(frozen=True)
class Trace:
    path: Path
    zone: str
    gpu: str
    gpus: int
    gap_s: float
    up: np.ndarray[Any, Any]

    @property
    def region(self) -> str:
        return self.zone.rstrip("abcdefghijklmnopqrstuvwxyz")

    @property
    def name(self) -> str:
        return f"{self.zone} {self.gpu.upper()}×{self.gpus}"


def read_traces(root: Path, layout: str = "1-node") -> list[Trace]:
    out = []
    for path in sorted(root.glob(f"availability/{layout}/*/*.json")):
        zone, gpu, n = path.stem.rsplit("_", 2)
        body = json.loads(path.read_text())
        up = np.asarray(body["data"], dtype=float) > 0
        out.append(Trace(path, zone, gpu, int(n), float(body["metadata"]["gap_seconds"]), up))
    return out


def _quotes(traces: list[Trace], spot_usd: float) -> list[Quote]:
    quotes, seen = [], set()
    for i, tr in enumerate(traces):
        itype, gpu = TYPES[(tr.gpu, tr.gpus)]
        quotes.append(Quote(1 + i, "aws", tr.region, tr.zone, itype, "spot", gpu, tr.gpus, spot_usd, T0, "t"))
        if (tr.region, itype) not in seen:
            seen.add((tr.region, itype))
            od = Quote(
                100 + i, "aws", tr.region, None, itype, "on-demand", gpu, tr.gpus, ON_DEMAND_USD, T0, "t"
            )
            quotes.append(od)
    return quotes


def replay(
    traces: list[Trace], starts: list[float], strategies: tuple[str, ...], setting: Setting = Setting()
) -> dict[str, dict[str, float]]:
    """Mean cost / on-demand cost, on-demand and spot hours, deadlines met, per strategy."""
    gap_h = traces[0].gap_s / 3600.0
    n_ticks = min(len(tr.up) for tr in traces)
    tl = build_timeline(_quotes(traces, setting.spot_usd), T0, n_ticks * gap_h, gap_h)
    index = {(m.quote.zone, m.quote.market): k for k, m in enumerate(tl.markets)}
    market = np.concatenate([np.full(n_ticks, index[(tr.zone, "spot")]) for tr in traces])
    at_h = np.tile(np.arange(n_ticks) * gap_h, len(traces))
    available = np.concatenate([tr.up[:n_ticks] for tr in traces])
    tl.capacity = Capacity.from_observations(tl.n_markets, tl.n_ticks, gap_h, market, at_h, available)
    events = with_capacity(tl, no_preemptions(tl))
    itype, gpu = TYPES[(traces[0].gpu, traces[0].gpus)]
    family = gpu.split("-")[0]
    spec = {
        "name": "cbl",
        "throughput": {family: {traces[0].gpus: 1.0}},
        "gpus": traces[0].gpus,
        "work": {"steps": round(setting.work_h * 3600)},
        "deadline": f"{setting.deadline_h:g}h",
        "restart_s": round(setting.restart_h * 3600),
        "checkpoint_s": 1,
        "allow": {"instance_types": [itype]},
    }
    sim = build_jobs(parse_jobs({"jobs": [spec]}), tl)
    transfer = transfer_matrix(tl.locations, T0)
    sums: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for offset in starts:
        t0 = round(offset / gap_h)
        if t0 + math.ceil(setting.deadline_h / gap_h) > n_ticks:
            continue
        od_cost = None
        for name in strategies:
            res = run_strategy(name, tl, sim, events, transfer, t0, Guardrails(period_h=gap_h)).result
            if name == "on-demand":
                od_cost = float(res.cost_usd[0])
            row = sums[name]
            row["cost"].append(float(res.cost_usd[0]))
            row["od_h"].append(float(res.on_demand_h[0]))
            row["spot_h"].append(float(res.spot_h[0]))
            met = np.isfinite(res.finish_h[0]) and res.finish_h[0] <= setting.deadline_h + 1e-6
            row["met"].append(float(met))
        assert od_cost is not None
        for name in strategies:
            sums[name]["ratio"].append(sums[name]["cost"][-1] / od_cost)
    return {
        name: {k: float(np.mean(v)) for k, v in row.items()} | {"starts": len(row["cost"])}
        for name, row in sums.items()
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--traces", type=Path, required=True)
    ap.add_argument("--starts", type=int, default=45)
    ap.add_argument("--every", type=float, default=13.0, help="hours between starts")
    ap.add_argument("--offset", type=float, default=2.0, help="hours into the trace of the first start")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated substrings of the trace names to run (e.g. us-west-2a_v100_1)",
    )
    ap.add_argument("--no-pairs", action="store_true", help="skip the two-zone runs")
    ap.add_argument("--no-singles", action="store_true", help="skip the one-zone runs")
    ap.add_argument("--format", choices=("table", "json"), default="table")
    ap.add_argument("--work", type=float, default=Setting.work_h, help="hours of work (on-demand)")
    ap.add_argument("--deadline", type=float, default=Setting.deadline_h, help="hours from start to deadline")
    ap.add_argument("--restart", type=float, default=Setting.restart_h, help="changeover, hours")
    ap.add_argument(
        "--spot-price", type=float, default=Setting.spot_usd, help=f"spot $/h (on-demand ${ON_DEMAND_USD}/h)"
    )
    ap.add_argument(
        "--layout",
        default="1-node",
        help="the folder under availability/: 1-node, or 16-node (one instance of 16)",
    )
    args = ap.parse_args(argv)
    wanted = args.only.split(",")
    traces = [t for t in read_traces(args.traces, args.layout) if any(w in t.path.stem for w in wanted)]
    if not traces:
        print(f"error: no availability/{args.layout}/*/*.json under {args.traces}", file=sys.stderr)
        return 2
    strategies = tuple(s for s in args.strategies.split(",") if s)
    if "on-demand" not in strategies:
        strategies = ("on-demand", *strategies)
    if not 0 < args.work <= args.deadline:
        print(f"error: --work {args.work:g} must be in (0, --deadline {args.deadline:g}]", file=sys.stderr)
        return 2
    setting = Setting(args.work, args.deadline, args.restart, args.spot_price)
    starts = [args.offset + k * args.every for k in range(args.starts)]
    cases = [] if args.no_singles else [[t] for t in traces]
    if not args.no_pairs:
        by_kind = defaultdict(list)
        for t in traces:
            by_kind[(t.path.parent, t.gpu, t.gpus)].append(t)
        cases += [group for group in by_kind.values() if len(group) > 1]
    results = []
    for case in cases:
        name = " + ".join(t.name for t in case)
        results.append(
            {
                "trace": name,
                "available": float(np.mean([t.up.mean() for t in case])),
                "strategies": replay(case, starts, strategies, setting),
            }
        )
        if args.format == "table":
            _print(results[-1], strategies)
    if args.format == "json":
        print(json.dumps(results, indent=2))
    return 0


def _print(result: dict[str, Any], strategies: tuple[str, ...]) -> None:
    print(f"\n{result['trace']} (available {result['available']:.2f})")
    print(f"  {'strategy':18} {'cost/OD':>8} {'OD h':>6} {'spot h':>6} {'met':>5}")
    for name in strategies:
        r = result["strategies"][name]
        print(f"  {name:18} {r['ratio']:8.3f} {r['od_h']:6.1f} {r['spot_h']:6.1f} {r['met']:5.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
