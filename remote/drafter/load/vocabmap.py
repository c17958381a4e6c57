"""The draft's vocabulary map (``d2t``/``t2d``) judged against the dumps: the report's findings
``vocab-map-identity`` (bad), ``vocab-map-missing`` (bad) and ``vocab-map-coverage`` (warn), docs/drafter.md § Findings.

A reduced-vocab draft emits draft id d as target id ``d + d2t[d]``. Two broken maps are seen in the
field: all offsets 0 (draft id i is target id i, so the engine drafts the first N target ids; NeMo
Automodel #2447) and the target ids stored where the offsets belong (``d2t = arange``, so draft id
i is target id 2i; verl-SpeCo #67). The loader lets both through (rather than failing on the range
or on a ``t2d`` that disagrees) so the evaluation can say what they cost.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

COVERAGE_WARN = 0.9   # a share of the scored next tokens below this, expressible by the draft, is a warning
TOP_MISSING = 5
TRAINER_MAPS = ("copy d2t and t2d from the trainer's vocab mapping (SpecForge's vocab_mapping/vocab_mapping.pt, "
                "speculators' d2t/t2d tensors) into the checkpoint's safetensors, offsets d2t[d] = target id - d")


def pattern(d2t: torch.Tensor, vocab_size: int) -> str | None:
    """``identity`` (every offset 0) or ``arange`` (offsets equal the draft ids) for a draft whose vocab
    is smaller than the target's; None for any other map (or a full-vocab draft, where 0 is right)."""
    n = int(d2t.shape[0])
    if n >= vocab_size or n == 0:
        return None
    if not bool(d2t.any()):
        return "identity"
    if n > 1 and torch.equal(d2t, torch.arange(n, dtype=d2t.dtype)):
        return "arange"
    return None


@dataclass
class MapFacts:
    """What the loader saw in the map: the report's ``checkpoint.vocab_map``."""

    pattern: str | None
    draft_vocab: int
    target_vocab: int
    self_mapped: int        # draft ids d with d + d2t[d] == d
    offsets_equal_ids: int  # draft ids d with d2t[d] == d
    out_of_range: int       # draft ids mapped outside the target vocab
    t2d_agrees: bool | None  # None: no t2d stored
    stored: bool = True     # False: the checkpoint has no d2t (the engine then uses all offsets 0)

    @classmethod
    def of(cls, d2t: torch.Tensor, vocab_size: int, t2d: torch.Tensor | None, stored: bool = True) -> MapFacts:
        ids = torch.arange(d2t.shape[0])
        targets = ids + d2t.cpu()
        agrees = None
        if t2d is not None:
            agrees = t2d.shape[0] == vocab_size and torch.equal(torch.nonzero(t2d.cpu()).flatten(),
                                                                targets.sort().values)
        return cls(pattern(d2t.cpu(), vocab_size), int(d2t.shape[0]), vocab_size, int((targets == ids).sum()),
                   int((d2t.cpu() == ids).sum()), int(((targets < 0) | (targets >= vocab_size)).sum()), agrees,
                   stored)

    def to_dict(self) -> dict[str, Any]:
        return {"pattern": self.pattern, "draft_vocab": self.draft_vocab, "target_vocab": self.target_vocab,
                "self_mapped": self.self_mapped, "offsets_equal_ids": self.offsets_equal_ids,
                "out_of_range": self.out_of_range, "t2d_agrees": self.t2d_agrees, "d2t_stored": self.stored}


class Coverage:
    """Counts, over the data targets of the metrics pass, how many scored next tokens the draft can
    emit (through d2t, as the engine drafts; and through the stored t2d when it disagrees)."""

    def __init__(self, emit: torch.Tensor, t2d: torch.Tensor | None) -> None:
        self.emit = emit
        self.t2d = t2d
        self.total = torch.zeros((), dtype=torch.long, device=emit.device)
        self.inside = torch.zeros_like(self.total)
        self.inside_t2d = torch.zeros_like(self.total)
        self.missing = torch.zeros(emit.shape[0], dtype=torch.long, device=emit.device)

    def update(self, next_ids: torch.Tensor, scored: torch.Tensor) -> None:
        ids = next_ids[scored & (next_ids >= 0)]
        hit = self.emit[ids]
        self.total += ids.numel()
        self.inside += hit.sum()
        self.missing += torch.bincount(ids[~hit], minlength=self.emit.shape[0])
        if self.t2d is not None:
            self.inside_t2d += self.t2d[ids].sum()

    def to_dict(self) -> dict[str, Any]:
        total = int(self.total)
        counts, ids = self.missing.cpu().sort(descending=True, stable=True)
        top = [{"target_id": int(i), "count": int(c)}
               for c, i in zip(counts[:TOP_MISSING], ids[:TOP_MISSING], strict=True) if int(c) > 0]
        return {"scored_tokens": total, "in_draft_vocab": int(self.inside),
                "share": int(self.inside) / total if total else None,
                "share_by_t2d": (int(self.inside_t2d) / total if total else None) if self.t2d is not None else None,
                "threshold": COVERAGE_WARN, "top_missing": top}


