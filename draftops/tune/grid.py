"""The settings a tune predicts for the host's engine and how a bench is keyed to one of them.

A setting is ``(k, topk, draft_tokens)``: on vLLM ``(K, 1, K)`` (num_speculative_tokens, a chain); on
SGLang the three flags ``(steps, topk, draft tokens)``, the root counted in draft tokens as SGLang
counts it; ``(0, 1, 0)`` is no draft. The round's cost is a line in the drafted tokens verified per
sequence besides the target's own (vLLM's K, SGLang's draft tokens − 1), so one fitted cost serves
both engines' predictions (docs/tune.md § SGLang trees).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from draftops.documents.tune import Step
from draftops.tune import predict, trees
from draftops.tune.cost import RoundCost
from draftops.tune.profile import AcceptanceProfile

Setting = tuple[int, int, int]
BASELINE: Setting = (0, 1, 0)


def verified(setting: Setting, engine: str | None) -> int:
    """Drafted tokens verified per sequence per round: the cost's x."""
    k, _, n = setting
    if k == 0:
        return 0
    return max(n - 1, 1) if engine == "sglang" else k


def of_step(step: Step, k: int, engine: str | None) -> Setting:
    """The setting a measuring or confirming step asked for."""
    if k == 0:
        return BASELINE
    if engine == "sglang":
        return (k, step.topk, step.draft_tokens or k + 1)
    return (k, 1, k)


def of_bench(step: Step, k: int, engine: str | None, bench: dict[str, Any]) -> Setting:
    """The setting a bench measured: on SGLang what the server reported (/get_server_info; SGLang may
    serve another than asked), else what the step asked for."""
    served = bench.get("served")
    if isinstance(served, list) and len(served) == 3 and all(isinstance(v, int) and v > 0 for v in served):
        return (served[0], served[1], served[2])
    return of_step(step, k, engine)


def of_prediction(p: predict.Prediction) -> Setting:
    return (p.k, p.topk, p.draft_tokens)


def label(k: int, topk: int, draft_tokens: int, engine: str | None) -> str:
    """``no draft``, ``K=3`` (vLLM) or ``3/2/6`` (SGLang's steps/topk/draft tokens)."""
    if k == 0:
        return "no draft"
    return f"{k}/{topk}/{draft_tokens}" if engine == "sglang" else f"K={k}"


def predictions(profile: AcceptanceProfile, cost: RoundCost, max_steps: int, concurrencies: Iterable[int],
                engine: str | None) -> list[predict.Prediction]:
    """Every setting at every concurrency: vLLM's K = 1..max_steps, or SGLang's trees (trees.settings:
    every steps up to max_steps with topk 1, 2, 4 and the draft-token budgets the tree can fill)."""
    if engine != "sglang":
        return predict.predict(profile, cost, range(1, max_steps + 1), concurrencies)
    grid = trees.settings(max_steps)
    out: list[predict.Prediction] = []
    for c in sorted(set(concurrencies)):
        base = cost.baseline_tok_s(c)
        out.append(predict.Prediction(c, 0, 1.0, base, 1.0, 1.0, topk=1, draft_tokens=0))
        for s in grid:
            n = s.effective_draft_tokens
            tok_s = trees.tok_s(profile, s, cost, c)
            out.append(predict.Prediction(c, s.steps, trees.accept_length(profile, s), tok_s, tok_s / base,
                                          cost.break_even(c, n - 1), topk=s.topk, draft_tokens=n))
    return out
