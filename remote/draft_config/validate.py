"""Check requested layer ids (SGLang output-of-layer convention) against the draft and target.

SGLang captures id X before decoder layer X + 1 runs, so the usable range for a target with N
layers is -1 (the embedding) .. N-2 (the input of the last layer). The aux states are
concatenated in ascending order, and the fc layer has one input slot per aux state.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from ..eagle import convention, weights
from ..eagle.formats import is_int
from .config_file import DraftConfig
from .errors import InvalidLayerIds
from .target import TargetInfo

#: no target has this many layers (remote/drafter/data/trainerconfig.py holds the same bound): without
#: --target an id at or past it is refused, not written
MAX_LAYERS = 1 << 16


@dataclass
class Checked:
    """Ids ready to write (sorted) and what the user should know about them."""

    ids: list[int]
    fc_aux_slots: int | None
    warnings: list[str] = field(default_factory=list)


_ID = re.compile(r"-?[0-9]+")


def join_negative_values(argv: list[str]) -> list[str]:
    """Let ``--layer-ids -1,2,30`` through (argparse takes '-1,2,30' for an option)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--layer-ids" and i + 1 < len(argv):
            out.append(f"--layer-ids={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def parse_ids(text: str) -> list[int]:
    """``"-1,2,30"`` -> ``[-1, 2, 30]``. An empty entry (``-1,,2,30``, a trailing comma) is refused:
    it is a typo for a missing id more often than a stray comma, and the ids would be one short."""
    parts = text.replace(" ", "").split(",")
    if not any(parts):
        raise InvalidLayerIds("--layer-ids is empty; give at least one id, e.g. -1,2,30.")
    if not all(parts):
        raise InvalidLayerIds(
            f"--layer-ids {text!r} has an empty entry (entry {parts.index('') + 1}); give each id once "
            "between commas, e.g. -1,2,30.")
    # ASCII digits only: int() also takes '1_0' (10) and full-width or other Unicode digits, which
    # would write an id the user never typed into the config
    bad = next((part for part in parts if not _ID.fullmatch(part)), None)
    if bad is not None:
        raise InvalidLayerIds(
            f"--layer-ids {text!r} is not a comma-separated list of integers (e.g. -1,2,30): entry {bad!r} "
            "is not an integer written with the digits 0-9 and an optional leading minus.")
    return [int(part) for part in parts]


def check(ids: list[Any], cfg: DraftConfig, target: TargetInfo | None) -> Checked:
    """Validate ``ids``; raise InvalidLayerIds with every problem found, else return warnings."""
    problems: list[str] = []
    warnings: list[str] = []
    if not ids or not all(is_int(v) for v in ids):
        raise InvalidLayerIds(f"Layer ids {ids!r} must be a non-empty list of integers.")
    repeated = sorted({v for v in ids if ids.count(v) > 1})
    if repeated:
        problems.append(f"id(s) {repeated} repeated (each aux state must be distinct)")
    problems += _range_problems(ids, target, warnings)
    slots = _fc_slots(cfg, target, warnings)
    if slots is not None and slots != len(set(ids)):
        problems.append(f"{len(set(ids))} ids but fc.weight takes {slots} aux hidden states")
    declared = cfg.declared_aux_count()
    if declared is not None and declared != len(set(ids)):
        problems.append(f"{len(set(ids))} ids but config.json declares num_aux_hidden_states="
                        f"{declared}")
    if problems:
        raise InvalidLayerIds(
            f"Refusing to write layer ids {ids} into {cfg.path} ({cfg.field}): "
            + "; ".join(problems) + ". Pick ids in the SGLang output-of-layer convention "
            "(-1 = embedding) that match the draft's training; nothing was written."
        )
    ordered = sorted(ids)
    if ordered != list(ids):
        warnings.append(f"ids {ids} given out of order; written ascending as {ordered} "
                        "(SGLang concatenates aux states in ascending layer order)")
    if len(ordered) != 3:
        warnings.append(f"{len(ordered)} aux ids: SGLang <= 0.5.11 supports exactly 3")
    return Checked(ids=ordered, fc_aux_slots=slots, warnings=warnings)


def _range_problems(ids: list[int], target: TargetInfo | None, warnings: list[str]) -> list[str]:
    """Ids outside what SGLang can capture: the low end (the embedding) needs no layer count; the
    high end is checked only with a target (without one, a warning says so)."""
    problems = []
    first, last = convention.usable_ids(convention.SGLANG, target.num_hidden_layers if target else 0)
    low = [v for v in ids if v < first]
    if low:
        problems.append(f"id(s) {low} below {first} ({first} is the embedding output)")
    if target is None:
        huge = [v for v in ids if v >= MAX_LAYERS]   # 2**63 + 1 was written: no engine reads it as a layer
        if huge:
            problems.append(f"id(s) {huge} past any target's layers ({MAX_LAYERS}; pass --target to check "
                            "against its own count)")
        warnings.append("no --target given: ids not checked against the target's layer count")
        return problems
    high = [v for v in ids if v > last]
    if high:
        problems.append(
            f"id(s) {high} above {last}: the target ({target.path}) has "
            f"{target.num_hidden_layers} layers and SGLang captures id X before layer X+1, "
            f"so {last} (the input of the last layer) is the highest usable id")
    return problems


def _fc_slots(cfg: DraftConfig, target: TargetInfo | None, warnings: list[str]) -> int | None:
    ckpt = cfg.path.parent
    found = weights.find_shape(ckpt, "fc.weight")
    if found is None:
        warnings.append(f"no fc.weight in the safetensors of {ckpt}: aux count not checked")
        return None
    shape, _ = found
    width = (cfg.target_hidden_size() or (target.hidden_size if target else None)
             or cfg.hidden_size() or (shape[0] if shape else None))
    slots = weights.aux_slots(shape, width)
    if slots is None:
        warnings.append(f"fc.weight shape {shape} is not a multiple of the target hidden size "
                        f"{width}: aux count not checked")
    return slots


def needs_capture_patch(ids: list[int]) -> bool:
    """True when SGLang must capture the embedding (id -1, boundary 0)."""
    return 0 in convention.to_boundaries(convention.SGLANG, ids)
