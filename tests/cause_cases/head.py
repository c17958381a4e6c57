"""A draft that ships its own trained embed_tokens, served by a vLLM version that replaces it with the
target's (remote/drafter/causes/head.py; vllm #27737, fixed by #28549 in 0.12.0)."""
from __future__ import annotations

from pathlib import Path

import torch

from .healthy import Healthy, Variant


def own_embedding(weights: dict[str, torch.Tensor]) -> None:
    """The healthy draft reparametrised exactly: its embed_tokens is the target's times a random orthogonal
    M, and layer 0 undoes M where it reads the embedding (q/k/v's embedding half times diag(norm) M, the
    norm's weight then ones), so the draft computes what it did, but only with its own embedding, as a
    draft trained with an embedding of its own does."""
    h = weights["embed_tokens.weight"].shape[1]
    m, _ = torch.linalg.qr(torch.randn(h, h, generator=torch.Generator().manual_seed(23), dtype=torch.float64))
    norm = weights["layers.0.input_layernorm.weight"].double()
    weights["embed_tokens.weight"] = (weights["embed_tokens.weight"].double() @ m).float()
    for name in ("q_proj", "k_proj", "v_proj"):
        w = weights[f"layers.0.self_attn.{name}.weight"].double()
        w[:, :h] = w[:, :h] @ torch.diag(norm) @ m
        weights[f"layers.0.self_attn.{name}.weight"] = w.float()
    weights["layers.0.input_layernorm.weight"] = torch.ones_like(weights["layers.0.input_layernorm.weight"])


def embedding_replaced(base: Healthy, out: Path) -> Variant:
    """That draft served by vLLM 0.11.0, which points the draft's embed_tokens at the target's."""
    return Variant(base.draft_with(out / "draft", own_embedding), options={"engine": "vllm",
                                                                           "engine_version": "0.11.0"})


def fp8_kv_inherited(base: Healthy, out: Path) -> Variant:
    """The healthy draft served by vLLM 0.27.0 (no draft kv_cache_dtype of its own) under a profile whose
    extra_args set --kv-cache-dtype fp8: its cache inherits FP8 (what `invoke test-drafter` passes along)."""
    return Variant(base.draft, options={"engine": "vllm", "engine_version": "0.27.0", "serve_kv_cache_dtype": "fp8"})
