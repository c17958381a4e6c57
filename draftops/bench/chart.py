"""The PNG bar chart of a comparison: output tok/s (with the repeats' range) and accept length,
measured beside predicted, for the two runs.

It draws on a bare ``Figure`` with the Agg canvas: no pyplot state and no display, so it works the
same on a laptop, over SSH and in CI.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from draftops.bench.compare import Comparison
from remote.fileio import atomic_write_with

COLOURS = {"baseline": "#7f7f7f", "speculative": "#1f77b4", "predicted": "#ff7f0e"}


def _label(cmp: Comparison, which: str) -> str:
    """``A: speculative`` over the run id, broken after its date and time so two labels never overlap.
    A ``$`` is escaped: matplotlib reads ``$...$`` as math, and bad math fails the whole chart."""
    res = cmp.a if which == "a" else cmp.b
    parts = res.run_id.split("-", 2)
    run = "-".join(parts[:2]) + "\n" + parts[2] if len(parts) == 3 else res.run_id
    return f"{which.upper()}: {res.mode}\n{run[:60]}".replace("$", "\\$")


def title(cmp: Comparison) -> str:
    """The throughput panel's title: the ratio with its interval and decision (draftops.comparison)."""
    speed = cmp.speed
    if cmp.speedup is None or speed is None:
        return "output throughput"
    return f"{speed.interval_text()}: {speed.decision}"


def draw(cmp: Comparison, path: Path) -> Path:
    """Write the chart to ``path`` (PNG) and return it."""
    fig = Figure(figsize=(9, 4), dpi=100)
    FigureCanvasAgg(fig)
    tput, accept = fig.subplots(1, 2)
    labels = [_label(cmp, "a"), _label(cmp, "b")]
    runs = [cmp.a, cmp.b]
    medians = [r.metrics.output_throughput.median or 0.0 for r in runs]
    # never below 0: a result edited by hand can hold a median outside its own range, and matplotlib
    # refuses a negative error bar (and with it the whole chart)
    lows = [max(0.0, m - (r.metrics.output_throughput.min if r.metrics.output_throughput.min is not None else m))
            for m, r in zip(medians, runs, strict=True)]
    highs = [max(0.0, (r.metrics.output_throughput.max if r.metrics.output_throughput.max is not None else m) - m)
             for m, r in zip(medians, runs, strict=True)]
    tput.bar(labels, medians, yerr=[lows, highs], capsize=6, color=[COLOURS[r.mode] for r in runs])
    tput.set_ylabel("output tok/s (median, range of repeats)")
    tput.set_title(title(cmp))
    width = 0.38
    xs = [0.0, 1.0]
    measured = [r.accept_length.value if r.accept_length and r.accept_length.value is not None else 0.0
                for r in runs]
    preds = [cmp.predictions.get(r.run_id) for r in runs]
    predicted = [p.value if p else 0.0 for p in preds]
    accept.bar([x - width / 2 for x in xs], measured, width, label="measured", color=COLOURS["speculative"])
    accept.bar([x + width / 2 for x in xs], predicted, width, label="predicted (test-drafter)",
               color=COLOURS["predicted"])
    top = max([1.0, *measured, *predicted])
    for x, pred in zip(xs, preds, strict=True):
        if pred and pred.role == "served" and pred.best is not None and pred.best > pred.value:
            top = max(top, pred.best)
            accept.hlines(pred.best, x - width, x + width, colors=COLOURS["predicted"], linestyles="dashed",
                          label="predicted with test-drafter's fix")
    accept.set_ylim(0, top * 1.35)                 # room for the legend above the bars
    accept.set_xticks(xs, labels)
    accept.set_ylabel("accept length (tokens per verify step)")
    accept.set_title("accept length")
    accept.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
    accept.legend(loc="upper left", fontsize=8)
    # fixed margins that fit these labels: tight_layout measured every text first (~30 ms of a compare)
    fig.subplots_adjust(left=0.08, right=0.985, bottom=0.2, top=0.9, wspace=0.28)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, partial(fig.savefig, format="png"))    # a full disk leaves no half chart
    return path
