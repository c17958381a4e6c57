"""What the engine will feed a draft's fc, as configured, next to what training fed it; and the fix.

Read from the draft's config and the *shape* of its fc weight (its safetensors header), never its
weights: the capture check answers from the engine's states alone.

What training fed: the first k dumped slots other than the final one, in file order, k being the
fc's input width over the target's hidden size. That is speculators' loader
(``hidden_states[:, :-1].flatten(1)``, the aux slots in ascending order) and the first k of them
when the dump holds more slots than the fc takes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import jsonread
from ..drafter.load.checkpoint import canonical_name
from ..drafter.store.tensorstore import TensorStore
from ..eagle import convention, formats
from .errors import CaptureError

DEFAULT_AUX = 3


def aux_count(draft: Path, hidden: int) -> tuple[int, str]:
    """How many states the fc takes (and where that was read)."""
    try:
        store = TensorStore.open(draft)
    except Exception as exc:  # noqa: BLE001 - any unreadable checkpoint: fall back, and say so
        return DEFAULT_AUX, f"EAGLE-3's {DEFAULT_AUX} (the checkpoint's weights could not be listed: {exc})"
    for name in store.names():
        if canonical_name(name) == "fc.weight":
            shape = store.shape(name)
            if len(shape) == 2 and hidden and shape[1] % hidden == 0:
                return shape[1] // hidden, f"fc.weight's shape {list(shape)} (its header)"
    return DEFAULT_AUX, f"EAGLE-3's {DEFAULT_AUX} (no fc.weight of width k x {hidden} in the checkpoint)"


def read_config(draft: Path) -> dict[str, Any]:
    file = draft / "config.json" if draft.is_dir() else draft
    try:
        config = jsonread.load(file)
    except (OSError, ValueError) as exc:
        raise CaptureError(f"The draft's config cannot be read ({type(exc).__name__}: {exc})", path=file,
                           fix="pass --draft the checkpoint folder holding config.json") from exc
    if not isinstance(config, dict) or formats.detect(config) is None:
        raise CaptureError(f"The file is not an EAGLE-3 draft config: {formats.NOT_A_DRAFT}", path=file,
                           fix="pass --draft the draft checkpoint folder, not the target's")
    return config


def feeding(draft: Path, engine: str, num_layers: int, hidden: int, slot_boundaries: list[int | None],
            final_slot: int | None) -> dict[str, Any]:
    """The draft's side of the report: fed vs trained boundaries, and the ids that make them one."""
    config = read_config(draft)
    fmt = formats.detect(config) or formats.FLAT
    reading = convention.read(engine, config, fmt, num_layers)
    k, k_source = aux_count(draft, hidden)
    aux_slots = [s for s in range(len(slot_boundaries)) if s != final_slot][:k]
    trained = [slot_boundaries[s] for s in aux_slots]
    fed = reading.boundaries
    out: dict[str, Any] = {
        "path": str(draft), "format": fmt, "engine": engine, "field": reading.field, "ids": reading.ids,
        "fallback": reading.fallback, "fed_boundaries": fed, "aux_count": k, "aux_count_from": k_source,
        "trained_slots": aux_slots, "trained_boundaries": trained, "status": None, "fix": None,
        "explain": convention.explain(reading, num_layers)}
    if len(aux_slots) < k or any(b is None for b in trained):
        out["status"] = "UNKNOWN"
        out["why"] = ("the dump does not hold the states training fed" if len(aux_slots) < k else
                      "a slot training fed matches no boundary of this target, so what training fed is not a "
                      "layer this engine computes")
        return out
    known = [int(b) for b in trained if b is not None]
    if fed == known:
        out["status"] = "MATCH"
        return out
    out["status"] = "MISMATCH"
    ids = convention.from_boundaries(engine, known)
    file_engine = convention.serving_convention(fmt)
    out["fix"] = {"field": formats.ids_field(fmt) if engine == file_engine else convention.READS[engine][0],
                  "ids": ids, "engine": engine, "boundaries": known,
                  "sglang_ids": convention.from_boundaries(convention.SGLANG, known),
                  "vllm_ids": convention.from_boundaries(convention.VLLM, known),
                  "needs_capture_patch": engine == convention.SGLANG and 0 in known}
    return out
