"""``runs/<tune-id>/tune.json`` (schema ``draftops.tune/1``): what `invoke tune` was asked, each step's
state and runs, the servers it started, and what it found: the acceptance profile, the fitted round
cost, every predicted (and measured) point, the best setting per concurrency and the engine arguments.

One model for the state a ``--resume`` continues from and the document the report and the doctor read
(``draftops/tune/state.py`` loads it, bounded, and writes it whole after every change)."""
from __future__ import annotations

from typing import Any

from draftops.documents import Document, Part, StepsOf


class Args(Part):
    """What the tune was asked (``invoke tune`` flags)."""

    draft: str
    data: str | None = None
    profile: str | None = None
    concurrency: list[int] = [1, 4, 16]
    max_steps: int = 8
    budget_s: float = 840.0
    port: int | None = None


class Step(Part):
    """One step: ``profile``, ``measure-K`` (serve with K draft tokens, 0 the baseline, bench at each
    concurrency), ``predict``, ``confirm-K`` (serve the predicted best, bench where it is best), ``answer``."""

    name: str
    state: str = "pending"           # pending, running, done, skipped, failed, stopped
    k: int | None = None
    topk: int = 1                    # SGLang's --speculative-eagle-topk of a confirm step (1: a chain)
    draft_tokens: int | None = None  # SGLang's --speculative-num-draft-tokens of a confirm step
    concurrencies: list[int] = []
    started: str | None = None
    ended: str | None = None
    seconds: float | None = None
    runs: list[str] = []
    earlier: list[str] = []          # runs of attempts that did not finish
    outcome: dict[str, Any] = {}
    error: str | None = None


class Point(Part):
    """One setting at one concurrency (``k`` 0: no draft), predicted and, where benched, measured.
    vLLM: ``k`` num_speculative_tokens, ``draft_tokens`` = k; SGLang: ``k`` the steps, ``topk`` and
    ``draft_tokens`` the tree's --speculative-eagle-topk and --speculative-num-draft-tokens."""

    k: int
    topk: int = 1
    draft_tokens: int
    concurrency: int
    predicted_tok_s: float | None = None
    measured_tok_s: float | None = None
    accept_length_predicted: float | None = None
    accept_length_measured: float | None = None
    speedup_predicted: float | None = None
    break_even: float | None = None
    bench_run: str | None = None
    role: str = "predicted"          # predicted, fit (the cost was fitted on it), check (a further point)
    error: float | None = None       # (predicted - measured) / measured


class Best(Part):
    """The setting chosen at one concurrency, and why."""

    concurrency: int
    k: int
    topk: int = 1
    draft_tokens: int
    predicted_tok_s: float | None = None
    measured_tok_s: float | None = None
    best_measured_k: int | None = None
    best_measured_tok_s: float | None = None
    vs_baseline: dict[str, Any] | None = None       # comparison.Verdict.to_dict()
    vs_configured: dict[str, Any] | None = None
    why: str = ""


class TuneDoc(Document, StepsOf[Step]):
    SCHEMA = "draftops.tune/1"
    TASK = "invoke tune"

    tune_id: str
    host: str
    args: Args
    created: str
    status: str = "running"          # running, done, failed, stopped
    stopped_at: str | None = None
    why: str | None = None
    why_signal: int | None = None
    steps: list[Step] = []
    servers: list[dict[str, Any]] = []
    left_running: list[str] = []
    resumed: list[str] = []
    spent_s: float = 0.0             # the budget's clock: every step's seconds, resumes included
    engine: str | None = None
    draft_path: str | None = None
    configured_k: int = 3
    profile: dict[str, Any] | None = None           # conditional per depth, its source, samples, run
    profile_check: dict[str, Any] | None = None     # against one server's per-position counters
    cost: dict[str, Any] | None = None              # fixed / per_token / baseline seconds per concurrency
    points: list[Point] = []
    best: list[Best] = []
    engine_args: dict[str, Any] | None = None
    off_from: int | None = None
    median_error: float | None = None
    notes: list[str] = []

