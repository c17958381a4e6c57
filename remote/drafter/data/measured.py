"""Slot layers measured by `invoke capture-check` (the engine's own states), used in place of what
``data_config.json`` claims: with them the verdict's served layout is measured, not inferred."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ... import jsonread
from ..errors import ConfigError
from .dumps import SlotInfo


def read_capture_check(path: Path, slot_count: int) -> tuple[SlotInfo | None, dict[str, Any] | None]:
    """(the measured SlotInfo, None), or, when the check found slots that match no boundary and said how
    they differ (its ``differences``), (None, a summary for the finding target-differs): such dumps are
    not of the target as served, so no layout is measured from them, but the evaluation still says what
    the draft scores on them. Refused in one paragraph when unreadable, for another slot count, or when
    slots are unmatched without differences (an SGLang check measures the final slot only)."""
    try:
        doc = jsonread.load(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"The capture-check report cannot be read ({type(exc).__name__}: {exc})", path=path,
                          fix="run `invoke capture-check` again, or drop --measured") from exc
    slots = doc.get("slots") if isinstance(doc, dict) else None
    if not isinstance(slots, list) or len(slots) != slot_count:
        raise ConfigError("The capture-check report measured another number of slots than this dump holds",
                          path=path, field="slots", expected=f"{slot_count} slots",
                          found=len(slots) if isinstance(slots, list) else slots,
                          fix="run `invoke capture-check` on these dumps")
    diffs = doc.get("differences")
    unmatched = not all(isinstance(s, dict) and s.get("matched") is True and isinstance(s.get("boundary"), int)
                        for s in slots)
    if unmatched and isinstance(diffs, list) and diffs and all(isinstance(d, dict) for d in diffs):
        return None, {"path": str(path), "run": path.parent.name, "status": doc.get("status"),
                      "differences": diffs}
    if unmatched:
        raise ConfigError("The capture-check report left slots unmatched: these dumps are not of this target as "
                          "served, so no layout can be measured from it", path=path, field="slots",
                          fix="read the capture check's report (its differences) before evaluating the draft")
    final = doc.get("final_slot")
    layers = doc.get("target", {}).get("num_hidden_layers") if isinstance(doc.get("target"), dict) else None
    return replace(SlotInfo(), layer_ids=tuple(int(s["boundary"]) - 1 for s in slots),
                   final_slot=final if isinstance(final, int) else None, final_slot_given=isinstance(final, int),
                   num_hidden_layers=layers if isinstance(layers, int) else None, path=str(path)), None
