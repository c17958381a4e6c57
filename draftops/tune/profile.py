"""A draft's acceptance profile: what tune's throughput prediction needs to know of the draft.

Conditional acceptance per draft depth (chain drafting, top-1) and, where the evaluator measured it,
per-depth top-k acceptance (what a tree of SGLang's ``--speculative-eagle-topk`` can reach). Built
from test-drafter's report (``metrics.served.<basis>.cond_acc``) or from a server's own counters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class AcceptanceProfile:
    """``conditional[i]``: P(the draft's token at depth i+1 is accepted | depths 1..i were);
    ``topk[i][k-1]``: P(the target's token is among the draft's top k at depth i+1 | the prefix was
    accepted), empty where unknown; ``samples``: positions behind depth 1; ``source``: where the
    figures come from (``report:verifier``, ``server:vllm`` …)."""

    conditional: tuple[float, ...]
    topk: tuple[tuple[float, ...], ...] = ()
    samples: int = 0
    source: str = "report"

    def __post_init__(self) -> None:
        for p in (*self.conditional, *(q for row in self.topk for q in row)):
            if not (math.isfinite(p) and 0.0 <= p <= 1.0):
                raise ValueError(f"an acceptance rate must be a number from 0 to 1, not {p!r}")

    @property
    def max_depth(self) -> int:
        return len(self.conditional)

    def accept_length(self, k: int) -> float:
        """Expected tokens per verification round with ``k`` chained draft tokens (the bonus token
        included): 1 + Σ_{d=1..k} Π_{i<d} conditional[i]; depths past the profile repeat its last rate."""
        if k < 0:
            raise ValueError(f"k must be 0 or more, not {k}")
        total, alive = 1.0, 1.0
        for d in range(k):
            rate = self.conditional[min(d, self.max_depth - 1)] if self.conditional else 0.0
            alive *= rate
            total += alive
        return total
