"""How well spotopt estimates a job's steps/s where it was not measured (issue 37).

    python benchmarks/throughput_accuracy.py --data ../shared/data/throughput-dev [--split report]

``--data`` is a folder laid out like ``throughput-dev`` (``sia/traces/<workload>/placements-
<cluster>.csv``, Sia SOSP '23's measured step times; never bundled here: no licence). Each
workload is taken at one per-GPU batch (the largest its five clusters all measured on one GPU);
a step is one GPU's batch, so ``d`` GPUs make ``d / step_time`` steps/s.

Cases, each scored on ``|ln(predicted / measured)|`` (median, 90th percentile) beside the
baseline of the data's README (the job's known speed times the median ratio between the two
GPUs over the other workloads; with two kinds known, the geometric mean of both):
- ``two kinds known``: the job measured on two GPU kinds, every other kind predicted, through
  ``JobThroughput`` with the other workloads stored as references;
- ``one kind known``: the same from one kind;
- ``kind left out``: the target GPU kind dropped from the references too (datasheet prior only);
- ``interval``: the share of those cases whose measured value lies in the 80 % interval;
- counts: one node from the 1-GPU figure alone (``scaling.fit`` of one point), from the 1- and
  2-GPU points at 4 and 8, one count left out of all the job's one-node counts, and across nodes
  from the job's one-node points (relative error ``|pred/measured - 1|``), each with the share
  whose measured value lies in the 80 % interval (``ScalingFit.log_sigma``);
- plan regret: the true cost of min-cost-slo's plan for a job known on one GPU kind over the
  plan with every true figure (catalog on-demand list prices; ``regret_cases``).

- Rubick's A800 plans (``rubick/``: MLSys '25's profiles and traces, Apache-2.0): per model,
  ``plans.fit`` on its profiled runs, the mean ``|predicted / measured - 1|`` of the iteration
  time over the trace configurations the profile lacks (``rubick_cases``). Either folder may be
  absent.

Tuning and reporting are split by workload (``TUNE`` / ``REPORT``): the model's constants were
chosen on ``--split tune`` only; ``--split report`` is the held-out figure.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import statistics
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from spotopt.catalog import instance_types, interconnects, list_prices
from spotopt.db.queries import Quote
from spotopt.errors import InfeasibleError, InputError
from spotopt.history.market import MarketState
from spotopt.jobspec import parse_jobs
from spotopt.plan import build_problem, solve
from spotopt.throughput import JobThroughput, StoredFigure, across, plans
from spotopt.throughput.scaling import Point, Topology, fit, topology_of

CLUSTERS = {  # Sia's simulator_config.py: the hardware of each cluster
    "aws": "T4",
    "azure": "V100-32GB",
    "dgx": "A100-40GB",
    "quad": "QUADRO-RTX-6000",
    "rtx": "RTX-2080-TI",
}
WORKLOADS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
TUNE = ("cifar10", "deepspeech2", "yolov3")
REPORT = ("bert", "imagenet", "ncf")


def topologies() -> dict[str, Topology]:
    """Each cluster's node: the catalog's instance type where a cloud sells it; the two
    on-premises clusters have PCIe gen3 GPUs and no documented network (the default 25 Gbit/s)."""
    links = interconnects()
    dgx = links[("aws", "p4d.24xlarge")]  # 8 x A100-40GB on NVSwitch, as a DGX-A100
    return {
        "aws": topology_of(links[("aws", "g4dn.12xlarge")], 4),
        "azure": topology_of(links[("azure", "Standard_ND40rs_v2")], 8),
        "dgx": Topology(8, dgx.gpu_link_gbs, 1600.0),  # DGX-A100: 8 x 200 Gbit/s HDR
        "quad": Topology(4, 32.0, 25.0),
        "rtx": Topology(8, 32.0, 25.0),
    }


def load(data: Path) -> dict[str, dict[str, dict[str, float]]]:
    """workload → cluster → placement → steps/s at the workload's chosen per-GPU batch."""
    raw: dict[tuple[str, str], list[dict[str, str]]] = {}
    for workload in WORKLOADS:
        for cluster in CLUSTERS:
            path = data / "sia" / "traces" / workload / f"placements-{cluster}.csv"
            with path.open() as fh:
                raw[(workload, cluster)] = list(csv.DictReader(fh))
    out: dict[str, dict[str, dict[str, float]]] = {}
    for workload in WORKLOADS:
        batch = max(
            set.intersection(
                *(
                    {int(r["local_bsz"]) for r in raw[(workload, c)] if r["placement"] == "1"}
                    for c in CLUSTERS
                )
            )
        )
        for cluster in CLUSTERS:
            for r in raw[(workload, cluster)]:
                if int(r["local_bsz"]) == batch:
                    gpus = sum(int(ch) for ch in r["placement"])
                    out.setdefault(workload, {}).setdefault(cluster, {})[r["placement"]] = gpus / float(
                        r["step_time"]
                    )
    return out


