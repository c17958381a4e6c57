"""Does the draft's KV cache inherit the target's FP8 KV dtype?  The rule and the variant behind
``draft-kv-dtype``.

vLLM builds the draft's config from the target's, so ``--kv-cache-dtype fp8`` applies to the draft's
cache too; its speculative config's ``kv_cache_dtype`` ("KV cache dtype for the draft model. When None,
the draft inherits the target model's --kv-cache-dtype": vllm/config/speculative.py, read in 0.32.0;
added by PR #48787, merged 2026-07-15; issue #54690 reports it in 0.28.0) keeps the draft's apart.  Before
0.28.0 no version read has such a field: the draft's KV follows the target's.  An FP8 cache without
calibrated scales stores keys and values at scale 1.0 (tokenspeed #1012: "the checkpoint provides no KV
scales and scale 1.0 is being used"; there a draft following the target's FP8 KV went from 2.6-2.8 to 1.79
accept length).  SGLang: no rule read, so no finding.

The evidence: the draft scored once more with its keys and values rounded to that FP8 format (saturated,
scale 1.0) as they are written to the cache, on the same samples and layout.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from ...eagle import engine_rules
from ...eagle.convention import VLLM
from . import draft as model
from . import layers

ID = "draft-kv-dtype"
DRAFT_FIELD_SINCE = (0, 28, 0)   # the first vLLM release seen with SpeculativeConfig.kv_cache_dtype
FORMATS = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_inc": torch.float8_e4m3fn,
           "fp8_e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class Inherit:
    """The draft's KV dtype as the engine serves it, and the draft with its KV rounded so."""

    engine: str
    version: str
    assumed: bool
    target_dtype: str
    draft_field: bool   # whether this version has the speculative config's kv_cache_dtype
    store: Store        # how the cache holds a key or value


def draft_dtype(target: str | None, draft: str | None) -> str | None:
    """The KV dtype the draft's cache gets: its own when the profile sets one, else the target's."""
    return draft if draft and draft != "auto" else (target if draft is None else None)


Store = Callable[[torch.Tensor], torch.Tensor]


def rounding(dtype: torch.dtype) -> Store:
    """Keys or values as an FP8 cache of scale 1.0 holds them (saturated at the format's largest value)."""
    top = torch.finfo(dtype).max

    def store(t: torch.Tensor) -> torch.Tensor:
        return t.clamp(-top, top).to(dtype).to(t.dtype)
    return store


def prepare(engine: str, version: str | None, target_kv: str | None,
            draft_kv: str | None) -> Inherit | None:
    """The variant for this launch, when the draft's cache ends up FP8; None otherwise (or not vLLM)."""
    if engine != VLLM or not target_kv:
        return None
    used, assumed = engine_rules.effective(engine, version)
    has_field = engine_rules._at_least(used, DRAFT_FIELD_SINCE)
    effective = draft_dtype(target_kv, draft_kv if has_field else None)
    fmt = FORMATS.get((effective or "").lower())
    if fmt is None:
        return None
    return Inherit(engine, used, assumed, target_kv, has_field, rounding(fmt))


class _Stored:
    """The layers module with ``project_qkv``'s keys and values passed through ``store``."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(layers, name)

    def project_qkv(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = layers.project_qkv(*args)
        return q, self._store(k), self._store(v)


@contextlib.contextmanager
def stored(store: Store | None) -> Iterator[None]:
    """While it lasts, the draft's forward (model.py) writes its keys and values through ``store``, as an
    engine's cache of that dtype holds them; the scoring of one variant runs inside it, on the calling
    thread (the reader threads only load dumps).  Nothing changes when ``store`` is None."""
    if store is None:
        yield
        return
    model.layers = _Stored(store)  # type: ignore[assignment]
    try:
        yield
    finally:
        model.layers = layers
