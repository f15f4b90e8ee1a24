"""The what-if figure: the strategy breakdown (the seeds' Fig. 6.5) and, for one start, where each
strategy ran over the price history.

Drawn as the reports draw (``spotopt.reports.plots``, which this layer may not import): a
``Figure`` on its own Agg canvas, not pyplot, so a plot never switches the process's backend (a
notebook's, a server's) nor leaves a figure in pyplot's registry."""

from __future__ import annotations

import textwrap
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
    job showing the prices of the markets used and which strategy sat on which market when.

    Each strategy keeps one colour in every panel (twenty distinct ones: the default cycle of ten
    gave ``spotopt`` on-demand's blue), the title wraps to the figure, and the timelines span the
    hours some strategy ran, not the whole history."""
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    one_start = len({r.start_tick for r in runs}) == 1
    n_panels = 1 + (sim.n_jobs if one_start else 0)
    fig = Figure(figsize=(11, 3.2 * n_panels))
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_panels, 1, squeeze=False)
    ax = axes[0][0]
    palette = matplotlib.colormaps["tab20"]
    colour = {strategy: palette(k % palette.N) for k, strategy in enumerate(strategies)}
    width = 0.8 / max(len(strategies), 1)
    x = np.arange(sim.n_jobs)
    for k, strategy in enumerate(strategies):
        ratio = [
            next((r["ratio_vs_spot"] for r in rows if r["job"] == job and r["strategy"] == strategy), None)
            for job in sim.names
        ]
        bars = [np.nan if v is None else v for v in ratio]
        ax.bar(x + k * width, bars, width, label=strategy, color=colour[strategy])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(x + width * (len(strategies) - 1) / 2, sim.names)
    ax.set_ylabel("cost / spot baseline")
    ax.set_title(textwrap.fill(title, 110), fontsize="medium")
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
            first_h, last_h = min(r.start_tick for r in runs) * tl.tick_h, 0.0
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
                    (run.start_tick + ticks) * tl.tick_h,
                    per_gpu,
                    ".",
                    markersize=3,
                    color=colour.get(run.strategy),
                    label=run.strategy,
                )
                last_h = max(last_h, (run.start_tick + int(ticks[-1]) + 1) * tl.tick_h)
            if last_h > first_h:
                panel.set_xlim(first_h, first_h + (last_h - first_h) * 1.05)
            panel.set_ylabel("USD per GPU-hour")
            panel.set_title(f"{job}: markets used (lines) and where each strategy ran (dots)")
            panel.legend(fontsize="x-small", ncol=3)
        axes[-1][0].set_xlabel(f"hours since {tl.start:%Y-%m-%d %H:%M} UTC")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
