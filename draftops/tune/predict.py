"""Throughput predicted for every vLLM ``num_speculative_tokens`` at every concurrency, the best per
concurrency, where speculation stops paying, and the engine arguments that say so.

Pure functions: an ``AcceptanceProfile`` gives the accept length L(K) of a chain of K draft tokens, a
``RoundCost`` the seconds of a round verifying K per sequence at concurrency c; throughput is
``c × L(K) / round(c, K)`` and the baseline's ``c / step(c)``. K = 0 is no speculation.
"""
from __future__ import annotations

import json
import shlex
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from draftops.tune.cost import RoundCost
from draftops.tune.profile import AcceptanceProfile


@dataclass(frozen=True)
class Prediction:
    """One setting at one concurrency: ``k`` 0 is the baseline (no draft)."""

    concurrency: int
    k: int
    accept_length: float
    tok_s: float
    speedup: float              # over the baseline at this concurrency
    break_even: float           # the accept length at which this K is as fast as no draft
    topk: int = 1               # vLLM drafts a chain
    draft_tokens: int = 0       # verified per sequence per round: K for a chain

    @property
    def label(self) -> str:
        return "no draft" if self.k == 0 else f"K={self.k}"


def predict(profile: AcceptanceProfile, cost: RoundCost, ks: Iterable[int],
            concurrencies: Iterable[int]) -> list[Prediction]:
    """Every K of ``ks`` (and the baseline, K = 0) at every concurrency, in (c, K) order."""
    out = []
    for c in sorted(set(concurrencies)):
        base = cost.baseline_tok_s(c)
        for k in sorted({0, *ks}):
            length = profile.accept_length(k) if k else 1.0
            tok_s = cost.tok_s(c, k, length)
            out.append(Prediction(c, k, length, tok_s, tok_s / base, cost.break_even(c, k) if k else 1.0,
                                  draft_tokens=k))
    return out


def best(predictions: Iterable[Prediction]) -> dict[int, Prediction]:
    """The fastest predicted setting per concurrency (the baseline among them); a tie goes to fewer K."""
    top: dict[int, Prediction] = {}
    for p in predictions:
        held = top.get(p.concurrency)
        if held is None or p.tok_s > held.tok_s or (p.tok_s == held.tok_s and p.k < held.k):
            top[p.concurrency] = p
    return dict(sorted(top.items()))


def off_from(chosen: dict[int, Prediction]) -> int | None:
    """The lowest concurrency from which on (every one measured above it too) no draft is best; None
    when speculation pays at the highest concurrency."""
    off = None
    for c in sorted(chosen, reverse=True):
        if chosen[c].k != 0:
            break
        off = c
    return off


def schedule(profile: AcceptanceProfile, cost: RoundCost, ks: Sequence[int],
             max_batch: int) -> list[tuple[int, int, int]]:
    """vLLM's ``num_speculative_tokens_per_batch_size``: inclusive batch-size ranges and their best K
    (0: no speculation), from each batch size 1..``max_batch`` predicted on the interpolated cost;
    past the largest measured concurrency the last range runs on (vLLM carries it forward)."""
    top = max(cost.concurrencies)
    last = min(max_batch, top)
    per = [best(predict(profile, cost, ks, [b]))[b].k for b in range(1, last + 1)]
    ranges: list[tuple[int, int, int]] = []
    for b, k in enumerate(per, start=1):
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], b, k)
        else:
            ranges.append((b, b, k))
    start, _, k = ranges[-1]
    ranges[-1] = (start, max(max_batch, last), k)
    return ranges


def speculative_config(draft: str, ranges: Sequence[tuple[int, int, int]]) -> dict[str, object] | None:
    """vLLM 0.32's ``--speculative-config`` for the schedule: ``num_speculative_tokens`` is the largest K
    (the schedule's values are capped by it); one range needs no schedule. None: never speculate."""
    most = max((k for _, _, k in ranges), default=0)
    if most == 0:
        return None
    config: dict[str, object] = {"method": "eagle3", "model": draft, "num_speculative_tokens": most}
    if len(ranges) > 1:
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in ranges]
    return config


def engine_args(draft: str, ranges: Sequence[tuple[int, int, int]]) -> list[str]:
    """The vLLM arguments to add to ``vllm serve TARGET`` (empty: serve without a draft)."""
    config = speculative_config(draft, ranges)
    return [] if config is None else ["--speculative-config", json.dumps(config, separators=(",", ":"))]


def engine_line(draft: str, ranges: Sequence[tuple[int, int, int]]) -> str:
    """The arguments as one pasteable shell line."""
    args = engine_args(draft, ranges)
    return " ".join(shlex.quote(a) for a in args) if args else "(no --speculative-config: serve without a draft)"
