"""The what-if figure: the strategy breakdown (the seeds' Fig. 6.5) and, for one start, where each
strategy ran over the price history."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spotopt.whatif.jobs import SimJobs
from spotopt.whatif.run import StrategyRun
from spotopt.whatif.timeline import Timeline


def plot_whatif(
    path: Path,
    rows: Sequence[dict[str, Any]],
    strategies: Sequence[str],
    runs: Sequence[StrategyRun],
    tl: Timeline,
    sim: SimJobs,
    title: str,
) -> None:
    """Bars of cost relative to ``spot`` per job and strategy; with one start, a timeline panel per
    job showing the prices of the markets used and which strategy sat on which market when."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    one_start = len({r.start_tick for r in runs}) == 1
    n_panels = 1 + (sim.n_jobs if one_start else 0)
    fig, axes = plt.subplots(n_panels, 1, figsize=(11, 3.2 * n_panels), squeeze=False)
    ax = axes[0][0]
    width = 0.8 / max(len(strategies), 1)
    x = np.arange(sim.n_jobs)
    for k, strategy in enumerate(strategies):
        ratio = [
            next((r["ratio_vs_spot"] for r in rows if r["job"] == job and r["strategy"] == strategy), None)
            for job in sim.names
        ]
        ax.bar(x + k * width, [np.nan if v is None else v for v in ratio], width, label=strategy)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x + width * (len(strategies) - 1) / 2, sim.names)
    ax.set_ylabel("cost / spot baseline")
    ax.set_title(title)
    ax.legend(ncol=4, fontsize="small")
    if one_start:
        hours = np.arange(tl.n_ticks) * tl.tick_h
        for j, job in enumerate(sim.names):
            panel = axes[j + 1][0]
            used: set[int] = set()
            for run in runs:
                trace = run.result.trace[j]
                used.update(int(sim.market[e]) for e in trace[trace >= 0])
            for m in sorted(used):
                q = tl.markets[m].quote
                panel.step(
                    hours,
                    tl.price[m] / q.gpu_count if q.gpu_count else tl.price[m],
                    where="post",
                    linewidth=0.8,
                    alpha=0.6,
                    label=f"{q.cloud}/{q.zone or q.region}/{q.instance_type}/{q.market}",
                )
            for run in runs:
                trace = run.result.trace[j]
                ticks = np.flatnonzero(trace >= 0)
                if not len(ticks):
                    continue
                m = sim.market[trace[ticks]]
                per_gpu = tl.price[m, run.start_tick + ticks] / np.array(
                    [tl.markets[i].quote.gpu_count or 1 for i in m]
                )
                panel.plot(
                    (run.start_tick + ticks) * tl.tick_h, per_gpu, ".", markersize=3, label=run.strategy
                )
            panel.set_ylabel("USD per GPU-hour")
            panel.set_title(f"{job}: markets used (lines) and where each strategy ran (dots)")
            panel.legend(fontsize="x-small", ncol=3)
        axes[-1][0].set_xlabel(f"hours since {tl.start:%Y-%m-%d %H:%M} UTC")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
