"""The capture check against SGLang: only the final slot can be placed (see sglang_engine.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..eagle import convention, formats
from . import draft
from .matching import MATCH_CEILING, PostNormTally

FINAL_ONLY = "FINAL_ONLY"
AUX_UNMEASURED = ("SGLang returns only the final layer's states after the final norm, so the aux slots cannot be "
                  "measured with it: run `invoke capture-check` with a vLLM serve profile on the same target, "
                  "or `invoke test-drafter`; an embedding slot needs the capture patch (`invoke patch-sglang.apply`).")


def slot_entries(tally: PostNormTally, num_layers: int) -> tuple[list[dict[str, Any]], int | None]:
    errors = tally.errors()
    order = sorted(range(len(errors)), key=lambda s: errors[s])
    best = order[0]
    runner = errors[order[1]] if len(order) > 1 else None
    final = best if errors[best] < MATCH_CEILING and (runner is None or runner > 2 * errors[best]) else None
    entries = []
    for s, err in enumerate(errors):
        hit = s == final
        entries.append({"slot": s, "boundary": num_layers, "relative_error": err,
                        "runner_up": None, "runner_up_error": runner if hit else None,
                        "threshold": MATCH_CEILING, "matched": hit, "cosine": None, "norm_ratio": None,
                        "layer": f"the output of layer {num_layers - 1} (the last layer, before the final norm)"
                        if hit else None, "vllm_id": num_layers if hit else None,
                        "sglang_id": num_layers - 1 if hit else None, "declared_boundary": None,
                        "agrees_with_data_config": None,
                        "measured_as": "the final state after the norm, RMS-normalized and fitted per channel"})
    return entries, final


def lines(entries: list[dict[str, Any]], final: int | None, num_layers: int) -> list[str]:
    if final is None:
        best = min(entries, key=lambda e: e["relative_error"])
        return [f"No slot equals the final state SGLang computes (after the final norm): the nearest, slot "
                f"{best['slot']}, is off by {best['relative_error']:.3g} even after a per-channel fit, so these "
                "dumps were not made by this target as served.", AUX_UNMEASURED]
    e = entries[final]
    return [f"slot {final}: {e['layer']} (vLLM id {num_layers}, SGLang id {num_layers - 1}), relative error "
            f"{e['relative_error']:.2g} against SGLang's post-norm state; next-best slot at "
            f"{e['runner_up_error'] if e['runner_up_error'] is not None else float('nan'):.3g}",
            f"Slot {final} holds the final state (boundary {num_layers}): training's verifier targets come from it.",
            AUX_UNMEASURED]


def draft_side(path: Path, num_layers: int) -> tuple[dict[str, Any], list[str]]:
    """What SGLang will feed the draft as configured (read by its rules); what training fed is not measurable."""
    config = draft.read_config(path)
    fmt = formats.detect(config) or formats.FLAT
    reading = convention.read(convention.SGLANG, config, fmt, num_layers)
    feed = {"path": str(path), "format": fmt, "engine": convention.SGLANG, "field": reading.field,
            "ids": reading.ids, "fallback": reading.fallback, "fed_boundaries": reading.boundaries,
            "trained_slots": [], "trained_boundaries": [], "status": "UNKNOWN", "fix": None,
            "why": "SGLang cannot return the aux states, so what training fed cannot be matched here",
            "explain": convention.explain(reading, num_layers)}
    said = [convention.explain(reading, num_layers)]
    if reading.needs_embedding:
        said.append("Those boundaries include the embedding output (0): unpatched SGLang cannot capture it; apply "
                    "the capture patch (`invoke patch-sglang.apply`).")
    return feed, said
