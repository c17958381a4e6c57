"""PNG trend plots of the nights: tok/s, speedup, accept length (measured and predicted) and step-0
accuracy per host. Drawn on a bare Agg ``Figure`` (no pyplot state, no display), like bench/chart.py."""
from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import date2num
from matplotlib.figure import Figure

from draftops.history import RunRecord, parse_time
from draftops.nightly.detect import value
from remote.fileio import atomic_write_with

# (file stem, title, y label, [(metric, legend label)])
PANELS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("tok_s", "output throughput", "tok/s", (("baseline.tok_s", "baseline"), ("speculative.tok_s", "speculative"))),
    ("speedup", "speedup", "speculative / baseline", (("speedup", "speedup"),)),
    ("accept_length", "accept length", "tokens per verify step",
     (("accept_length.measured", "measured"), ("accept_length.predicted", "predicted (test-drafter)"))),
    ("step0_acc", "step-0 accuracy (served layout)", "accuracy", (("drafter.step0_acc", "step 0"),)),
)


MIN_SPAN = timedelta(days=2)


def x_range(dates: Sequence[datetime]) -> tuple[float, float]:
    """The x-axis limits: the nights' span, widened to at least MIN_SPAN around them. matplotlib's
    own limits for one point (or a few close ones) span years (one night showed 2025-2029)."""
    first, last = min(dates), max(dates)
    pad = max((MIN_SPAN - (last - first)) / 2, (last - first) * 0.05, timedelta(hours=6))
    low, high = date2num([first - pad, last + pad])
    return float(low), float(high)


def panel_figure(title: str, ylabel: str, lines: Sequence[tuple[str, Sequence[tuple[datetime, float | None]]]]
                 ) -> Figure:
    """One trend panel: a line per series, the nights that have a value."""
    fig = Figure(figsize=(7, 3.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for label, points in lines:
        xs = [d for d, v in points if v is not None]
        ys = [v for _, v in points if v is not None]
        if xs:
            ax.plot(date2num(xs), ys, marker="o", label=label)
    ax.xaxis_date()
    ax.set_xlim(*x_range([d for _, points in lines for d, v in points if v is not None]))
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.autofmt_xdate()
    fig.tight_layout()
    return fig


def draw_trends(host: str, nights: Sequence[RunRecord], folder: Path) -> list[Path]:
    """One PNG per panel that has at least one value; returns the files written."""
    written = []
    dates = [parse_time(n.time) for n in nights]
    for stem, title, ylabel, series in PANELS:
        lines = [(label, [(d, value(n.metrics, metric)) for d, n in zip(dates, nights, strict=True)])
                 for metric, label in series]
        if not any(v is not None for _, points in lines for _, v in points):
            continue
        fig = panel_figure(f"{host}: {title}", ylabel, lines)
        path = folder / f"trend-{host}-{stem}.png"
        atomic_write_with(path, partial(fig.savefig, format="png"))    # never half a plot
        written.append(path)
    return written