def findings(facts: MapFacts | None, coverage: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The report's vocabulary-map findings (none for a healthy map with enough coverage)."""
    out = []
    if facts is not None and facts.pattern is not None and not facts.stored:
        out.append(_missing(facts, coverage))
    elif facts is not None and facts.pattern is not None:
        out.append(_identity(facts, coverage))
    elif coverage is not None and coverage["share"] is not None and coverage["share"] < COVERAGE_WARN:
        out.append(_coverage(coverage))
    return out


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _identity(facts: MapFacts, coverage: dict[str, Any] | None) -> dict[str, Any]:
    n, v = facts.draft_vocab, facts.target_vocab
    if facts.pattern == "identity":
        what = (f"all {n} offsets in d2t are 0, so each of the {n} draft ids maps to itself and the engine drafts "
                f"target ids 0..{n - 1} of the target's {v}")
    else:
        what = (f"d2t holds the draft ids themselves ({facts.offsets_equal_ids} of {n} offsets equal their id), "
                f"so draft id i becomes target id 2i and the engine drafts the wrong ids"
                + (f", {facts.out_of_range} of them past the target's {v}" if facts.out_of_range else ""))
    evidence: dict[str, Any] = {"pattern": facts.pattern, "draft_vocab": n, "target_vocab": v,
                                "self_mapped": facts.self_mapped, "offsets_equal_ids": facts.offsets_equal_ids,
                                "out_of_range": facts.out_of_range, "t2d_agrees": facts.t2d_agrees}
    share = ""
    if coverage is not None:
        evidence.update(share=coverage["share"], share_by_t2d=coverage["share_by_t2d"],
                        scored_tokens=coverage["scored_tokens"])
        share = f"; that map can express {_pct(coverage['share'])} of the dumps' {coverage['scored_tokens']} " \
                "scored next tokens"
        if coverage["share_by_t2d"] is not None and facts.t2d_agrees is False:
            share += f", the stored t2d (which disagrees with d2t) {_pct(coverage['share_by_t2d'])}"
    return {"id": "vocab-map-identity", "severity": "bad",
            "text": (f"The draft's vocabulary map is broken: its vocab has {n} ids, smaller than the target's "
                     f"{v}, but {what}{share}."),
            "evidence": evidence, "fix": TRAINER_MAPS[0].upper() + TRAINER_MAPS[1:] + "."}


def _missing(facts: MapFacts, coverage: dict[str, Any] | None) -> dict[str, Any]:
    """A reduced-vocab draft without d2t: the engine serves it with every offset 0 (NeMo Automodel #2447)."""
    n, v = facts.draft_vocab, facts.target_vocab
    evidence: dict[str, Any] = {"draft_vocab": n, "target_vocab": v, "d2t_stored": False,
                                "t2d_stored": facts.t2d_agrees is not None}
    share = ""
    if coverage is not None:
        evidence.update(share=coverage["share"], share_by_t2d=coverage["share_by_t2d"],
                        scored_tokens=coverage["scored_tokens"])
        share = (f"; those ids express {_pct(coverage['share'])} of the dumps' {coverage['scored_tokens']} "
                 "scored next tokens")
        if coverage["share_by_t2d"] is not None:
            share += f", the draft vocab its stored t2d names {_pct(coverage['share_by_t2d'])}"
    fix = TRAINER_MAPS[0].upper() + TRAINER_MAPS[1:] + "."
    if facts.t2d_agrees is not None:
        fix = ("Write d2t into the checkpoint from its own t2d: d2t = nonzero(t2d) - arange(" + str(n) + ") "
               "(int64), or " + TRAINER_MAPS + ".")
    return {"id": "vocab-map-missing", "severity": "bad",
            "text": (f"The draft's vocab has {n} ids, smaller than the target's {v}, but the checkpoint has no d2t, "
                     f"so the engine maps draft id i to target id i and drafts only target ids 0..{n - 1}{share}."),
            "evidence": evidence, "fix": fix}


def _coverage(coverage: dict[str, Any]) -> dict[str, Any]:
    top = ", ".join(f"{m['target_id']} ({m['count']}x)" for m in coverage["top_missing"])
    return {"id": "vocab-map-coverage", "severity": "warn",
            "text": (f"The draft vocabulary can express only {_pct(coverage['share'])} of the dumps' "
                     f"{coverage['scored_tokens']} scored next tokens (below {coverage['threshold']:.0%}), so the "
                     f"draft misses the rest whatever it predicts; the most frequent missing target ids: {top}."),
            "evidence": {"share": coverage["share"], "scored_tokens": coverage["scored_tokens"],
                         "in_draft_vocab": coverage["in_draft_vocab"], "threshold": coverage["threshold"],
                         "top_missing": coverage["top_missing"]},
            "fix": ("Rebuild the draft vocabulary from the training data's token counts (the most frequent target "
                    "ids, e.g. SpecForge's or speculators' vocab-mapping step on the same data) and retrain the "
                    "draft's lm_head on it.")}
