"""Which of the draft's own ``embed_tokens``/``lm_head`` the serving engine's version replaces with the
target's at load, and the draft as it then runs: the rules and the variant behind ``draft-head-replaced``.

Sources read (check each before changing it):
* vLLM before 0.12.0: the EAGLE proposer's ``load_model`` points the draft's ``embed_tokens`` at the
  target's (pipeline parallel 1; PR #17326), and for EAGLE-3 shares the target's ``lm_head`` when the
  draft's has the target's shape (a full-vocabulary draft); PR #27737 (closed) and #28549 (merged
  2025-11, "existing codebase ignores this and always overrides them with target model's layers":
  gpt-oss-20b's draft 1.32 -> 2.49 accept length) keep a draft's own distinct ones, so 0.12.0, the first
  release cut after the merge, keeps them (0.32.0's ``llm_base_proposer._maybe_share_lm_head``,
  ``has_own_embed_tokens``: read).
* SGLang (every version read, to 0.5.23): the EAGLE worker calls ``set_embed(target embed)``, or
  ``set_embed_and_head`` when the draft config has no ``draft_vocab_size``
  (``load_lm_head_from_target``); ``set_embed`` returns early when ``target_hidden_size`` differs from
  ``hidden_size`` (../shared/reference/sglang-eagle3.md).
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ... import jsonread
from ...eagle import engine_rules
from ...eagle.convention import SGLANG, VLLM
from .draft import Eagle3Draft

ID = "draft-head-replaced"
VLLM_KEEPS = (0, 12, 0)   # the first vLLM release that keeps a draft's own distinct embed_tokens / lm_head
#: a part whose relative RMS difference from the target's is below this is the target's (bf16 rounding)
SAME = 0.01
EMBED, HEAD = "embed_tokens", "lm_head"


@dataclass(frozen=True)
class Swap:
    """What the engine replaces, why, and the draft as it then runs (sharing the other tensors)."""

    engine: str
    version: str
    assumed: bool
    parts: dict[str, str]            # part -> the engine's rule that replaces it
    differs: dict[str, float]        # part -> relative RMS difference of the draft's own from the target's
    draft: Eagle3Draft


def relative(own: torch.Tensor, target: torch.Tensor) -> float:
    own, target = own.double(), target.to(own.device).double()
    return float((own - target).norm() / target.norm().clamp(min=1e-300))


def rules(engine: str, version: str, config: dict[str, Any], full_vocab: bool) -> dict[str, str]:
    """The parts ``engine`` at ``version`` replaces with the target's, each with the rule's text."""
    if engine == VLLM and not engine_rules._at_least(version, VLLM_KEEPS):
        out = {EMBED: "points the draft's embed_tokens at the target's (pipeline parallel 1; fixed by PR #28549 "
                      "in 0.12.0)"}
        if full_vocab:
            out[HEAD] = ("shares the target's lm_head with a full-vocabulary EAGLE-3 draft (fixed by PR #28549 "
                         "in 0.12.0)")
        return out
    if engine != SGLANG:
        return {}
    hidden, target_hidden = config.get("hidden_size"), config.get("target_hidden_size")
    out = {}
    if target_hidden is None or target_hidden == hidden:
        out[EMBED] = "replaces the draft's embed_tokens with the target's (set_embed, every version read)"
    if config.get("draft_vocab_size") is None:
        out[HEAD] = "loads the target's lm_head for a config without draft_vocab_size (load_lm_head_from_target)"
    return out


Target = Callable[[], "torch.Tensor | None"]


def prepare(draft: Eagle3Draft, engine: str, version: str | None, config: dict[str, Any],
            target_embed: Target, target_rows: Target) -> Swap | None:
    """The swap for this draft, when the engine replaces a part the draft ships different from the
    target's; ``target_rows``: the target's lm_head rows of the draft vocabulary (row d = lm_head[d + d2t[d]]).
    The target's parts are read (``target_*()``) only for a part the engine version replaces."""
    used, assumed = engine_rules.effective(engine, version)
    full_vocab = draft.arch.draft_vocab_size == draft.arch.vocab_size
    ours = {EMBED: (draft.w.get("embed_tokens.weight"), target_embed),
            HEAD: (draft.w.get("lm_head.weight"), target_rows)}
    parts, differs, weights = {}, {}, dict(draft.w)
    for part, rule in rules(engine, used, config, full_vocab).items():
        own, read = ours[part]
        target = read() if own is not None else None
        if own is None or target is None or own.shape != target.shape:
            continue
        gap = relative(own, target)
        if gap >= SAME:
            parts[part], differs[part] = rule, gap
            weights[f"{part}.weight"] = target.to(own.device, own.dtype)
    if not parts:
        return None
    variant = copy.copy(draft)
    variant.w = weights
    return Swap(engine, used, assumed, parts, differs, variant)


def read_config(path: str) -> dict[str, Any]:
    """The keys the SGLang rule reads (``hidden_size``, ``target_hidden_size``, ``draft_vocab_size``), from
    the top level or a speculators config's ``transformer_layer_config``; the loader already validated it."""
    try:
        doc = jsonread.load(Path(path))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    nested = doc.get("transformer_layer_config")
    inner = nested if isinstance(nested, dict) else {}
    return {key: doc.get(key, inner.get(key)) for key in ("hidden_size", "target_hidden_size", "draft_vocab_size")}
