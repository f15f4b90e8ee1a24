"""The seeds' cost experiment (thesis §5.7.3) with spotopt's exact policies.

500 jobs, half ResNet-50-like and half A3C-like (throughputs per K80/P100/V100 relative to a K80
from the thesis' Table 6.1: ResNet-50 1 / 3.7 / 9.6, A3C 1 / 1.2 / 2.2), durations drawn from
{0.5, 1, 2, 4, 8} days on a V100, SLOs from {1.2, 2, 10} × duration. Prices: GCP on-demand list
prices of February 2020 for one GPU with its N1 machine (the catalog: K80 $0.64, P100 $1.84,
V100 $2.86 per hour). Capacity per GPU type: ``--gpus`` (default unlimited, as in the cloud).

Prints total cost and SLO violations of ``max-throughput``, ``min-cost`` and ``min-cost-slo``.
The thesis reports min-cost ~1.4× cheaper than max-throughput with ~35 % violations, and
min-cost-slo 1.2× cheaper with none.

    python benchmarks/gavel_cost.py [--jobs 500] [--seed 0] [--gpus N]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from spotopt.plan import solve
from spotopt.policies.base import PolicyInput

PRICE = np.array([0.639999, 1.839998, 2.859998])  # K80, P100, V100 (data/list_prices.csv, 2020-02-01)
SPEED = {"resnet50": np.array([1.0, 3.7, 9.6]), "a3c": np.array([1.0, 1.2, 2.2])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gpus", type=float, default=np.inf, help="GPUs of each type (default unlimited)")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    kinds = np.array(["resnet50", "a3c"])[rng.integers(0, 2, args.jobs)]
    duration_h = rng.choice([0.5, 1, 2, 4, 8], args.jobs) * 24.0
    slo_h = duration_h * rng.choice([1.2, 2.0, 10.0], args.jobs)
    tput = np.array([SPEED[k] for k in kinds]) * 3600.0  # steps per hour, K80 = 1 step/s
    work = duration_h * tput[:, 2]  # duration is measured on a V100
    print(f"{args.jobs} jobs ({(kinds == 'a3c').sum()} A3C), capacity {args.gpus} GPUs per type")
    results = {}
    for policy in ("max-throughput", "min-cost", "min-cost-slo"):
        inp = PolicyInput.from_dense(
            tput,
            np.broadcast_to(PRICE, tput.shape),
            work,
            capacity=np.full(3, args.gpus),
            deadline_hours=slo_h if policy == "min-cost-slo" else None,
            horizon_hours=float(slo_h.max() * 2 + duration_h.max() * 10),
        )
        t = time.perf_counter()
        alloc = solve(policy, inp)
        dt = time.perf_counter() - t
        late = alloc.wall_hours > slo_h * (1 + 1e-6)
        results[policy] = alloc.total_cost_usd
        print(
            f"  {policy:15s} cost ${alloc.total_cost_usd:12,.0f}  SLO violations {late.mean():6.1%} "
            f"(A3C {late[kinds == 'a3c'].mean():.0%}, ResNet-50 {late[kinds == 'resnet50'].mean():.0%})  "
            f"solve {dt:.2f} s"
        )
    base = results["max-throughput"]
    print(
        f"max-throughput / min-cost = {base / results['min-cost']:.2f}x, "
        f"max-throughput / min-cost-slo = {base / results['min-cost-slo']:.2f}x"
    )


if __name__ == "__main__":
    main()
