"""Vocabulary-map causes (failure-modes.md #6; remote/drafter/load/vocabmap.py): broken d2t/t2d maps.
The map builders are shared with tests/test_drafter_vocabmap.py (which breaks the demo draft)."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import torch

from .healthy import Healthy, Variant


def zeros_d2t(weights: dict[str, torch.Tensor]) -> None:
    """All offsets 0: draft id i drafts target id i (NeMo Automodel #2447); t2d left as trained."""
    weights["d2t"] = torch.zeros_like(weights["d2t"])


def arange_d2t(weights: dict[str, torch.Tensor]) -> None:
    """The draft ids stored where the offsets belong: draft id i drafts target id 2i (verl-SpeCo #67)."""
    weights["d2t"] = torch.arange(weights["d2t"].shape[0], dtype=weights["d2t"].dtype)


def rare_map(n: int, vocab: int, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A valid (d2t, t2d) onto the ``n`` of ``vocab`` target ids least used in ``token_ids``: a map
    whose d2t and t2d agree but whose coverage of the data is low."""
    counts: Counter[int] = Counter(token_ids.flatten().tolist())
    keep = torch.tensor(sorted(sorted(range(vocab), key=lambda t: (counts[t], t))[:n]))
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[keep] = True
    return keep - torch.arange(n), t2d


def identity_zeros(base: Healthy, out: Path) -> Variant:
    return Variant(base.draft_with(out / "draft", zeros_d2t))


def identity_arange(base: Healthy, out: Path) -> Variant:
    return Variant(base.draft_with(out / "draft", arange_d2t))


def coverage(base: Healthy, out: Path) -> Variant:
    from tests.support.drafter_lab import lab

    def rare(weights: dict[str, torch.Tensor]) -> None:
        weights["d2t"], weights["t2d"] = rare_map(weights["d2t"].shape[0], weights["t2d"].shape[0], lab().ids)

    return Variant(base.draft_with(out / "draft", rare))


def missing_d2t(base: Healthy, out: Path) -> Variant:
    """A reduced-vocab draft saved without d2t (t2d kept): served with every offset 0 (NeMo Automodel #2447)."""
    return Variant(base.draft_with(out / "draft", lambda w: w.pop("d2t")))


def differs_from_data_map(base: Healthy, out: Path) -> Variant:
    """SpecForge's vocab_mapping/vocab_mapping.pt next to the dumps (one folder up, shared by the three
    formats) maps six draft ids elsewhere than the draft's d2t: a map regenerated on other data (PR #534)."""
    from safetensors.torch import load_file

    from tests.support.drafter_lab import lab

    w = load_file(base.draft / "model.safetensors")
    d2t = w["d2t"].clone()
    d2t[-6:] -= 1
    t2d = torch.zeros_like(w["t2d"])
    t2d[d2t + torch.arange(d2t.shape[0])] = True
    data = base.dumps_with(out / "data", lab().ids, lab().slots())
    (out / "data" / "vocab_mapping").mkdir()
    torch.save({"d2t": d2t, "t2d": t2d}, out / "data" / "vocab_mapping" / "vocab_mapping.pt")
    return Variant(base.draft, data)
