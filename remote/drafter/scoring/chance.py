"""The chance level a draft must beat before its layouts can be told apart.

A draft always sees the current token x_t through its embedding; the aux hidden states are what
the layout diagnosis is about.  So "chance" is the step-0 accuracy of the best guesses that ignore
the hidden states, measured on the same scored rows and targets as the draft:

* constant: always the most frequent target the draft can emit (at least 1/draft_vocab, and what
  a draft that learned only the output prior scores);
* current token: for each x_t, the target most often seen after it.  Fitted on one half of the
  samples and scored on the other (and the other way round), so a large vocabulary with few
  samples per token does not make it look better than it is (in-sample it would memorise).

The larger of the two is the chance level.  A draft whose best layout barely beats it is not using
the hidden states enough for the layouts to differ (barely trained, or trained for another target).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class ChanceLevel:
    """Counts of (current token, target) pairs on the step-0 scored rows, in two folds of samples."""

    vocab: int  # size of the target id space (target vocab for data targets, draft vocab for verifier)
    emit: torch.Tensor  # [vocab] bool: targets the draft can produce
    # per batch: (positions [B], keys [M] = current * vocab + target, owner [M]: the key's sample in the batch)
    _entries: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list, repr=False)
    _folds_of_entries: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @classmethod
    def merged(cls, parts: list[ChanceLevel]) -> ChanceLevel:
        """The counts of a torchrun's ranks as one (reduce.py): the folds are drawn by position, so the
        entries of every rank together fold as one process's do."""
        return cls(parts[0].vocab, parts[0].emit, [entry for part in parts for entry in part._entries])

    def update(self, current: torch.Tensor, target: torch.Tensor, scored: torch.Tensor,
               positions: torch.Tensor | None = None) -> None:
        """``current``/``target`` [B, N] ids, ``scored`` [B, N] bool; ``positions`` [B] the samples'
        places in the pass's order.  The i-th sample by position is in fold i % 2 (decided when the counts are read,
        so that the ranks of a torchrun, merged by reduce.py, fold as one process does)."""
        b, n = current.shape
        owner = torch.arange(b, device=current.device)[:, None].expand(b, n)[scored]
        keys = current[scored].to(torch.long) * self.vocab + target[scored].to(torch.long)
        places = positions.cpu() if positions is not None else self._next_places(b)
        self._entries.append((places, keys.cpu(), owner.cpu()))
        self._folds_of_entries = None

    def _next_places(self, b: int) -> torch.Tensor:
        start = int(max((int(p.max()) for p, _, _ in self._entries if p.numel()), default=-1)) + 1
        return torch.arange(start, start + b)

    def _folds(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys of each fold: sorted by position once per set of counts (both guesses read them)."""
        if self._folds_of_entries is None:
            self._folds_of_entries = self._fold()
        return self._folds_of_entries

    def _fold(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._entries:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, empty
        places = torch.cat([p for p, _, _ in self._entries])
        ordinal = torch.empty_like(places)
        ordinal[torch.argsort(places, stable=True)] = torch.arange(places.numel())
        offsets = torch.tensor([0] + [p.numel() for p, _, _ in self._entries[:-1]]).cumsum(0)
        keys = torch.cat([k for _, k, _ in self._entries])
        owners = torch.cat([o + int(off) for (_, _, o), off in zip(self._entries, offsets, strict=True)])
        fold = ordinal[owners] % 2
        return keys[fold == 0], keys[fold == 1]

    def constant(self) -> tuple[float | None, int | None]:
        """(accuracy of always guessing the most frequent emittable target, that target)."""
        counts = torch.bincount(torch.cat(self._folds()) % self.vocab, minlength=self.vocab)
        total = int(counts.sum())
        if not total:
            return None, None
        masked = torch.where(self.emit, counts, torch.full_like(counts, -1))
        best = int(masked.argmax())
        return int(counts[best]) / total, best

    def current_token(self) -> float | None:
        """Cross-fitted accuracy of guessing the target from the current token alone."""
        folds = self._folds()
        total = sum(int(f.numel()) for f in folds)
        if not total:
            return None
        right = 0
        for f in (0, 1):
            guess, fallback = self._guesses(folds[1 - f])
            cur, tgt = folds[f] // self.vocab, folds[f] % self.vocab
            right += int((self._lookup(guess, fallback, cur) == tgt).sum())
        return right / total

    def _guesses(self, keys: torch.Tensor) -> tuple[tuple[torch.Tensor, torch.Tensor], int]:
        """Per current token (sorted), its most frequent emittable target; and the overall one."""
        keys = keys[self.emit[keys % self.vocab]]
        if not keys.numel():
            return (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)), -1
        pairs, counts = torch.unique(keys, return_counts=True)  # ascending: by token, then target
        order = torch.argsort(-counts, stable=True)
        order = order[torch.argsort(pairs[order] // self.vocab, stable=True)]  # token asc, count desc
        cur = pairs[order] // self.vocab
        first = torch.ones_like(cur, dtype=torch.bool)
        first[1:] = cur[1:] != cur[:-1]
        overall = torch.bincount(keys % self.vocab, minlength=self.vocab)
        return (cur[first], (pairs[order] % self.vocab)[first]), int(overall.argmax())

    @staticmethod
    def _lookup(guess: tuple[torch.Tensor, torch.Tensor], fallback: int, cur: torch.Tensor) -> torch.Tensor:
        tokens, targets = guess
        if not tokens.numel():
            return torch.full_like(cur, fallback)
        pos = torch.searchsorted(tokens, cur).clamp(max=tokens.numel() - 1)
        return torch.where(tokens[pos] == cur, targets[pos], torch.full_like(cur, fallback))
