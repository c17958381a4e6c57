"""A draft's acceptance profile: what tune's throughput prediction needs to know of the draft.

Conditional acceptance per draft depth (chain drafting, top-1) and, where the evaluator measured it,
per-depth top-k acceptance (what a tree of SGLang's ``--speculative-eagle-topk`` can reach). Built
from test-drafter's report (``metrics.served.<basis>.cond_acc``) or from a server's own counters.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from draftops.documents.drafter_report import Counts, DrafterReport


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

    @classmethod
    def from_report(cls, report: DrafterReport, basis: str | None = None) -> AcceptanceProfile | None:
        """The served layout's profile in test-drafter's report (``basis``: the report's own when
        None): conditional acceptance up to the first depth nothing reached, and the per-depth top-k
        rows where the evaluator counted them (``metrics.served.<basis>.topk``). None when the
        report has no served layout scored on that basis."""
        served = report.metrics.served
        basis = basis or report.metrics.basis
        counts = getattr(served, basis, None) if served is not None else None
        if counts is None or not counts.cond_acc or counts.cond_acc[0] is None:
            return None
        conditional = _leading(counts.cond_acc)
        return cls(conditional=conditional, topk=_topk_rows(counts),
                   samples=(counts.cond_total or [0])[0], source=f"report:{basis}")


def _leading(rates: list[float | None]) -> tuple[float, ...]:
    """The rates up to the first unknown one (a depth no row reached)."""
    out: list[float] = []
    for rate in rates:
        if rate is None:
            break
        out.append(rate)
    return tuple(out)


def _topk_rows(counts: Counts) -> tuple[tuple[float, ...], ...]:
    """Per depth, P(target within the top j) for j = 1..k, up to the first depth with no rows."""
    if counts.topk is None:
        return ()
    rows: list[tuple[float, ...]] = []
    for row in counts.topk.acc:
        known = _leading(row)
        if not known or len(known) != len(row):
            break
        rows.append(known)
    return tuple(rows)
