"""Tune's one chart: predicted throughput against K (num_speculative_tokens) per concurrency, the
measured points on it (filled: the cost was fitted on them; open: further points it is checked on),
each concurrency's baseline (no draft) as a dashed line. One panel per concurrency, since their
throughputs differ several-fold. Drawn on a bare ``Figure`` with the Agg canvas (bench/chart.py)."""
from __future__ import annotations

from functools import partial
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from draftops.documents.tune import Point
from remote.fileio import atomic_write_with

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _best_tree_per_k(points: list[Point]) -> dict[int, float]:
    """SGLang: the fastest predicted tree (topk > 1, any draft tokens) at each step count."""
    out: dict[int, float] = {}
    for p in sorted(points, key=lambda p: p.k):
        out[p.k] = max(out.get(p.k, 0.0), p.predicted_tok_s or 0.0)
    return out


def draw(points: list[Point], chosen: dict[int, int], path: Path, labels: dict[int, str] | None = None) -> Path:
    """``points``: tune.json's; ``chosen``: concurrency → the K (SGLang: steps) chosen there (0: no draft);
    ``labels``: the chosen setting in words where K alone does not name it (SGLang's steps/topk/draft
    tokens). Writes ``path``."""
    cs = sorted({p.concurrency for p in points})
    fig = Figure(figsize=(4.2 * max(1, len(cs)), 3.8), dpi=100)
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, max(1, len(cs)), squeeze=False)[0]
    for ax, c, colour in zip(axes, cs, COLOURS * 4, strict=False):
        here = sorted((p for p in points if p.concurrency == c), key=lambda p: p.k)
        spec = [p for p in here if p.k > 0]
        chain = [p for p in spec if p.topk == 1]
        ax.plot([p.k for p in chain], [p.predicted_tok_s or 0 for p in chain], "-", color=colour,
                label="predicted" if len(chain) == len(spec) else "predicted (chain, topk 1)")
        tree = _best_tree_per_k([p for p in spec if p.topk > 1])
        if tree:
            ax.plot(list(tree), list(tree.values()), "-.", color=colour, linewidth=1,
                    label="predicted (best tree, topk > 1)")
        base = next((p for p in here if p.k == 0), None)
        if base is not None:
            ax.axhline(base.measured_tok_s or base.predicted_tok_s or 0, color="#555555", linestyle="--",
                       linewidth=1, label="baseline (measured)")
        for role, marker, face in (("fit", "o", colour), ("check", "o", "white")):
            got = [p for p in spec if p.role == role and p.measured_tok_s is not None]
            if got:
                ax.plot([p.k for p in got], [p.measured_tok_s for p in got], marker, color=colour,
                        markerfacecolor=face, markersize=8, linestyle="none",
                        label="measured (fitted on)" if role == "fit" else "measured (check)")
        k = chosen.get(c)
        if k:
            ax.axvline(k, color=colour, linestyle=":", linewidth=1)
            right = k >= max(p.k for p in here)
            name = (labels or {}).get(c) or f"K={k}"
            ax.annotate(f"chosen {name}", (k, 0), xytext=(-3 if right else 3, 5), textcoords="offset points",
                        fontsize=8, ha="right" if right else "left")
        elif k == 0:
            ax.annotate("chosen: no draft", (0.02, 0.02), xycoords="axes fraction", fontsize=8)
        ax.set_title(f"concurrency {c}")
        ax.set_xlabel("K (num_speculative_tokens)" if len(chain) == len(spec) else "steps (--speculative-num-steps)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="best")
    axes[0].set_ylabel("output tok/s")
    fig.subplots_adjust(left=0.07, right=0.985, bottom=0.14, top=0.9, wspace=0.25)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, partial(fig.savefig, format="png"))
    return path
