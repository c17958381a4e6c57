"""capture-check.json and its words: per slot, the layer it holds in both engines' conventions; the
final slot; the draft as the engine will feed it; or how the dumps differ from this target."""
from __future__ import annotations

from typing import Any

from ..eagle import convention
from .matching import SlotMatch

MATCHED, PARTIAL, NOT_THIS_TARGET = "MATCHED", "PARTIAL", "NOT_THIS_TARGET"


def boundary_words(b: int, num_layers: int) -> str:
    if b == 0:
        return "the embedding output"
    last = " (the last layer, before the final norm)" if b == num_layers else ""
    return f"the output of layer {b - 1}{last}"


def slot_entry(m: SlotMatch, num_layers: int, declared: int | None) -> dict[str, Any]:
    entry = m.to_dict()
    if m.matched:
        entry.update(layer=boundary_words(m.boundary, num_layers), vllm_id=m.boundary,
                     sglang_id=m.boundary - 1)
    else:
        entry.update(layer=None, vllm_id=None, sglang_id=None)
    entry["declared_boundary"] = declared
    entry["agrees_with_data_config"] = None if declared is None or not m.matched else declared == m.boundary
    return entry


def status_of(matches: list[SlotMatch]) -> str:
    hits = sum(m.matched for m in matches)
    return MATCHED if hits == len(matches) else NOT_THIS_TARGET if hits == 0 else PARTIAL


def slot_line(entry: dict[str, Any]) -> str:
    runner = (f"; runner-up boundary {entry['runner_up']} at {entry['runner_up_error']:.3g}"
              if entry["runner_up"] is not None else "")
    if entry["matched"]:
        text = (f"slot {entry['slot']}: {entry['layer']} (vLLM id {entry['vllm_id']}, SGLang id "
                f"{entry['sglang_id']}), relative error {entry['relative_error']:.2g}{runner}")
        if entry["agrees_with_data_config"] is False:
            text += (f"; data_config.json says boundary {entry['declared_boundary']} "
                     f"(vLLM id), which is wrong")
        return text
    return (f"slot {entry['slot']}: matches no boundary (nearest {entry['boundary']} at relative error "
            f"{entry['relative_error']:.3g}, above its threshold {entry['threshold']:.3g}){runner}")


def final_words(final: int | None, slots: int, num_layers: int) -> str:
    if final is None:
        return (f"No slot holds the final state (boundary {num_layers}, the last layer's output before the final "
                "norm), which the verifier targets in training come from: check how the dumps were made.")
    text = f"Slot {final} holds the final state (boundary {num_layers}): training's verifier targets come from it."
    if final != slots - 1:
        text += (f" speculators' loader takes the *last* slot ({slots - 1}) as the target source: a trainer "
                 "that reads these dumps that way learns from the wrong state.")
    return text


def draft_words(d: dict[str, Any], num_layers: int) -> tuple[str, str]:
    """(diagnosis, advice) for the draft's side."""
    engine = convention.ENGINE_NAME[d["engine"]]
    fed = d["fed_boundaries"]
    fed_txt = "[" + ", ".join(boundary_words(b, num_layers) for b in fed) + "]" if fed else "nothing known"
    trained = d["trained_boundaries"]
    if d["status"] == "UNKNOWN":
        return f"What training fed cannot be said: {d['why']}.", "Run `invoke test-drafter` on the draft."
    trained_txt = "[" + ", ".join(boundary_words(int(b), num_layers) for b in trained) + "]"
    how = (f"its config's {d['field']} = {d['ids']}" if not d["fallback"]
           else "its config has no ids, so the default")
    if d["status"] == "MATCH":
        return (f"Measured from the engine: {engine} feeds this draft {fed_txt} ({how}), the states training fed "
                f"(dump slots {d['trained_slots']}).", "Nothing to fix.")
    fix = d["fix"]
    advice = (f"Put \"{fix['field']}\": {fix['ids']} in the draft's config.json ({engine}'s convention; SGLang ids "
              f"{fix['sglang_ids']}, vLLM ids {fix['vllm_ids']}).")
    if fix["needs_capture_patch"]:
        advice += (" SGLang also needs the embedding-capture patch (`invoke patch-sglang.apply`) to capture the "
                   "embedding output.")
    return (f"Measured from the engine: {engine} will feed this draft {fed_txt} ({how}), but training fed "
            f"{trained_txt} (dump slots {d['trained_slots']}).", advice)


def needs_words(entries: list[dict[str, Any]], final: int | None, num_layers: int, aux: int = 3) -> str:
    """Without a draft: what a draft trained on these dumps must configure."""
    aux_slots = [e for e in entries if e["slot"] != final][:aux]
    if len(aux_slots) < aux or not all(e["matched"] for e in aux_slots):
        return "These dumps do not hold three matched aux slots, so no draft config can be derived from them."
    bounds = [e["boundary"] for e in aux_slots]
    sglang = convention.from_boundaries(convention.SGLANG, bounds)
    text = (f"A draft trained on these dumps (speculators' loader feeds slots {[e['slot'] for e in aux_slots]}) "
            f"must configure vLLM ids {bounds} (a speculators config's eagle_aux_hidden_state_layer_ids) or "
            f"SGLang ids {sglang} (a flat config's eagle_config)")
    return text + (", and SGLang needs the embedding-capture patch for -1." if 0 in bounds else ".")


def not_target_words(differences: list[dict[str, Any]], status: str) -> str:
    if not differences:
        return ""
    head = ("The dumps were not made by this target as served: no slot matches any boundary." if status ==
            NOT_THIS_TARGET else "Some slots match no boundary of this target as served.")
    kinds = sorted({d["kind"] for d in differences})
    parts = [f"slot {d['slot']}: {d['text']}" for d in differences]
    return f"{head} Kind of difference: {', '.join(kinds)}. " + "; ".join(parts) + "."
