"""Teacher-forced TTT accuracies with the semantics of speculators' ``compute_metrics``, as counts.

For start row t and step k the draft's prediction is compared with the target of row t+k (a row
is scored when the loss mask at t+k is set); ``full_acc_k`` counts rows whose steps 0..k were all
right (over rows whose t+k is scored), ``cond_acc_k`` divides the same count by the rows still
right after step k-1.  Counts are summed over batches and divided at the end (a token-weighted
micro average, like speculators >= 0.4).  Shifts never cross samples: each sample is its own
padded row.  The same counts are also kept per sample, for the paired layout comparison
(stats.py), whose unit is the sample.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .stats import PerSample


@dataclass
class StepCounts:
    """Correct/total counts per TTT step for one kind of target."""

    steps: int
    full_correct: list[int] = field(default_factory=list)
    full_total: list[int] = field(default_factory=list)
    cond_total: list[int] = field(default_factory=list)
    top5_correct: int = 0
    top5_total: int = 0
    _samples: list[tuple[torch.Tensor, torch.Tensor]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        for name in ("full_correct", "full_total", "cond_total"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.steps)

    def update(self, preds: list[torch.Tensor], target: torch.Tensor, scored: torch.Tensor) -> None:
        """``preds``: per step [B, N] ids in the same id space as ``target`` [B, N];
        ``scored`` [B, N] bool marks rows whose target counts (loss mask and existence)."""
        b, n = target.shape
        prev = scored.clone()
        correct = torch.zeros(b, self.steps, dtype=torch.long, device=target.device)
        total = torch.zeros_like(correct)
        for k, pred in enumerate(preds):
            if k >= n:
                break
            right = (pred[:, : n - k] == target[:, k:]) & prev[:, : n - k]
            self.cond_total[k] += int(prev[:, : n - k].sum())
            prev[:, : n - k] = right
            mask = scored[:, k:]
            correct[:, k] = (right & mask).sum(1)
            total[:, k] = mask.sum(1)
        correct, total = correct.cpu(), total.cpu()
        self._samples.append((correct, total))
        for k in range(self.steps):
            self.full_correct[k] += int(correct[:, k].sum())
            self.full_total[k] += int(total[:, k].sum())

    def per_sample(self) -> PerSample:
        """Counts of every sample seen so far, in the order they were scored."""
        if not self._samples:
            empty = torch.zeros(0, self.steps, dtype=torch.long)
            return PerSample(empty, empty.clone())
        return PerSample(torch.cat([c for c, _ in self._samples]), torch.cat([t for _, t in self._samples]))

    def update_top5(self, hits: torch.Tensor, scored: torch.Tensor) -> None:
        self.top5_correct += int((hits & scored).sum())
        self.top5_total += int(scored.sum())

    def full_acc(self) -> list[float | None]:
        return [_ratio(c, t) for c, t in zip(self.full_correct, self.full_total, strict=True)]

    def cond_acc(self) -> list[float | None]:
        return [_ratio(c, t) for c, t in zip(self.full_correct, self.cond_total, strict=True)]

    def accept_length(self, steps: int) -> float:
        """1 + sum_{k<steps} full_acc_k: expected tokens per verify under greedy decoding."""
        return 1.0 + sum(a or 0.0 for a in self.full_acc()[:steps])

    def to_dict(self) -> dict[str, Any]:
        return {"positions": self.full_total[0] if self.full_total else 0,
                "full_acc": self.full_acc(), "cond_acc": self.cond_acc(),
                "full_correct": self.full_correct, "full_total": self.full_total,
                "cond_total": self.cond_total, "top5_acc_0": _ratio(self.top5_correct, self.top5_total)}


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None
