"""Functional Llama building blocks shared by the draft forward and the demo target.

Plain functions over a weight dict (no nn.Module) so one implementation serves inference
(under ``torch.inference_mode``), the demo's training (autograd) and any dtype.  Numerics follow
transformers: RMSNorm variance in fp32, rope tables in fp32, softmax in fp32.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import rope

Weights = dict[str, torch.Tensor]
_SCORE_BUDGET = {"cpu": 256 << 20, "cuda": 2 << 30}  # bytes of fp32 attention scores per query chunk


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in fp32, multiply in the input dtype."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def linear(x: torch.Tensor, w: Weights, name: str) -> torch.Tensor:
    """``x @ W.T (+ b)`` for the tensor ``name.weight`` (bias used when the file has one)."""
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def mlp(x: torch.Tensor, w: Weights, prefix: str) -> torch.Tensor:
    """SiLU-gated MLP (the only activation EAGLE-3 Llama/Qwen3 drafts use)."""
    gate = F.silu(linear(x, w, prefix + "gate_proj"))
    return linear(gate * linear(x, w, prefix + "up_proj"), w, prefix + "down_proj")


@dataclass
class KVCache:
    """Keys/values of one layer across TTT steps: the step-0 block plus one diagonal per later step."""

    k0: torch.Tensor | None = None
    v0: torch.Tensor | None = None
    diag_k: list[torch.Tensor] = field(default_factory=list)
    diag_v: list[torch.Tensor] = field(default_factory=list)


@dataclass(frozen=True)
class AttnShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    qk_norm: bool = False
    window: int | None = None


def attention(
    x: torch.Tensor,
    w: Weights,
    prefix: str,
    shape: AttnShape,
    cos_sin: tuple[torch.Tensor, torch.Tensor],
    cache: KVCache,
    key_valid: torch.Tensor,
) -> torch.Tensor:
    """Self-attention of one TTT step; ``cache`` holds the earlier steps and is extended.

    Row i of step 0 sees step-0 keys j <= i (same sample, inside the window); row i of step k>0
    sees the same step-0 keys plus its own keys of steps 1..k.  This is speculators' dense
    ``causal | diagonal`` mask over the keys of all steps laid end to end, evaluated the same way
    (one matmul, fp32 softmax, one matmul), so fp32 logits are bit-identical to speculators'; only
    the query rows are chunked, to bound the score memory.
    """
    b, n, _ = x.shape
    hd, nh, nkv = shape.head_dim, shape.num_heads, shape.num_kv_heads
    q = linear(x, w, prefix + "q_proj").view(b, n, nh, hd)
    k = linear(x, w, prefix + "k_proj").view(b, n, nkv, hd)
    v = linear(x, w, prefix + "v_proj").view(b, n, nkv, hd).transpose(1, 2)
    if shape.qk_norm:
        q = rms_norm(q, w[prefix + "q_norm.weight"], shape.eps)
        k = rms_norm(k, w[prefix + "k_norm.weight"], shape.eps)
    cos, sin = cos_sin
    q = rope.apply(q.transpose(1, 2), cos, sin)
    k = rope.apply(k.transpose(1, 2), cos, sin)
    if cache.k0 is None:
        cache.k0, cache.v0 = k, v
    else:
        cache.diag_k.append(k)
        cache.diag_v.append(v)
    out = _attend(q, cache, key_valid, shape.window, hd ** -0.5)
    return linear(out.transpose(1, 2).reshape(b, n, nh * hd), w, prefix + "o_proj")


def _attend(q: torch.Tensor, cache: KVCache, key_valid: torch.Tensor, window: int | None,
            scale: float) -> torch.Tensor:
    assert cache.k0 is not None and cache.v0 is not None
    b, nh, n, hd = q.shape
    nkv = cache.k0.shape[1]
    g = nh // nkv
    steps = 1 + len(cache.diag_k)
    keys_t = torch.cat([cache.k0, *cache.diag_k], dim=2).transpose(-1, -2)  # [b, nkv, hd, steps*n]
    values = torch.cat([cache.v0, *cache.diag_v], dim=2)  # [b, nkv, steps*n, hd]
    qg = q.view(b, nkv, g, n, hd)  # query heads grouped by their KV head (GQA without repeat_kv)
    budget = _SCORE_BUDGET.get(q.device.type, _SCORE_BUDGET["cpu"])
    chunk = max(1, min(n, budget // max(1, 4 * b * nh * n * steps)))
    pos = torch.arange(n, device=q.device)
    outs = []
    for s in range(0, n, chunk):
        rows = pos[s:s + chunk, None]
        allowed = pos[None, :] <= rows
        if window is not None:
            allowed = allowed & (pos[None, :] > rows - window)
        allowed = allowed[None] & key_valid[:, None, :]  # [b, c, n]: block 0, causal
        if steps > 1:
            diag = (pos[None, :] == rows).expand(b, -1, -1)  # blocks 1..k: own row only
            allowed = torch.cat([allowed] + [diag] * (steps - 1), dim=-1)
        c = rows.shape[0]
        qc = qg[:, :, :, s:s + c].reshape(b, nkv, g * c, hd)
        scores = (qc @ keys_t).view(b, nkv, g, c, -1) * scale
        scores = scores.masked_fill(~allowed[:, None, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        outs.append((probs.view(b, nkv, g * c, -1) @ values).view(b, nkv, g, c, hd))
    return torch.cat(outs, dim=3).reshape(b, nh, n, hd)
