"""Layout diagnosis: which dump slots the draft was trained on, and what its config makes a server feed.

Ids are kept in SGLang's explicit-id convention (id = output of decoder layer id, -1 = the
embedding output; SGLang captures loop index id+1).  vLLM's id k is the state after k layers, i.e.
SGLang id k-1.  With null ids both engines fall back to capturing after layers [2, n//2, n-3].
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

STATUS_MATCH, STATUS_MISMATCH, STATUS_UNKNOWN = "MATCH", "MISMATCH", "UNKNOWN"


@dataclass(frozen=True)
class Interpretation:
    """What one engine would capture for the configured ids, and whether the dump has it."""

    convention: str
    configured_ids: list[int] | None
    captured_ids: list[int] | None  # SGLang ids actually captured, ascending
    slots: list[int] | None  # dump slots holding them, or None
    missing: list[int]  # captured ids absent from the dump
    note: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def engine_default(num_layers: int | None) -> list[int] | None:
    """SGLang id list both engines capture when the draft config has no ids."""
    if num_layers is None:
        return None
    return [2 - 1, num_layers // 2 - 1, num_layers - 3 - 1]


def interpret(configured: list[int] | None, slot_ids: Sequence[int] | None,
              num_layers: int | None) -> list[Interpretation]:
    """The layouts ``configured`` implies under SGLang's and vLLM's conventions."""
    out = []
    for convention, shift in (("sglang", 0), ("vllm", -1)):
        if configured is None:
            captured = engine_default(num_layers)
            note = ("no ids in the config: the engine captures its default "
                    + ("after layers [2, n/2, n-3]" if captured else "(unknown: num_hidden_layers unknown)"))
        else:
            captured = sorted(i + shift for i in configured)
            note = ("id = output of layer id, -1 = embedding (SGLang captures index id+1)" if shift == 0
                    else "id = state after id layers, 0 = embedding")
        slots, missing = _locate(captured, slot_ids)
        out.append(Interpretation(convention, configured, captured, slots, missing, note))
    return out


def serving_convention(fmt: str) -> str:
    """Convention of the ids stored in a config of format ``fmt`` ("flat" or "speculators")."""
    return "vllm" if fmt == "speculators" else "sglang"


ENGINE = {"sglang": "SGLang", "vllm": "vLLM"}


def _locate(captured: list[int] | None, slot_ids: Sequence[int] | None) -> tuple[list[int] | None, list[int]]:
    if captured is None or slot_ids is None:
        return None, []
    missing = [c for c in captured if c not in slot_ids]
    if missing:
        return None, missing
    return [list(slot_ids).index(c) for c in captured], []


def slot_role(slot: int, slot_ids: Sequence[int] | None, final_slot: int | None) -> str:
    if slot == final_slot:
        return "final"
    if slot_ids is None:
        return "unknown"
    return "embedding" if slot_ids[slot] == -1 else f"layer {slot_ids[slot]}"


def describe(slots: Sequence[int], slot_ids: Sequence[int] | None, final_slot: int | None) -> str:
    return "[" + ", ".join(slot_role(s, slot_ids, final_slot) for s in slots) + "]"


@dataclass
class Verdict:
    status: str
    fix_layer_ids: list[int] | None
    fix_layer_ids_vllm: list[int] | None
    needs_capture_patch: bool
    message: str
    basis: str
    best_slots: list[int]
    served_slots: list[int] | None
    tolerance: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def decide(scan: dict[tuple[int, ...], float], served: Interpretation, slot_ids: Sequence[int] | None,
           final_slot: int | None, basis: str, tolerance: float, fmt: str) -> Verdict:
    """MATCH when the layout the serving engine would feed scores within ``tolerance`` of the best."""
    best = max(scan, key=lambda s: (scan[s], [-x for x in s]))
    best_acc = scan[best]
    fix = [slot_ids[s] for s in best] if slot_ids is not None else None
    fix_vllm = [i + 1 for i in fix] if fix is not None else None
    where = ("eagle_config.eagle_aux_hidden_state_layer_ids" if fmt == "flat"
             else "eagle_aux_hidden_state_layer_ids")
    best_txt = f"{describe(best, slot_ids, final_slot)} (step-0 acc {best_acc:.3f}, {basis} targets)"
    engine = ENGINE[served.convention]
    write = fix_vllm if served.convention == "vllm" else fix
    served_slots = tuple(served.slots) if served.slots is not None else None
    if fix is None:
        return Verdict(STATUS_UNKNOWN, None, None, False,
                       f"The dump has no data_config.json with per-slot layer ids, so the configured "
                       f"ids cannot be checked. The draft scores best on slots {list(best)} "
                       f"{best_txt}; write data_config.json with the layer id of each slot and rerun.",
                       basis, list(best), None, tolerance)
    if served_slots is not None and scan.get(served_slots, -1.0) >= best_acc - tolerance:
        patch = -1 in (served.captured_ids or [])
        return Verdict(STATUS_MATCH, None, None, patch,
                       f"The layout {engine} feeds for the configured ids {served.configured_ids}, "
                       f"{describe(served_slots, slot_ids, final_slot)}, is the one the draft was trained "
                       f"on: step-0 acc {scan[served_slots]:.3f} vs best {best_acc:.3f}. Nothing to fix"
                       + (" (the ids include -1: SGLang needs the embedding-capture patch)."
                          if patch else "."),
                       basis, list(best), list(served_slots), tolerance)
    patch = -1 in fix
    if served_slots is not None:
        now = (f"its config ids {served.configured_ids} make {engine} feed "
               f"{describe(served_slots, slot_ids, final_slot)} (step-0 acc {scan[served_slots]:.3f})")
    elif served.captured_ids is None:
        now = ("its config has no aux layer ids, so the engines capture their default (after layers "
               "[2, n/2, n-3]) and the target's layer count n is unknown here")
    else:
        now = (f"its config ids {served.configured_ids} make {engine} capture the outputs of layers "
               f"{served.captured_ids}, which are not in this dump (missing {served.missing})")
    msg = (f"The draft was trained on {best_txt}, but {now}. Put \"{where}\": {write} in the draft "
           f"config.json" + (" (speculators' own convention: 0 is the embedding)" if write is fix_vllm else ""))
    msg += (" and apply the SGLang embedding-capture patch: unpatched SGLang cannot capture the "
            "embedding output (-1)." if patch else "; no SGLang patch is needed.")
    msg += (f" In SGLang ids (a flat config's eagle_config) the fix is {fix}." if write is fix_vllm
            else f" vLLM reads the same layout as {fix_vllm}.")
    return Verdict(STATUS_MISMATCH, fix, fix_vllm, patch, msg, basis, list(best),
                   list(served_slots) if served_slots else None, tolerance)
