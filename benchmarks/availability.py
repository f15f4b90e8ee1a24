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

``--markets`` reproduces issue 38's regime 1 (markets of different prices; SkyNomad's
multi-region setting) on these traces: for every kind (GPU and node size) with several zones,
the job may run in all of them at once, each zone with its own spot price path (``PRICES``:
constant spreads and moving prices) and one on-demand price everywhere. Its terms default to
regime 1 scaled to the traces: 35 h of work, a deadline 52 h after the start (17 h of slack),
base spot $0.612/h (0.2x on-demand, as the cheapest regions of regime 1 are about 0.19x).
K80 cases are for tuning a rule and V100 cases for reporting it (``SETS``); both are printed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
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
MARKET_STRATEGIES = ("on-demand", "uniform-progress", "up-failover", "spotopt", "oracle")
ON_DEMAND_USD = 3.06
SETS = {"k80": "tune", "v100": "report"}
"""``--markets``: the cases a rule may be tuned on (by GPU), and those it is judged on."""


@dataclass(frozen=True)
class Setting:
    """One job's terms: Can't Be Late's by default (§6.1)."""

    work_h: float = 48.0
    deadline_h: float = 60.0
    restart_h: float = 0.2
    spot_usd: float = 0.9731


MARKETS_SETTING = Setting(work_h=35.0, deadline_h=52.0, restart_h=0.2, spot_usd=round(0.2 * ON_DEMAND_USD, 4))
"""Issue 38's regime 1 (a 35 h job with 17 h of slack), base spot 0.2x on-demand."""


