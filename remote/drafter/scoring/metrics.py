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

#: widest top-k the evaluator counts per depth (SGLang's --speculative-eagle-topk is rarely above 4)
TOPK = 4


@dataclass
class StepCounts:
    """Correct/total counts per TTT step for one kind of target."""

    steps: int
    full_correct: list[int] = field(default_factory=list)
    full_total: list[int] = field(default_factory=list)
    cond_total: list[int] = field(default_factory=list)
    top5_correct: int = 0
    top5_total: int = 0
    topk_correct: list[list[int]] = field(default_factory=list)  # [step][j-1]: target in the top j (see topk)
    topk_total: list[int] = field(default_factory=list)          # [step]: rows whose prefix is in the top TOPK
    walk_rounds: int = 0      # decoding walk (see ``walk``): verify rounds with all K rows scored
    walk_accepted: int = 0    # drafted tokens those rounds accepted
    # step-0 counts by position-in-sequence bucket (``position_bucket``): decay with position is visible
    pos_correct: list[int] = field(default_factory=list)
    pos_total: list[int] = field(default_factory=list)
    longest: int = 0          # tokens in the longest sample scored (its last scored row's target included)
    # per batch: (positions [B], correct [B, K], total [B, K]); reduce.py merges ranks' by position
    _samples: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        for name in ("full_correct", "full_total", "cond_total", "topk_total"):
            if not getattr(self, name):
                setattr(self, name, [0] * self.steps)
        if not self.topk_correct:
            self.topk_correct = [[0] * TOPK for _ in range(self.steps)]

    def update(self, preds: list[torch.Tensor], target: torch.Tensor, scored: torch.Tensor,
               positions: torch.Tensor | None = None) -> None:
        """``preds``: per step [B, N] ids in the same id space as ``target`` [B, N];
        ``scored`` [B, N] bool marks rows whose target counts (loss mask and existence);
        ``positions`` [B]: the samples' places in the pass's order (``Batch.positions``)."""
        b, n = target.shape
        prev = scored.clone()
        correct = torch.zeros(b, self.steps, dtype=torch.long, device=target.device)
        total = torch.zeros_like(correct)
        chain = torch.zeros(b, n, dtype=torch.long, device=target.device)   # leading right steps of row t
        for k, pred in enumerate(preds):
            if k >= n:
                break
            right = (pred[:, : n - k] == target[:, k:]) & prev[:, : n - k]
            self.cond_total[k] += int(prev[:, : n - k].sum())
            prev[:, : n - k] = right
            prev[:, n - k:] = False
            chain += prev
            mask = scored[:, k:]
            correct[:, k] = (right & mask).sum(1)
            total[:, k] = mask.sum(1)
            if k == 0:
                self._by_position((right & mask).sum(0), mask.sum(0))
        rounds, accepted = walk(chain.cpu(), scored.cpu(), self.steps)
        self.walk_rounds += rounds
        self.walk_accepted += accepted
        correct, total = correct.cpu(), total.cpu()
        places = positions.cpu() if positions is not None else torch.arange(b)
        self._samples.append((places, correct, total))
        for k in range(self.steps):
            self.full_correct[k] += int(correct[:, k].sum())
            self.full_total[k] += int(total[:, k].sum())

    def _by_position(self, right: torch.Tensor, total: torch.Tensor) -> None:
        """Add step-0 counts per row (``right``/``total`` [N], row t drafts the sample's token t + 2)
        into their position buckets."""
        n = int(total.shape[0])
        if n == 0:
            return
        buckets = position_bucket(torch.arange(n) + 2)
        seen = total.nonzero()
        if seen.numel():
            self.longest = max(self.longest, int(seen.max()) + 3)
        size = int(buckets[-1]) + 1
        for name, values in (("pos_correct", right), ("pos_total", total)):
            summed = torch.bincount(buckets, weights=values.cpu().double(), minlength=size).long().tolist()
            have = getattr(self, name)
            have += [0] * (size - len(have))
            for b, v in enumerate(summed):
                have[b] += v

    def by_position(self) -> list[dict[str, Any]]:
        """Step-0 accuracy per position bucket (positions are token indices in the sample), with counts."""
        return [{"from": bucket_start(b), "to": bucket_start(b + 1) - 1, "correct": c, "total": t,
                 "acc": _ratio(c, t)} for b, (c, t) in enumerate(zip(self.pos_correct, self.pos_total, strict=True))
                if t]

    def per_sample(self) -> PerSample:
        """Counts of every sample seen so far, in the order they were scored."""
        if not self._samples:
            empty = torch.zeros(0, self.steps, dtype=torch.long)
            return PerSample(empty, empty.clone())
        return PerSample(torch.cat([c for _, c, _ in self._samples]), torch.cat([t for _, _, t in self._samples]))

    def update_top5(self, hits: torch.Tensor, scored: torch.Tensor) -> None:
        self.top5_correct += int((hits & scored).sum())
        self.top5_total += int(scored.sum())

    def update_topk(self, step: int, hits: torch.Tensor, counted: torch.Tensor) -> None:
        """``hits`` [B, M, TOPK] bool: the target within the draft's top j+1 at ``step``; ``counted``
        [B, M]: the rows whose targets at steps 0..step-1 were all within the top TOPK (a tree of
        SGLang's ``--speculative-eagle-topk`` up to TOPK can hold that prefix) and whose target exists."""
        self.topk_total[step] += int(counted.sum())
        for j in range(hits.shape[-1]):
            self.topk_correct[step][j] += int((hits[..., j] & counted).sum())

    def topk(self) -> dict[str, Any]:
        """Per depth (step+1) and j = 1..TOPK: P(target in the draft's top j | prefix in the top TOPK)."""
        return {"k": TOPK, "condition": f"prefix within the top {TOPK}",
                "correct": self.topk_correct, "total": self.topk_total,
                "acc": [[_ratio(c, t) for c in row] for row, t in zip(self.topk_correct, self.topk_total, strict=True)]}

    def full_acc(self) -> list[float | None]:
        return [_ratio(c, t) for c, t in zip(self.full_correct, self.full_total, strict=True)]

    def cond_acc(self) -> list[float | None]:
        return [_ratio(c, t) for c, t in zip(self.full_correct, self.cond_total, strict=True)]

    def accept_length(self, steps: int) -> float:
        """1 + sum_{k<steps} full_acc_k: tokens per verify averaged over positions (speculators' figure)."""
        return 1.0 + sum(a or 0.0 for a in self.full_acc()[:steps])

    def walked_accept_length(self) -> float | None:
        """Tokens per verify of a greedy decoder walking this text (``walk``): what a server measures."""
        return 1.0 + self.walk_accepted / self.walk_rounds if self.walk_rounds else None

    def to_dict(self) -> dict[str, Any]:
        return {"positions": self.full_total[0] if self.full_total else 0,
                "full_acc": self.full_acc(), "cond_acc": self.cond_acc(),
                "full_correct": self.full_correct, "full_total": self.full_total,
                "cond_total": self.cond_total, "top5_acc_0": _ratio(self.top5_correct, self.top5_total),
                "by_position": self.by_position(),
                "topk": self.topk(),
                "walk": {"rounds": self.walk_rounds, "accepted": self.walk_accepted,
                         "accept_length": self.walked_accept_length()}}


