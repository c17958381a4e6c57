"""The doctor's one chart: baseline, as served and fixed side by side, throughput (median, the range
of the repeats) and accept length measured beside predicted, each bar with its number.

Drawn from the doctor's state alone (the figures its steps recorded), on a bare ``Figure`` with the
Agg canvas, as bench/chart.py draws a comparison's.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from remote.fileio import atomic_write_with

COLOURS = {"baseline": "#7f7f7f", "as-served": "#d62728", "fixed": "#2ca02c", "predicted": "#ff7f0e"}
LABELS = {"baseline": "baseline\n(no draft)", "as-served": "as served\n(before the fix)", "fixed": "fixed"}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _label_bars(ax: Any, bars: Any, values: list[float | None], fmt: str, tops: list[float] | None = None) -> None:
    """The value over each bar (over its error bar's top when given, so the two never overlap)."""
    for i, (bar, value) in enumerate(zip(bars, values, strict=True)):
        text = "—" if value is None else format(value, fmt)
        top = tops[i] if tops is not None else bar.get_height()
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, top), xytext=(0, 3),
                    textcoords="offset points", ha="center", va="bottom", fontsize=9)


def draw(runs: dict[str, dict[str, Any]], predicted: dict[str, float | None], path: Path) -> Path:
    """``runs``: role → the step's bench outcome (``throughput`` with median/min/max, ``accept_length``);
    ``predicted``: role → test-drafter's accept length for that config. Writes ``path`` (PNG)."""
    roles = [r for r in ("baseline", "as-served", "fixed") if r in runs]
    fig = Figure(figsize=(10, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    tput, accept = fig.subplots(1, 2)
    medians = [_num((runs[r].get("throughput") or {}).get("median")) for r in roles]
    lows, highs = [], []
    for role, median in zip(roles, medians, strict=True):
        t = runs[role].get("throughput") or {}
        low, high, m = _num(t.get("min")), _num(t.get("max")), median or 0.0
        lows.append(max(0.0, m - low) if low is not None else 0.0)
        highs.append(max(0.0, high - m) if high is not None else 0.0)
    xs = list(range(len(roles)))
    bars = tput.bar(xs, [m or 0.0 for m in medians], yerr=[lows, highs], capsize=6,
                    color=[COLOURS[r] for r in roles])
    _label_bars(tput, bars, medians, ".1f", [(m or 0.0) + h for m, h in zip(medians, highs, strict=True)])
    tput.set_xticks(xs, [LABELS[r] for r in roles])
    tput.set_ylabel("output tok/s (median; bars: range of repeats)")
    tput.set_title("throughput")
    tput.set_ylim(0, max([1.0, *[(m or 0) + h for m, h in zip(medians, highs, strict=True)]]) * 1.25)
    width = 0.38
    drafted = [r for r in roles if r != "baseline"]      # a baseline has no accept length
    ax_ = list(range(len(drafted)))
    measured = [_num(runs[r].get("accept_length")) for r in drafted]
    preds = [_num(predicted.get(r)) for r in drafted]
    left = accept.bar([x - width / 2 for x in ax_], [m or 0.0 for m in measured], width,
                      color=[COLOURS[r] for r in drafted])
    right = accept.bar([x + width / 2 for x in ax_], [p or 0.0 for p in preds], width, color=COLOURS["predicted"])
    _label_bars(accept, left, measured, ".2f")
    _label_bars(accept, right, preds, ".2f")
    accept.set_xticks(ax_, [LABELS[r] for r in drafted])
    from matplotlib.patches import Patch
    accept.legend(handles=[Patch(color="#555555", label="measured (the run's colour)"),
                           Patch(color=COLOURS["predicted"], label="predicted (test-drafter)")],
                  loc="upper left", fontsize=8)
    accept.set_ylim(0, max([1.0, *[v for v in measured + preds if v]]) * 1.35)
    accept.set_ylabel("accept length (tokens per verify step)")
    accept.set_title("accept length: measured vs predicted")
    accept.axhline(1.0, color="black", linewidth=0.6, linestyle=":")
    fig.subplots_adjust(left=0.07, right=0.985, bottom=0.17, top=0.9, wspace=0.25)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, partial(fig.savefig, format="png"))
    return path
