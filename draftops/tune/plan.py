"""What a tune runs, in order, and what each step is estimated to cost against the budget.

``profile`` (test-drafter unrolled to K_max) → ``measure-0`` (the baseline), ``measure-K`` for the
configured K and for K_max (each: one server, one bench per concurrency) → ``predict`` (the cost
fitted, every K predicted) → ``confirm-K`` for each predicted best not measured yet (benched only where
it is best: the further points the fit is checked on) → ``answer`` (comparisons, engine arguments).
A step the budget cannot pay for is skipped and said; the measuring steps are needed, so a budget
too small for them is refused before anything runs.
"""
from __future__ import annotations

from typing import Any

from draftops.documents.tune import Args

PROFILE, PREDICT, ANSWER = "profile", "predict", "answer"
DEFAULT_BUDGET_S = 840.0           # the whole tune in under 15 minutes on the 2-core machine
DEFAULT_CONCURRENCY = (1, 4, 16)
DEFAULT_MAX_STEPS = 8
MAX_K = 32                         # far above any chain a draft accepts
MAX_CONCURRENCY = 256
# what a server start and a bench are assumed to cost until this tune has measured its own
SERVE_S, BENCH_S, PROFILE_S = 75.0, 35.0, 30.0
OUTPUT_LEN, REPEATS = 32, 3


def measure(k: int) -> str:
    return f"measure-{k}"


def confirm(k: int) -> str:
    return f"confirm-{k}"


def confirm_tree(steps: int, topk: int, draft_tokens: int) -> str:
    """The confirming step of an SGLang setting: ``confirm-K`` for a chain (topk 1), else
    ``confirm-S.k.N`` (steps, topk, draft tokens)."""
    return confirm(steps) if topk == 1 else f"confirm-{steps}.{topk}.{draft_tokens}"


def k_of(name: str) -> int | None:
    head, _, tail = name.rpartition("-")
    return int(tail) if head in ("measure", "confirm") and tail.isdigit() else None


def measured_ks(args: Args, configured: int) -> list[int]:
    """The K the cost is fitted on: the configured one (so it is always measured) and K_max, or 1 and
    K_max when the configured one is K_max or beyond."""
    low = configured if 1 <= configured < args.max_steps else 1
    return sorted({low, args.max_steps})


def steps(args: Args, configured: int) -> list[str]:
    return [PROFILE, measure(0), *(measure(k) for k in measured_ks(args, configured)), PREDICT, ANSWER]


def bench_settings(concurrency: int, demo: bool) -> dict[str, Any]:
    """One bench per concurrency: 4 waves of requests (at least 16 prompts) a repeat, 3 repeats after a
    warm-up (the comparison rule's interval rests on the repeats); the demo's own prompts for the demo."""
    settings: dict[str, Any] = {"prompts": max(16, 4 * concurrency), "concurrency": concurrency,
                                "output_len": OUTPUT_LEN, "repeats": REPEATS}
    if demo:
        settings["dataset"] = "demo"
    return settings


def estimate_s(name: str, benches: int, seen: dict[str, float]) -> float:
    """What a step is expected to take: this tune's own measured start and bench times when it has them."""
    if name == PROFILE:
        return seen.get("profile", PROFILE_S)
    if k_of(name) is None:
        return 1.0
    return seen.get("serve", SERVE_S) + benches * seen.get("bench", BENCH_S)


def needed_s(args: Args, configured: int) -> float:
    """The estimate for the steps a tune cannot do without (profile and the measuring servers)."""
    n = len(args.concurrency)
    return PROFILE_S + sum(estimate_s(measure(k), n, {}) for k in [0, *measured_ks(args, configured)])