#: the first bucket holds token positions 0..FIRST_BUCKET-1; each later one doubles (8-15, 16-31, ...)
FIRST_BUCKET = 8


def position_bucket(positions: torch.Tensor) -> torch.Tensor:
    """The bucket of each token position: 0 below FIRST_BUCKET, then one per doubling."""
    first = FIRST_BUCKET.bit_length() - 1
    logs = torch.floor(torch.log2(positions.clamp(min=1).double())).long()
    return (logs - first + 1).clamp(min=0)


def bucket_start(bucket: int) -> int:
    return 0 if bucket == 0 else FIRST_BUCKET << (bucket - 1)


def walk(chain: torch.Tensor, scored: torch.Tensor, steps: int) -> tuple[int, int]:
    """Replay greedy speculative decoding over the text: (verify rounds, accepted drafted tokens).

    A server does not draft from every position: a round drafting from row t accepts its leading
    right steps a = ``chain[t]`` and the verifier adds one token, so the next round drafts from
    row t + a + 1. Rounds therefore skip through easy stretches and pile up in hard ones, and the
    accept length a server reports (tokens per round) sits below the average over positions
    (``accept_length``) whenever the draft is right in runs. A scored row's input token is a
    generated one, so a stretch's first scored row drafts the token after the one the prefill made,
    as a server's first round does. Rounds start only where all K drafted rows are scored (a round
    crossing the stretch's end would be cut short); the walk jumps to the next such row after a gap."""
    b, n = chain.shape
    if n == 0 or steps < 1:
        return 0, 0
    ok = scored.clone()
    for k in range(1, steps):          # rows t..t+K-1 all scored
        ok[:, : n - k] &= scored[:, k:]
        ok[:, n - k:] = False
    index = torch.arange(n).expand(b, n)
    start = torch.where(ok, index, torch.full_like(index, n))
    start = torch.cat([start.flip(1).cummin(1).values.flip(1), torch.full((b, 1), n, dtype=torch.long)], 1)
    rounds = accepted = 0
    for nxt, gains in zip(start.tolist(), chain.tolist(), strict=True):   # plain ints: ~50x faster than
        t = nxt[0]                                                       # a tensor op per round
        while t < n:
            a = gains[t]
            rounds += 1
            accepted += a
            t = nxt[min(t + a + 1, n)]
    return rounds, accepted


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None
