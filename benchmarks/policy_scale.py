"""Scale of the exact cost policies: build and solve seconds, and the gap to the full LP.

Synthetic but shaped like the real thing: markets are (GPU model, instance size, spot or
on-demand) with random prices and preemption rates, spot markets hold a few to a few dozen
instances, on-demand is unlimited; each job has its own speed per GPU model, checkpoint and
restart costs and a deadline 1.5-4x its fastest time. Every (job, market) pair is an option
(single-GPU jobs packed per slot); they are generated a block of jobs at a time
(``GeneratedOptions``), so 10k × 5k = 50 M options never exist as one array, and
``min-cost-slo`` (its cvxpy formulation) solves over all of them by column generation.

Columns: ``build s`` (per-job deadlines need one pass over all options), ``solve s`` (wall
clock) and ``cpu s`` (the process' CPU seconds in the solve: on a shared machine the fairer
figure), master ``columns`` and pricing ``rounds``, ``cost $``; ``full LP $`` is the same LP with every option
explicit, solved directly by scipy's HiGHS (where it fits), and ``gap %`` the difference;
``bound %`` is column generation's own proof: the optimum over all options is at most this far
below the returned cost (Lagrangian bound from the last pricing round), at every size.

    python benchmarks/policy_scale.py                 # the full grid (about a minute)
    python benchmarks/policy_scale.py --quick         # 100 and 1k jobs only
    python benchmarks/policy_scale.py --full-lp-max 5000000   # also check 1k x 5k, 10k x 500
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

from spotopt.policies.base import PolicyInput, fastest_hours, get_policy
from spotopt.policies.options import Columns, GeneratedOptions

N_GPU_MODELS = 12
SIZES = np.array([1, 4, 8])
FULL_LP_MAX_OPTIONS = 600_000
Array = np.ndarray[Any, Any]


def markets(rng: np.random.Generator, n: int) -> dict[str, Array]:
    gpu = rng.integers(0, N_GPU_MODELS, n)
    size = SIZES[rng.integers(0, len(SIZES), n)]
    spot = rng.random(n) < 0.7
    base = (0.4 + 0.35 * gpu) * size * rng.uniform(0.9, 1.2, n)
    price = np.where(spot, base * rng.uniform(0.25, 0.7, n), base)
    rate = np.where(spot, rng.uniform(0.002, 0.08, n), 0.0)
    capacity = np.where(spot, rng.integers(2, 40, n).astype(float), np.inf)
    return {"gpu": gpu, "size": size, "price": price, "rate": rate, "capacity": capacity}


def instance(rng: np.random.Generator, n_jobs: int, mk: dict[str, Array]) -> PolicyInput:
    """Every (job, market) option as a generator: Young/Daly preemption loss per pair."""
    speed = rng.uniform(0.5, 1.5, (n_jobs, 1)) * (1 + 0.3 * np.arange(N_GPU_MODELS)) ** rng.uniform(
        0.5, 1.5, (n_jobs, 1)
    )
    ckpt = rng.uniform(10, 300, n_jobs)
    restart = rng.uniform(120, 900, n_jobs)
    work = rng.uniform(1e5, 1e6, n_jobs)
    rate_s = mk["rate"][None, :] / 3600
    usd = (mk["price"] / mk["size"])[None, :]
    share = (1.0 / mk["size"])[None, :]

    def block(lo: int, hi: int) -> tuple[Array, Array, Array]:
        tau = np.sqrt(2 * ckpt[lo:hi, None] / np.maximum(rate_s, 1e-12))
        loss = np.where(rate_s > 0, ckpt[lo:hi, None] / tau + rate_s * (tau / 2 + restart[lo:hi, None]), 0.0)
        tput = speed[lo:hi][:, mk["gpu"]] * 3600 * np.clip(1 - loss, 0, None)
        return tput.astype(np.float32), usd, share

    gen = GeneratedOptions(n_jobs, len(mk["price"]), block, cache=True)  # 4 bytes per option
    plain = PolicyInput.from_generator(gen, work, capacity=mk["capacity"] * (n_jobs / 100.0) ** 0.5)
    fastest = fastest_hours(plain)
    return PolicyInput.from_generator(
        gen,
        work,
        capacity=plain.capacity,
        deadline_hours=fastest * rng.uniform(1.5, 4.0, n_jobs),
        horizon_hours=float(fastest.max() * 6),
    )


def full_lp_cost(inp: PolicyInput) -> float:
    """min-cost-slo with every option explicit, solved directly (no column generation) by scipy's HiGHS."""
    assert inp.generated is not None
    cols = Columns.concat(
        [blk.take(np.nonzero(~np.isnan(blk.steps_per_hour))) for blk in inp.generated.blocks()]
    )
    n, e = inp.n_jobs, np.arange(len(cols))
    finite = np.isfinite(inp.capacity)
    remap = np.cumsum(finite) - 1
    on_cap = finite[cols.market]
    a = sp.vstack(
        [
            sp.csr_matrix(
                (-cols.steps_per_hour / inp.work_steps[cols.job], (cols.job, e)), shape=(n, len(e))
            ),
            sp.csr_matrix((np.ones(len(e)), (cols.job, e)), shape=(n, len(e))),
            sp.csr_matrix(
                (cols.instances_per_hour[on_cap], (remap[cols.market[on_cap]], e[on_cap])),
                shape=(int(finite.sum()), len(e)),
            ),
        ]
    )
    b = np.r_[-np.ones(n), inp.wall_limit(), inp.capacity[finite] * inp.horizon_hours]
    res = linprog(cols.usd_per_hour, A_ub=a.tocsc(), b_ub=b, method="highs")
    if res.status != 0:
        raise RuntimeError(f"full LP: {res.message}")
    return float(res.fun)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--full-lp-max",
        type=int,
        default=FULL_LP_MAX_OPTIONS,
        help="solve the full LP directly up to this many options (5000000: minutes, GBs)",
    )
    args = parser.parse_args()
    grid = [(100, 500), (100, 5000), (1000, 500), (1000, 5000)]
    if not args.quick:
        grid += [(10000, 500), (10000, 5000)]
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} cores; cvxpy is imported in the first solve")
    print(
        f"{'jobs':>6} {'markets':>7} {'options':>11} {'build s':>8} {'solve s':>8} {'cpu s':>6} "
        f"{'columns':>8} {'rounds':>6} {'cost $':>12} {'full LP $':>12} {'gap %':>8} {'bound %':>8}"
    )
    for n_jobs, n_markets in grid:
        rng = np.random.default_rng(n_jobs * 7 + n_markets)
        mk = markets(rng, n_markets)
        t = time.perf_counter()
        inp = instance(rng, n_jobs, mk)
        built = time.perf_counter() - t
        t, cpu = time.perf_counter(), time.process_time()
        alloc = get_policy("min-cost-slo")(inp)
        solved, cpu = time.perf_counter() - t, time.process_time() - cpu
        cost = alloc.objective
        assert alloc.columns is not None and alloc.bound is not None
        pairs = n_jobs * n_markets
        full = full_lp_cost(inp) if pairs <= args.full_lp_max else None
        gap = "" if full is None else f"{100 * (cost - full) / full:8.4f}"
        print(
            f"{n_jobs:>6} {n_markets:>7} {pairs:>11,} {built:>8.2f} {solved:>8.2f} {cpu:>6.2f} "
            f"{alloc.columns.n_options:>8,} "
            f"{alloc.rounds:>6} {cost:>12,.2f} {'' if full is None else f'{full:12,.2f}':>12} {gap:>8} "
            f"{100 * (cost - alloc.bound) / cost:8.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
