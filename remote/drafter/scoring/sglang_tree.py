"""Brute-force count of SGLang's tree acceptance on dumps: the check of tune's tree prediction.

For every start row t of a batch whose next ``steps`` targets exist, the draft builds SGLang's tree
as SGLang does (``select_top_k_tokens`` / ``organize_draft_results``: the root's top-k children by
the draft's softmax, then per depth the k best nodes by the product of probabilities along the path
expanded into k children each, and the ``draft_tokens - 1`` best of all candidates kept), each
branch run with its own tokens (the draft is fed the branch's tokens, not the text's); the round
accepts the longest path of kept nodes that matches the targets (the dump's next tokens), plus the
bonus token. Nothing here models anything: it is the count the model in ``draftops/tune/trees.py``
is checked against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.batching import Batch
from ..model.draft import Eagle3Draft, Unroll


@dataclass
class Tree:
    """Candidates of one round per start row: ``tokens``/``scores``/``parent`` [R, C] (parent -1: the root)."""

    tokens: torch.Tensor
    scores: torch.Tensor
    parent: torch.Tensor


def starts(batch: Batch, steps: int) -> torch.Tensor:
    """[R, 2] (sample, row) of the rows whose targets at depths 1..steps all exist and are scored."""
    ok = batch.scored & (batch.next_ids >= 0)
    n = ok.shape[1]
    full = ok.clone()
    for k in range(1, steps):
        full[:, : n - k] &= ok[:, k:]
        full[:, n - k:] = False
    return full.nonzero()


def _logits(draft: Eagle3Draft, batch: Batch, slots: tuple[int, ...], where: torch.Tensor,
            paths: torch.Tensor) -> torch.Tensor:
    """Draft logits [P, Vd] after each path: row ``where[p]`` with the draft fed ``paths[p]`` [P, d]
    (target-vocab ids) at rows t+1..t+d, i.e. depth d+1 of that branch."""
    depth = paths.shape[1]
    ids = batch.input_ids[where[:, 0]].clone()
    aux = batch.aux(slots)[where[:, 0]]
    t = where[:, 1]
    for j in range(depth):
        ids[torch.arange(ids.shape[0]), t + 1 + j] = paths[:, j]
    n = ids.shape[1]
    unroll = Unroll(draft, aux, ids)     # every row, one batched step each (a subset runs per sample)
    logits = unroll.step()
    for _ in range(depth):
        logits = unroll.step()
    return logits[torch.arange(ids.shape[0]) * n + t]


def build(draft: Eagle3Draft, batch: Batch, slots: tuple[int, ...], where: torch.Tensor,
          steps: int, topk: int) -> Tree:
    """SGLang's candidates for the start rows ``where`` ([R, 2]): k + (steps-1)·k² per row."""
    r = where.shape[0]
    probs = torch.softmax(_logits(draft, batch, slots, where, torch.zeros(r, 0, dtype=torch.long)).float(), -1)
    p, ids = probs.topk(topk, -1)                                   # [R, k]
    tokens, scores = [draft.draft_to_target(ids)], [p]
    parents = [torch.full((r, topk), -1, dtype=torch.long)]
    beam_scores, beam_nodes = p, torch.arange(topk).expand(r, topk)
    beam_paths = tokens[0][:, :, None]                              # [R, k, depth]
    offset = topk
    for _ in range(1, steps):
        flat = beam_paths.reshape(r * topk, -1)
        logits = _logits(draft, batch, slots, where.repeat_interleave(topk, 0), flat)
        p, ids = torch.softmax(logits.float(), -1).topk(topk, -1)   # [R*k, k]
        expand = (beam_scores[:, :, None] * p.view(r, topk, topk)).reshape(r, -1)   # [R, k²]
        child = draft.draft_to_target(ids).view(r, topk * topk)
        tokens.append(child)
        scores.append(expand)
        parents.append(beam_nodes.repeat_interleave(topk, 1))
        beam_scores, pick = expand.topk(topk, -1)
        beam_nodes = offset + pick
        parent_of = pick // topk
        beam_paths = torch.cat([beam_paths.gather(1, parent_of[:, :, None].expand(-1, -1, beam_paths.shape[2])),
                                child.gather(1, pick)[:, :, None]], 2)
        offset += topk * topk
    return Tree(torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(parents, 1))


def accepted(tree: Tree, targets: torch.Tensor, draft_tokens: int) -> list[int]:
    """Tokens each round yields (1 + the longest matching path of the kept nodes): ``targets``
    [R, steps] are the text's next tokens at depths 1..steps."""
    keep = tree.scores.topk(draft_tokens - 1, -1).indices
    out = []
    for row in range(tree.tokens.shape[0]):
        kept = set(keep[row].tolist())
        node, length = -1, 0
        for depth in range(targets.shape[1]):
            want = int(targets[row, depth])
            match = [c for c in kept if int(tree.parent[row, c]) == node and int(tree.tokens[row, c]) == want]
            if not match:
                break
            node, length = match[0], length + 1
        out.append(1 + length)
    return out


def count(draft: Eagle3Draft, batch: Batch, slots: tuple[int, ...], steps: int, topk: int,
          draft_tokens: int) -> list[tuple[int, int]]:
    """(sample, tokens yielded) of every round started in ``batch``."""
    where = starts(batch, steps)
    if where.shape[0] == 0:
        return []
    tree = build(draft, batch, slots, where, steps, topk)
    idx = where[:, 1:2] + torch.arange(steps)[None, :]
    targets = batch.next_ids[where[:, 0:1].expand(-1, steps), idx]
    lengths = accepted(tree, targets, draft_tokens if topk > 1 else steps + 1)
    return list(zip(batch.positions[where[:, 0]].tolist(), lengths, strict=True))
