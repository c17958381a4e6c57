"""SpecForge's vocabulary map next to the dumps, compared with the draft's own ``d2t``: a draft whose map
differs from the one its training data was built with drafts other ids than it learned (SpecForge
PR #534: the map is regenerated when fine-tuning on other data). Finding ``vocab-map-differs``.

SpecForge 0.2.0 writes ``torch.save({"d2t": [N] int64 offsets, "t2d": [V] bool})`` as
``<cache_dir>/vocab_mapping/vocab_mapping.pt`` (``data.preprocessing.generate_vocab_mapping_file``)
or ``<cache_dir>/vocab_mapping/<sha256>.pt`` (``training.assembly``, keyed by the dataset), with the
same offsets convention as the checkpoint (target id = d + d2t[d]). Read with ``weights_only=True``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..errors import CorruptFileError, ShapeMismatchError
from ..measures import VOCAB_MAPPING
from ..store import torchfile

TRAINER_MAP = VOCAB_MAPPING.key  # Results.extra key and the report's data.vocab_mapping (measures.py)
REGENERATE = ("point SpecForge's vocab mapping at this draft's training data again (its vocab_mapping step "
              "writes vocab_mapping/*.pt), or remove the stale file from next to the dumps")
SHOWN = 5


def candidates(root: Path) -> list[Path]:
    """``vocab_mapping/*.pt`` in the data folder or one up, directly or under ``cache/``."""
    base = root if root.is_dir() else root.parent
    out: list[Path] = []
    for folder in (base, base.parent):
        for sub in (folder / "vocab_mapping", folder / "cache" / "vocab_mapping"):
            if sub.is_dir():
                out += sorted(f for f in sub.iterdir() if f.suffix == ".pt" and f.is_file())
    return list(dict.fromkeys(out))


def read(file: Path, draft_vocab: int, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) of one map file, or one paragraph naming it."""
    raw = torchfile.load(file, REGENERATE)
    if not isinstance(raw, dict) or not isinstance(raw.get("d2t"), torch.Tensor) \
            or not isinstance(raw.get("t2d"), torch.Tensor):
        found = sorted(map(str, raw)) if isinstance(raw, dict) else type(raw).__name__
        raise CorruptFileError("The vocab mapping file next to the dumps is not SpecForge's {d2t, t2d} tensors",
                               path=file, expected="{'d2t': [N] int64, 't2d': [V] bool}", found=found,
                               fix=REGENERATE)
    d2t, t2d = raw["d2t"].reshape(-1), raw["t2d"].reshape(-1)
    if d2t.is_floating_point() or d2t.is_complex() or d2t.dtype == torch.bool:
        raise CorruptFileError("The vocab mapping's d2t next to the dumps is not integer offsets, so it names no "
                               "target ids", path=file, tensor="d2t", expected="int64 offsets (target = d + d2t[d])",
                               found=str(d2t.dtype).replace("torch.", ""), fix=REGENERATE)
    if d2t.shape[0] != draft_vocab or t2d.shape[0] != vocab_size:
        raise ShapeMismatchError(
            "The vocab mapping next to the dumps is for another vocabulary than this draft's, so it cannot be "
            "the map the draft was trained with", path=file, tensor="d2t",
            expected=f"d2t [{draft_vocab}] int64 (the draft vocab) and t2d [{vocab_size}] (the target vocab)",
            found=f"d2t {list(d2t.shape)} {str(d2t.dtype).replace('torch.', '')}, t2d {list(t2d.shape)}",
            fix=f"{REGENERATE}; or pass --data the dumps this draft was trained on")
    d2t = d2t.to(torch.long)
    target = d2t + torch.arange(draft_vocab)     # int64 wraps past 2**63; so does the check, both ways
    outside = ((target < 0) | (target >= vocab_size) | (d2t < -vocab_size) | (d2t > vocab_size)).nonzero().flatten()
    if outside.numel():   # SpecForge's generator maps into the target vocab only: a differ count would be made up
        shown = ", ".join(f"draft id {int(i)} -> {int(target[i])}" for i in outside[:3])
        raise CorruptFileError(
            f"The vocab mapping next to the dumps maps {outside.numel()} of its {draft_vocab} draft ids outside the "
            f"target's {vocab_size} token ids (e.g. {shown}), so it is no map the data was built with", path=file,
            tensor="d2t", expected=f"d + d2t[d] in 0..{vocab_size - 1}", found=f"{outside.numel()} outside",
            fix=REGENERATE)
    return d2t, t2d.to(torch.bool)


def compare(root: Path, d2t: torch.Tensor, vocab_size: int) -> dict[str, Any] | None:
    """The report's ``data.vocab_mapping``: each map file found and how many draft ids it maps elsewhere
    than the draft's d2t (None when there is none; a reduced-vocab draft only)."""
    files = candidates(root)
    n = int(d2t.shape[0])
    if not files or n >= vocab_size:
        return None
    mine = d2t.cpu() + torch.arange(n)
    maps: list[dict[str, Any]] = []
    for f in files:
        theirs = read(f, n, vocab_size)[0] + torch.arange(n)
        differ = (theirs != mine).nonzero().flatten()
        maps.append({"path": str(f), "draft_ids_differing": int(differ.numel()),
                     "examples": [{"draft_id": int(i), "draft_maps_to": int(mine[i]), "data_map_to": int(theirs[i])}
                                  for i in differ[:SHOWN]],
                     "target_ids_only_in_data_map": int(len(set(theirs.tolist()) - set(mine.tolist())))})
    closest = min(maps, key=lambda m: m["draft_ids_differing"])
    return {"files": maps, "closest": closest["path"], "draft_vocab": n,
            "agrees": closest["draft_ids_differing"] == 0}


def finding(facts: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``vocab-map-differs`` (bad) when no map next to the dumps is the draft's own."""
    if facts is None or facts["agrees"]:
        return []
    m = next(x for x in facts["files"] if x["path"] == facts["closest"])
    n = facts["draft_vocab"]
    eg = ", ".join(f"draft id {e['draft_id']} -> {e['draft_maps_to']} (data map {e['data_map_to']})"
                   for e in m["examples"][:3])
    return [{"id": "vocab-map-differs", "severity": "bad",
             "text": (f"The draft's d2t differs from the vocab mapping its dumps were built with ({m['path']}): "
                      f"{m['draft_ids_differing']} of its {n} draft ids map to another target id (e.g. {eg}), and "
                      f"{m['target_ids_only_in_data_map']} target ids of the data's map are not in the draft's, so "
                      "the engine drafts other ids than the lm_head was trained to predict."),
             "evidence": {"file": m["path"], "draft_vocab": n, "draft_ids_differing": m["draft_ids_differing"],
                          "target_ids_only_in_data_map": m["target_ids_only_in_data_map"],
                          "examples": m["examples"], "files": len(facts["files"])},
             "fix": ("Copy d2t and t2d from that vocab_mapping.pt into the checkpoint if the draft was trained with "
                     "it; if the draft was trained with its own map, the dumps are of another data set: "
                     "regenerate the map from the draft's training data (SpecForge PR #534).")}]