def _job(name: str, throughput: dict[str, float]):  # type: ignore[no-untyped-def]
    return parse_jobs({"jobs": [{"name": name, "work": {"steps": 1}, "throughput": throughput}]}).jobs[0]


REGRET_HOURS = 10.0
"""Plan regret: each job's work is this many hours on its fastest GPU kind, its deadline
``REGRET_SLACK`` times that (so the cheapest kind does not always meet it)."""
REGRET_SLACK = 3.0


def list_price_markets(at: datetime) -> list[MarketState]:
    """Every catalog on-demand list price of an instance type with one of the data's GPU kinds."""
    specs = {(s.cloud, s.name): s for s in instance_types()}
    out: list[MarketState] = []
    for price in list_prices():
        spec = specs.get((price.market.cloud, price.market.instance_type))
        if spec is None or spec.gpu_model not in CLUSTERS.values() or not spec.gpu_count:
            continue
        m = price.market
        quote = Quote(len(out), m.cloud, m.region, None, m.instance_type, "on-demand", spec.gpu_model,
                      spec.gpu_count, price.usd_per_hour, at, "catalog")  # fmt: skip
        out.append(MarketState(quote, 0.0, "on-demand", None))
    return out


def _true_plan_cost(
    job: str,
    throughput: dict[str, float],
    truth: dict[str, float],
    steps: int,
    markets: list[MarketState],
    refs: list[StoredFigure],
    at: datetime,
) -> tuple[float, float]:
    """min-cost-slo's plan for ``job`` known by ``throughput``, re-run at the ``truth`` (GPU kind
    -> steps/s): (what finishing the work on the picked options costs, how many hours it takes).
    An hour of an option costs its market's price per job slot: the policy's ``usd_per_hour`` is
    the expected cost spread over the pessimistic hours (its deadlines read the low end), not
    what an hour is billed."""
    deadline = f"{REGRET_HOURS * REGRET_SLACK:g}h"
    spec = parse_jobs(
        {"jobs": [{"name": job, "throughput": throughput, "work": {"steps": steps}, "deadline": deadline}]}
    )
    problem = build_problem(spec, markets, at, refs)
    alloc = solve("min-cost-slo", problem.input)
    paid, done, hours = 0.0, 0.0, 0.0
    for e, info in enumerate(problem.options):
        if alloc.hours[e] > 1e-9:
            quote = info.market.quote
            paid += quote.usd_per_hour / info.slots * float(alloc.hours[e])
            done += float(alloc.hours[e]) * 3600 * truth[quote.gpu or ""] * info.efficiency
            hours += float(alloc.hours[e])
    return paid * steps / done, hours * steps / done


def regret_cases(data: dict[str, dict[str, dict[str, float]]], jobs: Iterable[str]) -> dict[str, list[float]]:
    """The true cost of what min-cost-slo picks for a job measured on one GPU kind (the other
    kinds estimated from the other workloads), over the cost of the plan made with every true
    one-GPU figure; on-demand list prices, one GPU per job. The picked plan's hours are re-run at
    the true speeds: its cost is what finishing the work on the picked options costs (below 1
    where the estimate picked a slower, cheaper GPU and so misses the deadline: counted apart)."""
    at = datetime(2024, 1, 1, tzinfo=UTC)
    markets = list_price_markets(at)
    one = {w: {CLUSTERS[c]: data[w][c]["1"] for c in CLUSTERS} for w in data}
    res: dict[str, list[float]] = {}
    for job in jobs:
        truth = one[job]
        steps = round(REGRET_HOURS * 3600 * max(truth.values()))
        refs = [StoredFigure(w, g, 1, v, "imported") for w in one if w != job for g, v in one[w].items()]
        best, _ = _true_plan_cost(job, truth, truth, steps, markets, refs, at)
        for known in truth:
            try:
                cost, wall = _true_plan_cost(job, {known: truth[known]}, truth, steps, markets, refs, at)
            except InfeasibleError:  # the estimates say no GPU meets the deadline: no plan at all
                res.setdefault("plan regret: a plan made", []).append(0.0)
                continue
            res.setdefault("plan regret: a plan made", []).append(1.0)
            res.setdefault("plan regret, one kind known (true cost / best)", []).append(cost / best)
            res.setdefault("plan regret: deadline met", []).append(float(wall <= REGRET_HOURS * REGRET_SLACK))
    return res


def _baseline(one: dict[str, dict[str, float]], job: str, known: Iterable[str], target: str) -> float:
    logs = []
    for k in known:
        ratios = [one[w][target] / one[w][k] for w in one if w != job]
        logs.append(math.log(one[job][k] * statistics.median(ratios)))
    return math.exp(sum(logs) / len(logs))


