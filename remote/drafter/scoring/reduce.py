"""Put the ranks' counts of a torchrun together, exactly, so rank 0's report is one process's.

Every count is an integer and is summed (never a mean of means); the per-sample arrays the paired
comparison and its bootstrap read are put back in the order one process scores the samples (their
``Batch.positions``), and the chance level's folds are drawn from that order too; the layout scan's
per-slot norm sums are float64 added batch by batch in that order.  The ranks share the batches of
one plan (``batching.plan``), so each sample is scored in the batch one process puts it in and the
counts themselves are one process's (docs/drafter.md § torchrun).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import torch

from ..data.chattemplate import Scan
from ..launch.distributed import World
from ..load.vocabmap import Coverage
from .chance import ChanceLevel
from .metrics import StepCounts
from .score import LayoutScore

K = TypeVar("K")


def counts(parts: Sequence[StepCounts]) -> StepCounts:
    """One StepCounts of the ranks' ``parts``: totals summed, per-sample rows in position order."""
    out = StepCounts(parts[0].steps)
    for part in parts:
        for k in range(out.steps):
            out.full_correct[k] += part.full_correct[k]
            out.full_total[k] += part.full_total[k]
            out.cond_total[k] += part.cond_total[k]
            out.topk_total[k] += part.topk_total[k]
            out.topk_correct[k] = [a + b for a, b in zip(out.topk_correct[k], part.topk_correct[k], strict=True)]
        out.top5_correct += part.top5_correct
        out.top5_total += part.top5_total
        out.walk_rounds += part.walk_rounds
        out.walk_accepted += part.walk_accepted
        out.longest = max(out.longest, part.longest)
        for name in ("pos_correct", "pos_total"):
            mine, theirs = getattr(out, name), getattr(part, name)
            mine += [0] * (len(theirs) - len(mine))
            for b, v in enumerate(theirs):
                mine[b] += v
    rows = [entry for part in parts for entry in part._samples]
    if rows:
        places = torch.cat([p for p, _, _ in rows])
        order = torch.argsort(places, stable=True)
        out._samples = [(places[order], torch.cat([c for _, c, _ in rows])[order],
                         torch.cat([t for _, _, t in rows])[order])]
    return out


def score(parts: Sequence[LayoutScore]) -> LayoutScore:
    verifiers = [p.verifier for p in parts if p.verifier is not None]
    return LayoutScore(parts[0].slots, counts([p.data for p in parts]),
                       counts(verifiers) if len(verifiers) == len(parts) else None,
                       sum(p.nonfinite for p in parts))


def scores(parts: Sequence[dict[K, LayoutScore]]) -> dict[K, LayoutScore]:
    """Each key's scores summed over the ranks (every rank scores the same keys)."""
    return {key: score([p[key] for p in parts]) for key in parts[0]}


def chance(parts: Sequence[ChanceLevel]) -> ChanceLevel:
    return ChanceLevel.merged(list(parts))


def coverage_state(cov: Coverage) -> tuple[torch.Tensor, ...]:
    return tuple(t.cpu() for t in (cov.total, cov.inside, cov.inside_t2d, cov.missing))


def coverage(cov: Coverage, parts: Sequence[tuple[torch.Tensor, ...]]) -> None:
    """``cov`` (rank 0's) becomes the sum of the ranks' ``coverage_state``."""
    total, inside, inside_t2d, missing = (sum(p[i] for p in parts) for i in range(4))
    device = cov.total.device
    cov.total, cov.inside, cov.inside_t2d, cov.missing = (torch.as_tensor(t).to(device)
                                                          for t in (total, inside, inside_t2d, missing))


def norms(parts: Sequence[list[tuple[int, torch.Tensor]]], slots: int) -> torch.Tensor:
    """The scan's per-slot float64 norm sums, added batch by batch in position order (as one process).
    Each batch's sum is of float32 row norms in float64, exact for any realistic row count, so even
    batches made differently (a format without token counts in a header) add up to the same sums."""
    total = torch.zeros(slots, dtype=torch.float64)
    for _, part in sorted((entry for p in parts for entry in p), key=lambda e: e[0]):
        total += part
    return total


def chat_state(scan: Scan | None) -> dict[int, tuple[int, int, int, int | None]] | None:
    return dict(scan.facts) if scan is not None else None


def chat(scan: Scan, parts: Sequence[dict[int, tuple[int, int, int, int | None]] | None]) -> None:
    """``scan`` (rank 0's) takes the samples the other ranks saw, each once (a sample one rank scanned
    and another scored is seen by both)."""
    for part in parts:
        if part is not None:
            scan.absorb(part)


def gather_scan(world: World, scan: dict[tuple[int, ...], LayoutScore], norm_parts: list[tuple[int, torch.Tensor]],
                rows: int, slots: int) -> tuple[dict[tuple[int, ...], LayoutScore], torch.Tensor, int]:
    """The layout scan of every rank, on every rank (each needs the layouts it picks)."""
    parts = world.all_gather((scan, norm_parts, rows))
    return scores([p[0] for p in parts]), norms([p[1] for p in parts], slots), sum(p[2] for p in parts)
