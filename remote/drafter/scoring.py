"""Score a draft on batches for one choice of aux slots, against data and verifier targets.

Data targets: the next token in the dump (target vocab); the draft's argmax is mapped through d2t,
so a token outside the draft vocab is always a miss (as when serving).  Verifier targets:
speculators' ``argmax(verifier_lm_head[t2d](verifier_norm(h_last)))`` over the draft vocab, where
h_last is the dump's final-layer slot (pre-norm).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .batching import Batch
from .layers import rms_norm
from .metrics import StepCounts
from .model import Eagle3Draft


@dataclass
class VerifierHead:
    """verifier_norm and the lm_head rows of the draft vocab, on the draft's device."""

    norm: torch.Tensor  # [H]
    rows: torch.Tensor  # [Vd, H], row d = verifier lm_head[d + d2t[d]]
    eps: float

    def targets(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """[B, N] draft-vocab argmax of the verifier at each position."""
        x = rms_norm(last_hidden.to(self.rows.dtype), self.norm, self.eps)
        return (x @ self.rows.T).argmax(-1)


@dataclass
class LayoutScore:
    """Counts for one layout; ``verifier`` is None without a verifier.  ``nonfinite``: valid rows
    whose logits held NaN/inf at some step (their argmax means nothing)."""

    slots: tuple[int, ...]
    data: StepCounts
    verifier: StepCounts | None
    nonfinite: int = 0

    def counts(self, basis: str) -> StepCounts | None:
        return self.verifier if basis == "verifier" else self.data

    def step0(self, basis: str) -> float | None:
        counts = self.counts(basis)
        return counts.full_acc()[0] if counts is not None else None


def new_score(slots: Sequence[int], steps: int, with_verifier: bool) -> LayoutScore:
    return LayoutScore(tuple(slots), StepCounts(steps), StepCounts(steps) if with_verifier else None)


def score_batch(draft: Eagle3Draft, batch: Batch, score: LayoutScore, steps: int,
                verifier_targets: torch.Tensor | None) -> None:
    """Run the TTT forward on ``batch`` with ``score.slots`` and add its counts to ``score``."""
    preds: list[torch.Tensor] = []
    top5 = None
    valid = torch.arange(batch.input_ids.shape[1], device=batch.lengths.device)[None, :] < batch.lengths[:, None]
    bad = torch.zeros_like(valid)
    for k, logits in enumerate(draft.iter_steps(batch.aux(score.slots), batch.input_ids, steps,
                                                batch.lengths)):
        preds.append(logits.argmax(-1))
        bad |= ~torch.isfinite(logits.sum(-1))  # NaN or inf anywhere in the row
        if k == 0:
            top5 = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
    assert top5 is not None
    score.nonfinite += int((bad & valid.to(bad.device)).sum())
    has_next = batch.scored & (batch.next_ids >= 0)
    score.data.update([draft.draft_to_target(p) for p in preds], batch.next_ids, has_next)
    score.data.update_top5((draft.draft_to_target(top5) == batch.next_ids[..., None]).any(-1), has_next)
    if score.verifier is not None and verifier_targets is not None:
        score.verifier.update(preds, verifier_targets, batch.scored)
        score.verifier.update_top5((top5 == verifier_targets[..., None]).any(-1), batch.scored)