def across_cases(data: dict[str, dict[str, dict[str, float]]], jobs: Iterable[str]) -> dict[str, list[float]]:
    one = {w: {CLUSTERS[c]: data[w][c]["1"] for c in CLUSTERS} for w in data}
    gpus = list(CLUSTERS.values())
    res: dict[str, list[float]] = {}
    for job in jobs:
        for n_known in (1, 2):
            for known in itertools.combinations(gpus, n_known):
                for target in gpus:
                    if target in known:
                        continue
                    measured = one[job][target]
                    for left_out in (False, True):
                        refs = [
                            StoredFigure(w, g, 1, v, "imported")
                            for w in one
                            if w != job
                            for g, v in one[w].items()
                            if not (left_out and g == target)
                        ]
                        book = JobThroughput(_job(job, {g: one[job][g] for g in known}), refs)
                        fig = book.at(target, 1)
                        assert fig is not None and fig.low is not None and fig.high is not None
                        case = ("kind left out, " if left_out else "") + (
                            "two kinds known" if n_known == 2 else "one kind known"
                        )
                        res.setdefault(case, []).append(abs(math.log(fig.steps_per_s / measured)))
                        res.setdefault(f"{case}: in 80 % interval", []).append(
                            float(fig.low <= measured <= fig.high)
                        )
                        if not left_out:
                            base = _baseline(one, job, known, target)
                            res.setdefault(f"{case}: baseline", []).append(abs(math.log(base / measured)))
    return res


def count_cases(data: dict[str, dict[str, dict[str, float]]], jobs: Iterable[str]) -> dict[str, list[float]]:
    topo = topologies()
    res: dict[str, list[float]] = {}

    def point(cluster: str, placement: str, value: float) -> Point:
        return Point(
            CLUSTERS[cluster], sum(int(ch) for ch in placement), len(placement), value, topo[cluster]
        )

    def predict(points: list[Point], cluster: str, placement: str, case: str, measured: float) -> float:
        """The fitted model's figure at ``placement``, its 80 % interval's hit counted under ``case``:
        scaled from the job's measured one-GPU figure, as ``JobThroughput`` scales it (the fit's
        own one-GPU time differs from it where no model passes through every point)."""
        model = fit(points)
        gpu = CLUSTERS[cluster]
        gpus, nodes = sum(int(ch) for ch in placement), len(placement)
        one = next(p.steps_per_s for p in points if p.gpus == 1)
        value = model.steps_per_s(one, gpu, gpus, nodes, topo[cluster])
        spread = across.Z80 * model.log_sigma(gpus, nodes)  # the one-GPU figure is measured: exact
        low, high = value * math.exp(-spread), value * math.exp(spread)
        res.setdefault(f"{case}: in 80 % interval", []).append(float(low <= measured <= high))
        return value

    for job in jobs:
        for cluster, figures in data[job].items():
            per_node = topo[cluster].gpus_per_node
            single = {str(n): figures[str(n)] for n in (1, 2, 4, 8) if n <= per_node and str(n) in figures}
            ones = [point(cluster, "1", figures["1"])]
            for p, v in single.items():
                if p != "1":
                    case = "one node, from the 1-GPU figure"
                    res.setdefault(case, []).append(abs(predict(ones, cluster, p, case, v) / v - 1))
            if "2" in single:
                pair = [*ones, point(cluster, "2", single["2"])]
                for p in ("4", "8"):
                    if p in single:
                        case = f"{p} GPUs, from 1 and 2"
                        res.setdefault(case, []).append(
                            abs(predict(pair, cluster, p, case, single[p]) / single[p] - 1)
                        )
            for p in single:
                if p == "1":
                    continue
                rest = [point(cluster, q, v) for q, v in single.items() if q != p]
                case = "one count left out (one node)"
                res.setdefault(case, []).append(
                    abs(predict(rest, cluster, p, case, single[p]) / single[p] - 1)
                )
            node_points = [point(cluster, q, v) for q, v in single.items()]
            for p, v in figures.items():
                if len(p) > 1 and len(set(p)) == 1:  # even placements over several nodes
                    case = "across nodes, from one node's points"
                    res.setdefault(case, []).append(abs(predict(node_points, cluster, p, case, v) / v - 1))
    return res


RUBICK = {  # profile folder -> its trace folder (llama30b's profile is a copy of llama7b's)
    "bert": "bert",
    "gpt2": "gpt2",
    "llama7b": "llama7",
    "llama30b": "llama30",
    "roberta": "roberta",
    "t5": "t5",
    "vit": "vit",
}
RUBICK_STRATEGY = {"1100": "ga", "1111": "zero-offload", "1102": "zero-dp"}
"""Rubick's profile strategy codes (plain data parallel, ZeRO-offload, ZeRO-2) as trace plan names."""


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8-sig") as fh:  # Rubick's profile files start with a BOM
        return list(csv.DictReader(fh))


