"""Score a draft on batches for one choice of aux slots, against data and verifier targets.

Data targets: the next token in the dump (target vocab); the draft's argmax is mapped through d2t,
so a token outside the draft vocab is always a miss (as when serving).  Verifier targets:
speculators' ``argmax(verifier_lm_head[t2d](verifier_norm(h_last)))`` over the draft vocab, where
h_last is the dump's final-layer slot (pre-norm).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..data.batching import Batch
from ..model.draft import Eagle3Draft, Unroll
from ..model.layers import rms_norm
from .metrics import TOPK, StepCounts


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
    whose logits held NaN/inf at some step they were computed (their argmax means nothing)."""

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


#: sees step 0's computed rows (flat indices ``b*N + t``) and the draft's argmax there (draft-vocab ids)
Observer = Callable[[torch.Tensor, torch.Tensor], None]
#: sees every step ``k``'s computed rows, their logits and the data chain's rows alive before the step
StepObserver = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], None]


def _show(k: int, rows: torch.Tensor, draft_ids: torch.Tensor, logits: torch.Tensor, alive: torch.Tensor,
          observe: Observer | None, observe_steps: StepObserver | None) -> None:
    """Step ``k``'s rows to the observers that asked for them (step 0 only, or every step)."""
    if k == 0 and observe is not None:
        observe(rows, draft_ids)
    if observe_steps is not None:
        observe_steps(k, rows, logits, alive)


def score_batch(draft: Eagle3Draft, batch: Batch, score: LayoutScore, steps: int,
                verifier_targets: torch.Tensor | None, prune: bool = True, observe: Observer | None = None,
                observe_steps: StepObserver | None = None) -> list[int]:
    """Run the TTT forward on ``batch`` with ``score.slots`` and add its counts to ``score``.

    Only what the counts can use is computed: step k runs the rows whose steps 0..k-1 were all
    right against at least one kind of target (a row that already failed both can add nothing to
    ``full_acc``/``cond_acc``) or whose targets at steps 0..k-1 were all within the draft's top
    TOPK (the per-depth top-k counts, what a tree can hold), and top-5 is taken at step 0 only.
    ``prune=False`` runs every row at every step (same counts; for timing the worst case, a draft that
    is always right).  Returns the number of rows computed at each step; ``observe`` (a cause check's
    measurement) is shown step 0's rows and draft tokens; ``observe_steps(k, rows, logits, alive)``
    sees each step's rows and logits with the data chain's rows still right before it
    (temperature.py).  Rows whose logits hold NaN/inf at any computed step are counted in
    ``score.nonfinite`` (valid positions only, each row once)."""
    bsz, n = batch.input_ids.shape
    valid = torch.arange(n, device=batch.lengths.device)[None, :] < batch.lengths[:, None]
    bad = torch.zeros(bsz * n, dtype=torch.bool, device=batch.input_ids.device)
    has_next = batch.scored & (batch.next_ids >= 0)
    chains = {"data": (batch.next_ids, has_next.clone())}
    if score.verifier is not None and verifier_targets is not None:
        chains["verifier"] = (verifier_targets, batch.scored.clone())
    trees = {kind: alive.clone() for kind, (_, alive) in chains.items()}  # prefix within the top TOPK
    masks = {"data": has_next, "verifier": batch.scored}
    preds: dict[str, list[torch.Tensor]] = {kind: [] for kind in chains}
    hits: dict[str, torch.Tensor] = {}
    computed: list[int] = []
    unroll = Unroll(draft, batch.aux(score.slots), batch.input_ids)
    for k in range(min(steps, n)):
        need = torch.zeros(bsz, n, dtype=torch.bool, device=has_next.device)
        for alive in (*(a for _, a in chains.values()), *trees.values()):
            need[:, : n - k] |= alive[:, : n - k]
        rows = need.view(-1).nonzero().squeeze(1)
        if prune and rows.numel() == 0:
            break
        logits = unroll.step(rows if prune else None)
        keep = slice(None) if prune else rows  # every row was run: keep the ones counted
        draft_ids = logits.argmax(-1)[keep]
        bad[rows] |= ~torch.isfinite(logits.sum(-1))[keep]  # NaN or inf anywhere in the row
        computed.append(int(logits.shape[0]))
        _show(k, rows, draft_ids, logits[keep], chains["data"][1], observe, observe_steps)
        in_target = draft.draft_to_target(draft_ids)
        ranked = logits.topk(min(max(5, TOPK), logits.shape[-1]), dim=-1).indices[keep]
        top5 = ranked[:, :5] if k == 0 else draft_ids
        for kind, (target, alive) in chains.items():
            pred = torch.full((bsz * n,), -2, dtype=torch.long, device=rows.device)  # -2 matches no target
            pred[rows] = in_target if kind == "data" else draft_ids
            pred = pred.view(bsz, n)
            preds[kind].append(pred)
            alive[:, : n - k] &= pred[:, : n - k] == target[:, k:]
            ranks = draft.draft_to_target(ranked[:, :TOPK]) if kind == "data" else ranked[:, :TOPK]
            counts = score.counts(kind)
            if counts is not None:
                _tree_step(counts, k, _spread(ranks, rows, bsz, n), target, trees[kind], masks[kind])
            if k == 0:
                best = draft.draft_to_target(top5) if kind == "data" else top5
                hit = torch.zeros(bsz * n, dtype=torch.bool, device=rows.device)
                hit[rows] = (best == target.reshape(-1)[rows, None]).any(-1)
                hits[kind] = hit.view(bsz, n)
    score.nonfinite += int((bad.view(bsz, n) & valid.to(bad.device)).sum())
    filler = torch.full((bsz, n), -2, dtype=torch.long, device=has_next.device)
    for per_step in preds.values():  # steps no row reached: nothing to count
        per_step += [filler] * (steps - len(per_step))
    score.data.update(preds["data"], batch.next_ids, has_next, batch.positions)
    score.data.update_top5(hits.get("data", torch.zeros_like(has_next)), has_next)
    if "verifier" in chains and score.verifier is not None:
        score.verifier.update(preds["verifier"], chains["verifier"][0], batch.scored, batch.positions)
        score.verifier.update_top5(hits.get("verifier", torch.zeros_like(has_next)), batch.scored)
    return computed


def _spread(ranks: torch.Tensor, rows: torch.Tensor, bsz: int, n: int) -> torch.Tensor:
    """[R, w] candidates of the computed ``rows`` as [B, N, w], -2 (matches no target) elsewhere."""
    full = torch.full((bsz * n, ranks.shape[-1]), -2, dtype=torch.long, device=rows.device)
    full[rows] = ranks
    return full.view(bsz, n, -1)


def _tree_step(counts: StepCounts, k: int, ranks: torch.Tensor, target: torch.Tensor, tree: torch.Tensor,
               mask: torch.Tensor) -> None:
    """Count step ``k``'s per-depth top-j hits on the rows whose prefix is within the top TOPK
    (``tree``, narrowed here to the rows whose step-k target is within it too)."""
    n = target.shape[1]
    hit = (ranks[:, : n - k] == target[:, k:, None]).long().cumsum(-1) > 0     # [B, n-k, w]: within top j
    if hit.shape[-1] < TOPK:                                                  # a vocabulary under TOPK wide
        hit = torch.cat([hit, hit[..., -1:].expand(*hit.shape[:2], TOPK - hit.shape[-1])], -1)
    counts.update_topk(k, hit, tree[:, : n - k] & mask[:, k:])
    tree[:, : n - k] &= hit[..., -1]
    tree[:, n - k:] = False