@dataclass(frozen=True)
class Prices:
    """Each zone's spot price as a multiple of the base, zones taken in name order (``i`` of
    ``n``), with ``levels = linspace(1, spread, n)``:

    - ``constant``: zone ``i`` pays ``levels[(i + rotation) % n]`` throughout;
    - ``step``: the levels rotate every 24 h: ``levels[(i + rotation + day) % n]``;
    - ``sine``: a daily sine from 1x to ``spread``x, zone ``i``'s phase shifted by ``i / n`` of a
      day, so the cheapest zone moves round the zones (two zones: in antiphase).

    The moving paths are points on the hour (``step``: at each day's start) from the trace's
    start, so a start 13 h later meets another phase of the day."""

    kind: str
    spread: float
    rotation: int = 0

    def name(self, n_zones: int) -> str:
        if self.kind == "constant":
            levels = np.roll(np.linspace(1.0, self.spread, n_zones), -self.rotation)
            return "spot " + "/".join(f"{v:g}x" for v in levels)
        return f"spot {self.kind} 1x-{self.spread:g}x"

    def points_h(self, hours: float) -> np.ndarray[Any, Any]:
        """Hours from the trace's start at which a zone's price is set."""
        step = {"constant": hours, "step": 24.0, "sine": 1.0}[self.kind]
        return np.arange(0.0, hours, step)

    def multiple(self, zone: int, n_zones: int, at_h: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Zone ``zone``'s price at ``at_h`` as a multiple of the base spot price."""
        levels = np.linspace(1.0, self.spread, n_zones)
        if self.kind == "sine":
            phase = 2 * np.pi * (at_h / 24.0 + (zone + self.rotation) / n_zones)
            return 1.0 + (self.spread - 1.0) * (1.0 - np.cos(phase)) / 2.0
        day = (at_h // 24.0).astype(int) if self.kind == "step" else np.zeros(len(at_h), dtype=int)
        return levels[(zone + self.rotation + day) % n_zones]


FLAT = Prices("constant", 1.0)
"""Every zone at the base price: the paper's setting."""
PRICES = {
    "1.5x": ("constant", 1.5),
    "2.5x": ("constant", 2.5),
    "4x": ("constant", 4.0),
    "sine": ("sine", 4.0),
    "step": ("step", 4.0),
}
"""``--prices`` names: each constant spread is run with every rotation (which zone is cheap)."""


def price_cases(names: list[str], n_zones: int) -> list[Prices]:
    """The price paths of ``--prices`` for a case of ``n_zones`` zones."""
    out = []
    for name in names:
        kind, spread = PRICES[name]
        rotations = range(n_zones) if kind == "constant" else range(1)
        out += [Prices(kind, spread, r) for r in rotations]
    return out


T0 = datetime(2022, 1, 1, tzinfo=UTC)
"""Nominal start of every trace: only times relative to it matter (prices are set from it)."""
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


def _quotes(traces: list[Trace], spot_usd: float, hours: float, prices: Prices = FLAT) -> list[Quote]:
    """Each zone's spot price path (``prices`` of ``spot_usd``) and one on-demand price per region."""
    quotes, seen = [], set()
    at_h = prices.points_h(hours)
    for i, tr in enumerate(traces):
        itype, gpu = TYPES[(tr.gpu, tr.gpus)]
        for h, k in zip(at_h, prices.multiple(i, len(traces), at_h), strict=True):
            usd = spot_usd * float(k)
            when = T0 + timedelta(hours=float(h))
            quotes.append(
                Quote(1 + i, "aws", tr.region, tr.zone, itype, "spot", gpu, tr.gpus, usd, when, "t")
            )
        if (tr.region, itype) not in seen:
            seen.add((tr.region, itype))
            od = Quote(
                100 + i, "aws", tr.region, None, itype, "on-demand", gpu, tr.gpus, ON_DEMAND_USD, T0, "t"
            )
            quotes.append(od)
    return quotes


def replay(
    traces: list[Trace],
    starts: list[float],
    strategies: tuple[str, ...],
    setting: Setting = Setting(),
    prices: Prices = FLAT,
) -> dict[str, dict[str, float]]:
    """Mean cost / on-demand cost, on-demand and spot hours, deadlines met, per strategy."""
    gap_h = traces[0].gap_s / 3600.0
    n_ticks = min(len(tr.up) for tr in traces)
    hours = n_ticks * gap_h
    tl = build_timeline(_quotes(traces, setting.spot_usd, hours, prices), T0, hours, gap_h)
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
    ap.add_argument(
        "--strategies",
        default=None,
        help=f"default: {','.join(STRATEGIES)} ({','.join(MARKET_STRATEGIES)} with --markets)",
    )
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated substrings of the trace names to run (e.g. us-west-2a_v100_1)",
    )
    ap.add_argument("--no-pairs", action="store_true", help="skip the two-zone runs")
    ap.add_argument("--no-singles", action="store_true", help="skip the one-zone runs")
    ap.add_argument(
        "--markets",
        action="store_true",
        help="markets of different prices: all zones of a kind at once under each of --prices",
    )
    ap.add_argument(
        "--prices",
        default=",".join(PRICES),
        help=f"with --markets, the price paths: some of {','.join(PRICES)}",
    )
    ap.add_argument("--format", choices=("table", "json"), default="table")
    terms = "default: Can't Be Late's %s, with --markets regime 1's %s"
    ap.add_argument(
        "--work", type=float, help=terms % (Setting.work_h, MARKETS_SETTING.work_h) + " (hours of work)"
    )
    ap.add_argument(
        "--deadline", type=float, help=terms % (Setting.deadline_h, MARKETS_SETTING.deadline_h) + " (hours)"
    )
    ap.add_argument("--restart", type=float, help=terms % (Setting.restart_h, MARKETS_SETTING.restart_h))
    ap.add_argument(
        "--spot-price",
        type=float,
        help=terms % (Setting.spot_usd, MARKETS_SETTING.spot_usd)
        + f" (spot $/h; on-demand ${ON_DEMAND_USD}/h)",
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
    strategies = tuple(
        s for s in (args.strategies or ",".join(_default_strategies(args.markets))).split(",") if s
    )
    if "on-demand" not in strategies:
        strategies = ("on-demand", *strategies)
    setting = _setting(args)
    if not 0 < setting.work_h <= setting.deadline_h:
        print(
            f"error: --work {setting.work_h:g} must be in (0, --deadline {setting.deadline_h:g}]",
            file=sys.stderr,
        )
        return 2
    unknown = [p for p in args.prices.split(",") if p not in PRICES]
    if unknown:
        print(f"error: --prices {','.join(unknown)}: not one of {','.join(PRICES)}", file=sys.stderr)
        return 2
    starts = [args.offset + k * args.every for k in range(args.starts)]
    if args.markets:
        cases = [
            (group, p) for group in _kinds(traces) for p in price_cases(args.prices.split(","), len(group))
        ]
    else:
        cases = [] if args.no_singles else [([t], FLAT) for t in traces]
        cases += [] if args.no_pairs else [(group, FLAT) for group in _kinds(traces)]
    results = []
    for case, prices in cases:
        result = {
            "trace": " + ".join(t.name for t in case),
            "available": float(np.mean([t.up.mean() for t in case])),
            "strategies": replay(case, starts, strategies, setting, prices),
        }
        if args.markets:
            result |= {"prices": prices.name(len(case)), "set": SETS.get(case[0].gpu, "report")}
        results.append(result)
        if args.format == "table":
            _print(results[-1], strategies)
    if args.format == "json":
        print(json.dumps(results, indent=2))
    return 0


def _default_strategies(markets: bool) -> tuple[str, ...]:
    """Beside the oracle, the failover and the progress rules regime 1 is judged against."""
    return MARKET_STRATEGIES if markets else STRATEGIES


def _setting(args: argparse.Namespace) -> Setting:
    """The job's terms: those given, else the mode's defaults (the paper's, or regime 1's)."""
    base = MARKETS_SETTING if args.markets else Setting()
    given = (args.work, args.deadline, args.restart, args.spot_price)
    defaults = (base.work_h, base.deadline_h, base.restart_h, base.spot_usd)
    return Setting(*(d if g is None else g for g, d in zip(given, defaults, strict=True)))


def _kinds(traces: list[Trace]) -> list[list[Trace]]:
    """The zones of each kind (folder, GPU, node size) that has several: run all at once."""
    by_kind = defaultdict(list)
    for t in traces:
        by_kind[(t.path.parent, t.gpu, t.gpus)].append(t)
    return [group for group in by_kind.values() if len(group) > 1]


def _print(result: dict[str, Any], strategies: tuple[str, ...]) -> None:
    prices = f", {result['prices']} ({result['set']})" if "prices" in result else ""
    print(f"\n{result['trace']} (available {result['available']:.2f}){prices}")
    print(f"  {'strategy':18} {'cost/OD':>8} {'OD h':>6} {'spot h':>6} {'met':>5}")
    for name in strategies:
        r = result["strategies"][name]
        print(f"  {name:18} {r['ratio']:8.3f} {r['od_h']:6.1f} {r['spot_h']:6.1f} {r['met']:5.2f}")
    rows = result["strategies"]
    if "prices" in result and {"spotopt", "oracle", "up-failover"} <= set(rows):
        mine, oracle, failover = (rows[k]["ratio"] for k in ("spotopt", "oracle", "up-failover"))
        print(f"  spotopt ÷ oracle {mine / oracle:.3f}, ÷ up-failover {mine / failover:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