def rubick_cases(data: Path) -> dict[str, list[float]]:
    """Rubick's A800 models: ``plans.fit`` on each model's profiled runs (all on one node), then
    ``|predicted / measured - 1|`` of the iteration time of every trace configuration the
    profile does not contain (the forward from ``plans.fit_forward``: 3D rows record none): all
    of them, then those on one node (the paper's Table 2 protocol: 1-8 GPUs of one server) and
    those across nodes apart. A profile the model refuses (``plans.fit``'s InputError) is named
    on stderr and gets no rows."""
    root = data / "rubick"
    res: dict[str, list[float]] = {}
    for profile, trace in RUBICK.items():
        folder = root / "artifact" / "71_performance_model" / "model" / "profile" / profile
        if not folder.is_dir():  # a data folder may hold some of the models
            continue
        config, measured = _rows(folder / "config.csv"), _rows(folder / "data.csv")
        first = config[0]
        job = plans.Job(  # parameter_size counts millions (2**20) of parameters
            float(first["parameter_size"]) * 2**20 * plans.BYTES_PER_PARAMETER,
            float(first["batch_size"]),
            float(first["seq_hid"]),
        )
        runs = [
            plans.Run(
                plans.parse_plan(RUBICK_STRATEGY[m["strategy"]], int(c["gpus"])),
                plans.Layout(int(c["nodes"]), int(c["gpus"])),
                plans.Parts(*(float(m[k]) for k in ("forward_time", "Tcc", "Topt", "iter_time"))),
            )
            for c, m in zip(config, measured, strict=True)
        ]
        profiled = {
            (RUBICK_STRATEGY[m["strategy"]], c["gpus"]) for c, m in zip(config, measured, strict=True)
        }
        try:
            params, forward = plans.fit(job, runs), plans.fit_forward(runs)
        except InputError as err:  # a profile the model cannot be fitted to: said, not scored
            print(f"rubick {profile}: not fitted: {err}", file=sys.stderr)
            continue
        for r in _rows(root / "simulator" / "traces" / trace / "placements.csv"):
            if float(r["iter_time"]) <= 0 or (r["exec_plan"], r["placement"]) in profiled:
                continue
            layout = plans.layout_of(r["placement"])
            plan = plans.parse_plan(r["exec_plan"], sum(int(ch) for ch in r["placement"]))
            predicted = plans.predict(params, job, forward, plan, layout)
            error = abs(predicted / float(r["iter_time"]) - 1)
            for where in ("all", "one node" if layout.nodes == 1 else "across nodes"):
                res.setdefault(f"{profile}, {where}", []).append(error)
    order = ("all", "one node", "across nodes")
    return dict(sorted(res.items(), key=lambda kv: (kv[0].split(", ")[0], order.index(kv[0].split(", ")[1]))))


def _q(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="a folder laid out like throughput-dev")
    parser.add_argument("--split", choices=("tune", "report", "all"), default="report")
    args = parser.parse_args()
    if not (args.data / "sia").is_dir() and not (args.data / "rubick").is_dir():
        parser.error(
            f"--data {args.data}: no sia/ or rubick/ in it; give a folder laid out like throughput-dev"
        )
    if (args.data / "sia").is_dir():
        data = load(args.data)
        jobs = {"tune": TUNE, "report": REPORT, "all": WORKLOADS}[args.split]
        print(f"split: {args.split} ({', '.join(jobs)})")
        print("| case | n | median | p90 |")
        print("|---|---|---|---|")
        cases = {**across_cases(data, jobs), **count_cases(data, jobs), **regret_cases(data, jobs)}
        for case, values in cases.items():
            if case.endswith(("interval", "met", "made")):
                print(f"| {case} | {len(values)} | {statistics.mean(values):.0%} held | |")
            else:
                print(f"| {case} | {len(values)} | {statistics.median(values):.3f} | {_q(values, 0.9):.3f} |")
    if (args.data / "rubick").is_dir():
        print("\nRubick's A800 plans: |predicted/measured - 1| of the iteration (paper: 1.9-7.4 % mean)")
        print("| model, fitted on | n | mean | median | p90 |")
        print("|---|---|---|---|---|")
        for case, values in rubick_cases(args.data).items():
            mean, median = statistics.mean(values), statistics.median(values)
            print(f"| {case} | {len(values)} | {mean:.1%} | {median:.1%} | {_q(values, 0.9):.1%} |")


if __name__ == "__main__":
    main()
