"""Scale of the exact cost policies: build and solve seconds, and the gap pruning costs.

Synthetic but shaped like the real thing: markets are (GPU model, instance size, spot or
on-demand) with random prices and preemption rates, spot markets hold a few to a few dozen
instances, on-demand is unlimited; each job has its own speed per GPU model, checkpoint and
restart costs and a deadline 1.5-4x its fastest time. Options are built in job chunks (dense
chunk × markets, then pruned) so 10k × 5k never needs a 50M-entry matrix.

    python benchmarks/policy_scale.py                 # the full grid (about a minute)
    python benchmarks/policy_scale.py --quick         # 100 and 1k jobs only
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from spotopt.policies.base import PolicyInput

from spotopt.plan import prune_dominated

N_GPU_MODELS = 12
SIZES = np.array([1, 4, 8])


def markets(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    gpu = rng.integers(0, N_GPU_MODELS, n)
    size = SIZES[rng.integers(0, len(SIZES), n)]
    spot = rng.random(n) < 0.7
    base = (0.4 + 0.35 * gpu) * size * rng.uniform(0.9, 1.2, n)
    price = np.where(spot, base * rng.uniform(0.25, 0.7, n), base)
    rate = np.where(spot, rng.uniform(0.002, 0.08, n), 0.0)
    capacity = np.where(spot, rng.integers(2, 40, n).astype(float), np.inf)
    return {"gpu": gpu, "size": size, "price": price, "rate": rate, "capacity": capacity}


def build(
    rng: np.random.Generator,
    n_jobs: int,
    mk: dict[str, np.ndarray],
    max_per_job: int | None,
    chunk: int = 500,
    prune: bool = True,
) -> tuple[PolicyInput, int]:
    """Options for all jobs, pruned chunk by chunk (``prune=False``: all of them); (input, pairs)."""
    speed = rng.uniform(0.5, 1.5, (n_jobs, 1)) * (1 + 0.3 * np.arange(N_GPU_MODELS)) ** rng.uniform(
        0.5, 1.5, (n_jobs, 1)
    )
    ckpt = rng.uniform(10, 300, n_jobs)
    restart = rng.uniform(120, 900, n_jobs)
    work = rng.uniform(1e5, 1e6, n_jobs)
    n_m = len(mk["price"])
    parts: list[tuple[np.ndarray, ...]] = []
    for lo in range(0, n_jobs, chunk):
        hi = min(n_jobs, lo + chunk)
        rate_s = mk["rate"][None, :] / 3600
        tau = np.sqrt(2 * ckpt[lo:hi, None] / np.maximum(rate_s, 1e-12))
        loss = np.where(rate_s > 0, ckpt[lo:hi, None] / tau + rate_s * (tau / 2 + restart[lo:hi, None]), 0.0)
        # single-GPU jobs packed k per instance at the per-slot price
        tput = speed[lo:hi][:, mk["gpu"]] * 3600 * np.clip(1 - loss, 0, None)
        usd = np.broadcast_to(mk["price"] / mk["size"], tput.shape)
        usable = tput > 0
        if prune and max_per_job is not None:
            usable &= dense_prune(tput, usd, mk["capacity"] * mk["size"] >= n_jobs, max_per_job)
        jobs, mkts = np.nonzero(usable)
        sub = PolicyInput(
            job=jobs,
            market=mkts,
            steps_per_hour=tput[jobs, mkts],
            usd_per_hour=usd[jobs, mkts],
            instances_per_hour=1.0 / mk["size"][mkts],
            work_steps=work[lo:hi],
            deadline_hours=np.full(hi - lo, np.inf),
            capacity=mk["capacity"],
        )
        exact_only = prune and max_per_job is None
        keep = prune_dominated_for(sub, n_jobs, None) if exact_only else np.ones(len(jobs), dtype=bool)
        parts.append(
            (
                jobs[keep] + lo,
                mkts[keep],
                sub.steps_per_hour[keep],
                sub.usd_per_hour[keep],
                sub.instances_per_hour[keep],
            )
        )
    job, market, tput_all, usd_all, share = (np.concatenate(p) for p in zip(*parts, strict=True))
    best = np.zeros(n_jobs)
    np.maximum.at(best, job, tput_all)
    fastest = work / best
    horizon = float(fastest.max() * 6)
    return PolicyInput(
        job=job,
        market=market,
        steps_per_hour=tput_all,
        usd_per_hour=usd_all,
        instances_per_hour=share,
        work_steps=work,
        deadline_hours=fastest * rng.uniform(1.5, 4.0, n_jobs),
        capacity=mk["capacity"] * (n_jobs / 100.0) ** 0.5,
        horizon_hours=horizon,
    ), n_jobs * n_m


def dense_prune(tput: np.ndarray, usd: np.ndarray, roomy: np.ndarray, k: int) -> np.ndarray:
    """``prune_dominated(max_per_job=k)`` on a dense jobs × markets chunk, row-wise in numpy.

    Same rule: drop what a roomy option beats on $/step and speed, then keep the ``k`` cheapest
    per step and the ``k // 4`` fastest of the survivors.
    """
    rows = np.arange(tput.shape[0])[:, None]
    per_step = np.where(tput > 0, usd / np.where(tput > 0, tput, 1), np.inf)
    order = np.argsort(per_step, axis=1)
    speed = tput[rows, order]
    best = np.maximum.accumulate(np.where(roomy[order], speed, 0.0), axis=1)
    before = np.concatenate([np.zeros((len(rows), 1)), best[:, :-1]], axis=1)
    alive_sorted = (speed > before) & np.isfinite(per_step[rows, order])
    alive = np.zeros(tput.shape, dtype=bool)
    alive[rows, order] = alive_sorted
    keep = np.zeros(tput.shape, dtype=bool)
    keep[rows, order] = alive_sorted & (np.cumsum(alive_sorted, axis=1) <= k)
    n_fast = max(1, k // 4)
    fast = np.argpartition(-np.where(alive, tput, -1.0), n_fast, axis=1)[:, :n_fast]
    keep[rows, fast] |= alive[rows, fast]
    return keep


def prune_dominated_for(sub: PolicyInput, n_jobs: int, max_per_job: int | None) -> np.ndarray:
    """``prune_dominated`` on a chunk, with the capacity rule counting all ``n_jobs`` jobs."""
    padded = PolicyInput(
        job=sub.job,
        market=sub.market,
        steps_per_hour=sub.steps_per_hour,
        usd_per_hour=sub.usd_per_hour,
        instances_per_hour=sub.instances_per_hour,
        work_steps=np.ones(n_jobs),
        deadline_hours=np.full(n_jobs, np.inf),
        capacity=sub.capacity,
    )
    return prune_dominated(padded, max_per_job)


def solve_seconds(inp: PolicyInput) -> tuple[float, float]:
    from spotopt.policies.base import get_policy

    t = time.perf_counter()
    alloc = get_policy("min-cost-slo")(inp)
    return time.perf_counter() - t, alloc.total_cost_usd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--max-per-job", type=int, default=96)
    args = parser.parse_args()
    grid = [(100, 500), (1000, 500), (100, 5000), (1000, 5000)]
    if not args.quick:
        grid += [(10000, 500), (10000, 5000)]
    print(
        f"{'jobs':>6} {'markets':>7} {'pairs':>10} {'options':>8} {'build s':>8} {'solve s':>8} "
        f"{'cost $':>12} {'unpruned $':>12} {'gap %':>7}"
    )
    for n_jobs, n_markets in grid:
        rng = np.random.default_rng(n_jobs * 7 + n_markets)
        mk = markets(rng, n_markets)
        state = rng.bit_generator.state
        t = time.perf_counter()
        inp, pairs = build(rng, n_jobs, mk, args.max_per_job)
        built = time.perf_counter() - t
        solved, cost = solve_seconds(inp)
        full_cost = None
        if pairs <= 600_000:  # the unpruned LP, same instance
            rng.bit_generator.state = state
            full, _ = build(rng, n_jobs, mk, None, prune=False)
            _, full_cost = solve_seconds(full)
        gap = "" if full_cost is None else f"{100 * (cost - full_cost) / full_cost:7.3f}"
        print(
            f"{n_jobs:>6} {n_markets:>7} {pairs:>10,} {inp.n_options:>8,} {built:>8.2f} {solved:>8.2f} "
            f"{cost:>12,.0f} {'' if full_cost is None else f'{full_cost:12,.0f}':>12} {gap:>7}",
            flush=True,
        )


if __name__ == "__main__":
    main()
