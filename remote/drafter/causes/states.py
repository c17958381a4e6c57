"""Causes seen in the dumped states (failure-modes.md #7 and the embedding scale): ``embedding-scale``
(the embedding slot, or the draft's own embedding, is the target's scaled) and ``target-differs``
(the states are not the served target's: a capture check's differences, or slots unlike the target
recomputed here). Measured by slotstats.py in the layout scan; the capture check by measured.py."""
from __future__ import annotations

from typing import Any

from ..measures import CAPTURE_CHECK
from ..scoring.slotstats import STATS
from .facts import Facts
from .finding import Finding

CAPTURE = CAPTURE_CHECK.key  # Results.extra key: measured.py's summary of an unusable capture-check report
#: a fit of ``dump = c * target`` that leaves less than this is a scale, not another computation
SCALE_FIT = 0.05
REGENERATE = ("regenerate the dumps with the target model as it is served (the same weights, dtype and "
              "quantization as the engine's; `invoke capture-check` compares them) and retrain the draft on them")


def check(facts: Facts) -> list[Finding]:
    stats = facts.extra.get(STATS)
    out = []
    if stats is not None:
        out += _embedding(stats)
    differs = _target(stats, facts.extra.get(CAPTURE))
    if differs is not None:
        out.append(differs)
    return out


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _embedding(stats: dict[str, Any]) -> list[Finding]:
    """Dump slots holding the embedding, and the draft's own embedding, at another scale than the target's."""
    scaled = [s for s in stats["slots"] if s["reference"] == "embedding" and s["differs"]
              and s["scale_residual"] < SCALE_FIT]
    mine = stats.get("draft_embedding")
    mine_off = mine is not None and mine["differs"] and mine["scale_residual"] < SCALE_FIT
    if not scaled and not mine_off:
        return []
    norm = (" (times sqrt(hidden_size) = " + _fmt(stats["embed_scale"]) + ", as this Gemma target computes it)"
            if stats["embed_scale"] != 1 else "")
    parts, evidence = [], {"embed_scale": stats["embed_scale"]}
    for s in scaled:
        parts.append(f"dump slot {s['slot']} (the embedding, SGLang id -1) is {_fmt(s['norm_ratio'])}x the norm of "
                     f"the target's own embedding output{norm} for the same {s['rows']} tokens (fitted factor "
                     f"{_fmt(s['scale_factor'])}, max |d| {_fmt(s['max_abs_diff'])} against values up to "
                     f"{_fmt(s['max_abs_target'])}; the rounding of a dump allows {s['noise']:.0%})")
        evidence[f"slot_{s['slot']}"] = _numbers(s)
    if mine_off:
        assert mine is not None
        parts.append(f"the draft's own embed_tokens rows for those tokens are {_fmt(mine['norm_ratio'])}x the norm of "
                     f"the target's embedding output{norm} (fitted factor {_fmt(mine['scale_factor'])}, max |d| "
                     f"{_fmt(mine['max_abs_diff'])})")
        evidence["draft_embedding"] = _numbers(mine)
    fix = []
    if scaled:
        fix.append("regenerate the dumps so the embedding slot holds the target's own embedding output (with the "
                   "model's normalizer, e.g. Gemma's sqrt(hidden_size)) and retrain the draft on them")
    if mine_off:
        fix.append("ship the target's embed_tokens in the draft (or drop it from the checkpoint so the engine "
                   "shares the target's) and retrain with the embedding the target computes")
    return [Finding(id="embedding-scale", severity="bad",
                    text=("The embedding the draft sees is at another scale than the target's: " + "; ".join(parts)
                          + ". A cosine cannot show this; served, the draft gets inputs of another size than it "
                            "was trained on."),
                    evidence=evidence, fix="; ".join(fix).capitalize() + ".")]


def _numbers(s: dict[str, Any]) -> dict[str, Any]:
    """The figures of one compared slot, to 6 significant digits: sums taken over batches in another order
    (torch-saved dumps are not sorted by length) differ in the last bits, and the evidence must not."""
    keys = ("rows", "norm_ratio", "relative_rms_diff", "max_abs_diff", "max_abs_target", "scale_factor",
            "scale_residual", "noise")
    return {k: float(f"{s[k]:.6g}") if isinstance(s[k], float) else s[k] for k in keys}


def _target(stats: dict[str, Any] | None, capture: dict[str, Any] | None) -> Finding | None:
    """Layer slots unlike the target recomputed here (beyond the noise), or a capture check's differences."""
    unlike = [] if stats is None else [s for s in stats["slots"] if s["differs"] and not (
        s["reference"] == "embedding" and s["scale_residual"] < SCALE_FIT)]
    if not unlike and not capture:
        return None
    parts, evidence = [], {}
    for s in unlike:
        what = ("the target's embedding output" if s["reference"] == "embedding" else
                f"the output of layer {s['layer_id']} of the target recomputed here (fp32)")
        parts.append(f"slot {s['slot']} differs from {what} by {s['relative_rms_diff']:.3g} relative RMS "
                     f"(norm ratio {_fmt(s['norm_ratio'])}, max |d| {_fmt(s['max_abs_diff'])}; noise allows "
                     f"{s['noise']:.2g})")
        evidence[f"slot_{s['slot']}"] = _numbers(s)
    if capture:
        diffs = capture["differences"]
        kinds = sorted({str(d.get("kind")) for d in diffs})
        parts.append(f"the capture check {capture['run']} found {len(diffs)} slot(s) matching no boundary of the "
                     f"target as served ({', '.join(kinds)}): "
                     + "; ".join(f"slot {d.get('slot')}: {d.get('text')}" for d in diffs[:4]))
        evidence["capture_check"] = {"path": capture["path"], "status": capture["status"],
                                     "kinds": kinds, "differences": [
                                         {k: d.get(k) for k in ("slot", "kind", "boundary", "relative_error",
                                                                "norm_ratio", "cosine")} for d in diffs]}
    return Finding(id="target-differs", severity="bad",
                   text="The dumps' states are not the served target's: " + "; ".join(parts) + ".",
                   evidence=evidence, fix=REGENERATE[0].upper() + REGENERATE[1:] + ".")
