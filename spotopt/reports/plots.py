"""Shared figure set-up for report plots: Agg (no display needed), fixed size, titled with the data span.

Figures are built with ``matplotlib.figure.Figure`` on an explicit ``FigureCanvasAgg`` instead
of pyplot, so plotting keeps no global state, never switches the process's backend and never
needs a display (servers, CI, cron).

Matplotlib is imported when a figure is made, not with this module: every report module imports
this one, and every ``spotopt`` command imports the reports, so a top-level import cost each
command (and each test that runs one) about a quarter of a second to draw nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotopt.reports.base import ReportResult

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

WIDTH_PX, HEIGHT_PX, DPI = 1200, 700, 100
MAX_SERIES = 12


def colors() -> list[tuple[Any, ...]]:
    """Twenty distinct colours (matplotlib's ``tab20``), for series drawn in pairs."""
    import matplotlib

    return [matplotlib.colormaps["tab20"](i) for i in range(20)]


def figure() -> tuple[Figure, Axes]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def finish(fig: Figure, ax: Axes, result: ReportResult, what: str, path: Path) -> None:
    """Title with the report's subject and data span, grid, legend, then write the PNG."""
    ax.set_title(f"{what}\n{result.describe_span()}", fontsize=11)
    ax.grid(True, alpha=0.3)
    handles, _labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(loc="best", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no data in this window", transform=ax.transAxes, ha="center", va="center")
    fig.savefig(path, format="png", dpi=DPI)
