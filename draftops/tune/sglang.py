"""The SGLang branch of tune: a tree setting as ``invoke serve`` asks for it, what the server made of
it (read back from the bench's ``/get_server_info``), and the answer's engine arguments.

SGLang may serve something else than asked: with ``--speculative-eagle-topk 1`` it sets
``--speculative-num-draft-tokens`` to steps + 1 (one WARNING), and with none of the three flags it
picks its own. A measured point is therefore keyed by the effective setting the bench recorded, and
says when that differs from the asked one (docs/tune.md § SGLang trees).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from draftops import cmdline
from draftops.tune.trees import TreeSetting

if TYPE_CHECKING:
    from draftops.bench.result import BenchResult


def serve_args(setting: TreeSetting) -> list[str]:
    """``invoke serve``'s options for ``setting`` (the three SGLang flags behind them)."""
    return ["--steps", str(setting.steps), "--topk", str(setting.topk),
            "--draft-tokens", str(setting.effective_draft_tokens)]


def serve_command(draft: str, setting: TreeSetting, host: str | None = None) -> str:
    """The pasteable ``invoke serve`` line that serves ``draft`` with ``setting``."""
    return cmdline.command("serve", "--draft", draft, *serve_args(setting), host=host)


def engine_args(setting: TreeSetting) -> dict[str, Any]:
    """The answer for an SGLang host: the three flags as a list and as one shell-quoted line."""
    return {"engine": "sglang", "args": setting.engine_args(), "line": setting.engine_line()}


@dataclass(frozen=True)
class Point:
    """One SGLang bench as tune's measurement reads it."""

    run_id: str
    setting: TreeSetting              # as the server reported it
    concurrency: int
    tok_s: float | None               # output tok/s, median of the repeats
    accept_length: float | None       # SGLang's, the bonus token included
    adjusted: str | None = None       # what SGLang changed of the asked setting, in words

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "k": self.setting.steps, "topk": self.setting.topk,
                "draft_tokens": self.setting.effective_draft_tokens, "concurrency": self.concurrency,
                "measured_tok_s": self.tok_s, "accept_length_measured": self.accept_length,
                "adjusted": self.adjusted}


class NotATree(ValueError):
    """A bench that is not an SGLang speculative run with its three settings read back."""


def measured(result: BenchResult, asked: TreeSetting | None = None) -> Point:
    """The point a bench of an SGLang speculative server measured, keyed by the effective setting."""
    spec = result.speculative
    if result.engine.name != "sglang" or result.mode != "speculative" or spec is None:
        raise NotATree(f"bench run {result.run_id} is not an SGLang speculative run ({result.engine.name}, "
                       f"{result.mode}): tune's SGLang branch reads only those.")
    if spec.num_steps is None or spec.topk is None or spec.num_draft_tokens is None:
        raise NotATree(f"bench run {result.run_id} did not read back SGLang's speculative settings (steps "
                       f"{spec.num_steps}, topk {spec.topk}, draft tokens {spec.num_draft_tokens}): bench the "
                       "server again while it runs, so /get_server_info answers.")
    setting = TreeSetting(spec.num_steps, spec.topk, spec.num_draft_tokens)
    tok_s = result.metrics.output_throughput.median
    accept = result.accept_length.value if result.accept_length else None
    return Point(result.run_id, setting, result.settings.concurrency or 1, tok_s, accept,
                 _adjusted(asked, setting))


def _adjusted(asked: TreeSetting | None, got: TreeSetting) -> str | None:
    if asked is None:
        return None
    pairs = [("steps", asked.steps, got.steps), ("topk", asked.topk, got.topk),
             ("draft tokens", asked.draft_tokens or asked.effective_draft_tokens, got.effective_draft_tokens)]
    changed = [f"{name} {a} → {g}" for name, a, g in pairs if a != g]
    if not changed:
        return None
    why = " (SGLang sets draft tokens to steps + 1 with topk 1)" if got.topk == 1 else ""
    return "SGLang served " + ", ".join(changed) + why


def answer_args(chosen: list[tuple[int, TreeSetting | None]], draft: str, host: str | None = None) -> dict[str, Any]:
    """The answer for an SGLang host from the setting chosen per concurrency (None: no draft there).
    SGLang serves one setting per server (it reads no per-batch-size schedule), so the flags are the
    setting chosen at the most concurrencies (a tie: the lowest of them); each concurrency's own line
    is given too, and ``serve``: the pasteable `invoke serve` that serves ``draft`` with the flags."""
    per = {str(c): (s.engine_line() if s is not None else None) for c, s in chosen}
    counted: dict[TreeSetting, list[int]] = {}
    for c, s in chosen:
        if s is not None:
            counted.setdefault(s, []).append(c)
    out: dict[str, Any] = {"engine": "sglang", "per_concurrency": per, "setting": None, "args": [],
                           "line": "(no speculative flags: serve without a draft)",
                           "note": "SGLang serves one speculative setting per server (no per-batch-size schedule): "
                                   "where no draft is best, serve that traffic from a server without one"}
    if counted:
        best = max(counted, key=lambda s: (len(counted[s]), -min(counted[s])))
        out.update(engine_args(best))
        out["serve"] = serve_command(draft, best, host)
        out["setting"] = {"steps": best.steps, "topk": best.topk, "draft_tokens": best.effective_draft_tokens,
                          "concurrencies": counted[best]}
    return out
