"""Functional Llama building blocks shared by the draft forward and the demo target.

Plain functions over a weight dict (no nn.Module) so one implementation serves inference
(under ``torch.inference_mode``), the demo's training (autograd) and any dtype.  Numerics follow
transformers: RMSNorm variance in fp32, rope tables in fp32, softmax in fp32.

Two attention paths compute the same function.  ``attention`` is speculators' dense formulation
(one softmax over the keys of every TTT step laid end to end, under a causal|diagonal mask); it
is differentiable and serves training and the demo target.  Inference uses ``causal_attention``
+ ``merge_diagonal``: a fused causal kernel over the step-0 keys only, which also returns each
row's log-sum-exp, merged with the row's own keys of the later steps (one key per step), so no
step ever scores the (k+1)·N keys a row cannot see.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import rope

Weights = dict[str, torch.Tensor]
_SCORE_BUDGET = {"cpu": 256 << 20, "cuda": 2 << 30}  # bytes of fp32 attention scores per query chunk
_FALLBACKS: dict[tuple[str, torch.dtype], str] = {}  # fused kernel that failed -> why (see kernel_name)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as the draft was trained with it. On CUDA in bf16/fp16 it is torch's fused
    ``F.rms_norm`` (fp32 inside, one kernel instead of five: 8x faster on an H200 and +7% for the
    whole evaluator, see docs/performance.md); elsewhere HF's LlamaRMSNorm exactly."""
    if x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and hasattr(F, "rms_norm"):
        return F.rms_norm(x, (x.shape[-1],), weight.to(x.dtype), eps)
    return hf_rms_norm(x, weight, eps)


def hf_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF LlamaRMSNorm: normalise in fp32, multiply in the input dtype."""
    x32 = x.to(torch.float32)
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def linear(x: torch.Tensor, w: Weights, name: str) -> torch.Tensor:
    """``x @ W.T (+ b)`` for the tensor ``name.weight`` (bias used when the file has one)."""
    return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))


def mlp(x: torch.Tensor, w: Weights, prefix: str) -> torch.Tensor:
    """SiLU-gated MLP (the only activation EAGLE-3 Llama/Qwen3 drafts use); one GEMM for gate and
    up when ``fuse_projections`` has stacked them."""
    if prefix + "gate_up_proj.weight" in w:
        gate, up = linear(x, w, prefix + "gate_up_proj").chunk(2, dim=-1)
    else:
        gate, up = linear(x, w, prefix + "gate_proj"), linear(x, w, prefix + "up_proj")
    return linear(F.silu(gate) * up, w, prefix + "down_proj")


_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def fuse_projections(w: Weights, prefix: str) -> None:
    """Stack q/k/v and gate/up of the layer at ``prefix`` into one weight each (one GEMM instead
    of three or two); the original names become views of it, so no memory is added."""
    for fused, parts in _FUSED.items():
        names = [prefix + p for p in parts]
        biases = [w.get(n + ".bias") for n in names]
        if any(n + ".weight" not in w for n in names) or len({b is None for b in biases}) != 1:
            continue
        for suffix, pieces in ((".weight", [w[n + ".weight"] for n in names]), (".bias", biases)):
            if pieces[0] is None:
                continue
            stacked = torch.cat(pieces, 0)  # type: ignore[arg-type]
            w[prefix + fused + suffix] = stacked
            for n, piece in zip(names, stacked.split([p.shape[0] for p in pieces]), strict=True):  # type: ignore[union-attr]
                w[n + suffix] = piece


@dataclass(frozen=True)
class AttnShape:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    qk_norm: bool = False
    window: int | None = None


def project_qkv(x: torch.Tensor, w: Weights, prefix: str, shape: AttnShape, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows ``x`` [R, width] -> q [R, heads, hd], k and v [R, kv_heads, hd]; rope (cos/sin [R, hd])
    applied to q and k (after the Qwen3 q/k norms when the draft has them)."""
    r, hd, nh, nkv = x.shape[0], shape.head_dim, shape.num_heads, shape.num_kv_heads
    if prefix + "qkv_proj.weight" in w:
        q, k, v = linear(x, w, prefix + "qkv_proj").split([nh * hd, nkv * hd, nkv * hd], dim=-1)
    else:
        q, k, v = (linear(x, w, prefix + name) for name in ("q_proj", "k_proj", "v_proj"))
    q, k, v = q.reshape(r, nh, hd), k.reshape(r, nkv, hd), v.reshape(r, nkv, hd)
    if shape.qk_norm:
        q = rms_norm(q, w[prefix + "q_norm.weight"], shape.eps)
        k = rms_norm(k, w[prefix + "k_norm.weight"], shape.eps)
    return rope.apply(q, cos, sin), rope.apply(k, cos, sin), v


# -- the dense reference (training, demo target) ------------------------------------------------
@dataclass
class KVCache:
    """Keys/values of one layer across TTT steps: the step-0 block plus one diagonal per later step."""

    k0: torch.Tensor | None = None
    v0: torch.Tensor | None = None
    diag_k: list[torch.Tensor] = field(default_factory=list)
    diag_v: list[torch.Tensor] = field(default_factory=list)


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
    cos, sin = (t.reshape(b * n, -1) for t in cos_sin)
    heads = dense_heads(x.reshape(b * n, -1), w, prefix, shape, cos, sin, cache, key_valid)
    return linear(heads, w, prefix + "o_proj").view(b, n, -1)


def dense_heads(x: torch.Tensor, w: Weights, prefix: str, shape: AttnShape, cos: torch.Tensor,
                sin: torch.Tensor, cache: KVCache, key_valid: torch.Tensor) -> torch.Tensor:
    """``attention`` before its output projection, on rows x [B*N, width] of the [B, N] grid
    ``key_valid`` describes; returns [B*N, heads*hd]."""
    b, n = key_valid.shape
    q, k, v = (t.view(b, n, -1, shape.head_dim).transpose(1, 2)
               for t in project_qkv(x, w, prefix, shape, cos, sin))
    if cache.k0 is None:
        cache.k0, cache.v0 = k, v
    else:
        cache.diag_k.append(k)
        cache.diag_v.append(v)
    out = _attend(q, cache, key_valid, shape.window, shape.head_dim ** -0.5)
    return out.transpose(1, 2).reshape(b * n, -1)


def _attend(q: torch.Tensor, cache: KVCache, key_valid: torch.Tensor, window: int | None,
            scale: float) -> torch.Tensor:
    assert cache.k0 is not None and cache.v0 is not None
    b, nh, n, hd = q.shape
    nkv = cache.k0.shape[1]
    g = nh // nkv
    steps = 1 + len(cache.diag_k)
    keys_t = torch.cat([cache.k0, *cache.diag_k], dim=2).transpose(-1, -2)  # [b, nkv, hd, steps*n]
    values = torch.cat([cache.v0, *cache.diag_v], dim=2)  # [b, nkv, steps*n, hd]
    qg = q.reshape(b, nkv, g, n, hd)  # query heads grouped by their KV head (GQA without repeat_kv)
    chunk = _query_chunk(q, n * steps)
    pos = torch.arange(n, device=q.device)
    outs = []
    for s in range(0, n, chunk):
        rows = pos[s:s + chunk, None]
        allowed = _allowed(pos, rows, window)[None] & key_valid[:, None, :]  # [b, c, n]: block 0
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


def exact_grid(q: torch.Tensor, grid: tuple[int, int], k0: torch.Tensor, v0: torch.Tensor,
               diag: list[tuple[torch.Tensor, torch.Tensor]], window: int | None, scale: float) -> torch.Tensor:
    """``_attend`` (speculators' dense formulation) for every row of the [B, N] ``grid``: q and
    the step-0 k0/v0 in rows layout [B*N, heads, hd], ``diag`` the later steps' keys/values of
    every row.  Returns [B*N, heads, hd]."""
    b, n = grid
    as_grid = lambda t: t.view(b, n, -1, t.shape[-1]).transpose(1, 2)  # noqa: E731
    cache = KVCache(as_grid(k0), as_grid(v0), [as_grid(k) for k, _ in diag], [as_grid(v) for _, v in diag])
    valid = torch.ones(b, n, dtype=torch.bool, device=q.device)  # causal: valid rows never see padding
    return _attend(as_grid(q), cache, valid, window, scale).transpose(1, 2).reshape(b * n, *q.shape[1:])


def exact_rows(q: torch.Tensor, rows: torch.Tensor, n: int, k0: torch.Tensor, v0: torch.Tensor,
               diag: list[tuple[torch.Tensor, torch.Tensor]], window: int | None, scale: float) -> torch.Tensor:
    """``exact_grid`` for the query rows ``rows`` (ascending flat indices b*N + t) only: q [R, heads,
    hd] and ``diag`` [R, kv_heads, hd] belong to those rows, k0/v0 [B*N, kv_heads, hd] to all.

    Per sample, the selected queries are scored against the same key row speculators builds (the
    sample's step-0 keys, then one block of N per later step holding each row's own key at its own
    position; the other entries are masked) with the same ops in the same layout, so each row's
    result is the one ``exact_grid`` gives it."""
    r, nh, hd = q.shape
    nkv = k0.shape[1]
    g = nh // nkv
    steps = 1 + len(diag)
    out = q.new_empty(r, nh, hd)
    pos = torch.arange(n, device=q.device)
    samples, counts = torch.unique_consecutive(torch.div(rows, n, rounding_mode="floor"), return_counts=True)
    start = 0
    for b, c in zip(samples.tolist(), counts.tolist(), strict=True):
        seg = slice(start, start + c)
        start += c
        t = rows[seg] - b * n
        keys, values = [k0[b * n:(b + 1) * n]], [v0[b * n:(b + 1) * n]]
        for dk, dv in diag:
            keys.append(k0.new_zeros(n, nkv, hd).index_copy_(0, t, dk[seg]))
            values.append(v0.new_zeros(n, nkv, hd).index_copy_(0, t, dv[seg]))
        keys_t = torch.cat(keys).transpose(0, 1).contiguous().transpose(-1, -2)  # [nkv, hd, steps*n]
        vals = torch.cat(values).transpose(0, 1).contiguous()  # [nkv, steps*n, hd]
        allowed = _allowed(pos, t[:, None], window)  # [c, n]
        if steps > 1:
            allowed = torch.cat([allowed] + [pos[None, :] == t[:, None]] * (steps - 1), dim=-1)
        qs = q[seg].view(c, nkv, g, hd).permute(1, 2, 0, 3).reshape(nkv, g * c, hd)
        scores = (qs @ keys_t).view(nkv, g, c, -1) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out[seg] = (probs.view(nkv, g * c, -1) @ vals).view(nkv, g, c, hd).permute(2, 0, 1, 3).reshape(c, nh, hd)
    return out


def _query_chunk(q: torch.Tensor, keys: int) -> int:
    """Query rows per chunk so that one chunk's fp32 scores stay within the device's budget."""
    b, nh, n, _ = q.shape
    budget = _SCORE_BUDGET.get(q.device.type, _SCORE_BUDGET["cpu"])
    return max(1, min(n, budget // max(1, 4 * b * nh * keys)))


def _allowed(pos: torch.Tensor, rows: torch.Tensor, window: int | None) -> torch.Tensor:
    """[c, n] causal (and sliding-window) mask of query ``rows`` [c, 1] over keys ``pos``."""
    allowed = pos[None, :] <= rows
    return allowed & (pos[None, :] > rows - window) if window is not None else allowed


# -- the inference path ---------------------------------------------------------------------------
def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention of q [b, heads, n, hd] over k, v [b, kv_heads, n, hd] (sliding window
    when given): (out [b, heads, n, hd], fp32 log-sum-exp of each row's scaled scores [b, heads, n]).

    Padding needs no key mask: a valid row t < length only sees keys j <= t.  A fused kernel
    (flash on CPU and for CUDA half types, memory-efficient for CUDA fp32) is used when the
    build has it; otherwise, or with a window, a chunked matmul/softmax.
    """
    kernel = kernel_name(q.device.type, q.dtype) if window is None else "chunked"
    if kernel != "chunked":
        g = q.shape[1] // k.shape[1]
        ke, ve = (t.repeat_interleave(g, dim=1) if g > 1 else t for t in (k, v))
        try:
            return _fused_causal(kernel, q, ke, ve, scale)
        except (RuntimeError, NotImplementedError, TypeError, AttributeError) as exc:
            _FALLBACKS[(q.device.type, q.dtype)] = f"{kernel} failed: {type(exc).__name__}: {exc}"[:300]
            warnings.warn(f"drafter: fused {kernel} attention unavailable on {q.device.type}/{q.dtype} "
                          f"({exc}); using the chunked path", RuntimeWarning, stacklevel=2)
    return _chunked_causal(q, k, v, window, scale)


def kernel_name(device_type: str, dtype: torch.dtype) -> str:
    """The causal kernel ``causal_attention`` uses on this device and dtype (no window)."""
    if (device_type, dtype) in _FALLBACKS:
        return "chunked"
    if device_type == "cpu":
        return "flash-cpu"
    if device_type == "cuda":
        return "flash" if dtype in (torch.float16, torch.bfloat16) else "efficient"
    return "chunked"


def fallback_reasons() -> dict[str, str]:
    """Fused kernels that failed in this process, and why (benchmarks print this)."""
    return {f"{d}/{t}": why for (d, t), why in _FALLBACKS.items()}


def _fused_causal(kernel: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    n = q.shape[2]
    ops = torch.ops.aten
    if kernel == "flash-cpu":
        out, lse = ops._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    elif kernel == "flash":
        out, lse = ops._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)[:2]
    else:
        out, lse = ops._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, True,
                                                               scale=scale)[:2]
    return out, lse[..., :n].float()  # the efficient kernel pads the lse rows to a multiple of 32


def _chunked_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    b, nh, n, hd = q.shape
    nkv = k.shape[1]
    g = nh // nkv
    qg = q.reshape(b, nkv, g, n, hd)
    keys_t = k.transpose(-1, -2)
    chunk = _query_chunk(q, n)
    pos = torch.arange(n, device=q.device)
    outs, lses = [], []
    for s in range(0, n, chunk):
        rows = pos[s:s + chunk, None]
        c = rows.shape[0]
        scores = (qg[:, :, :, s:s + c].reshape(b, nkv, g * c, hd) @ keys_t).view(b, nkv, g, c, n) * scale
        scores = scores.float().masked_fill(~_allowed(pos, rows, window), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - lse[..., None]).to(q.dtype)
        outs.append((probs.view(b, nkv, g * c, n) @ v).view(b, nkv, g, c, hd))
        lses.append(lse)
    return torch.cat(outs, dim=3).reshape(b, nh, n, hd), torch.cat(lses, dim=3).reshape(b, nh, n)


def merge_diagonal(out: torch.Tensor, lse: torch.Tensor, q: torch.Tensor,
                   diag: list[tuple[torch.Tensor, torch.Tensor]], scale: float) -> torch.Tensor:
    """Add each row's own keys of the later TTT steps to its causal attention.

    ``out`` [R, heads, hd] and ``lse`` [R, heads] are the causal part over the step-0 keys, ``q``
    [R, heads, hd] the row's query, ``diag`` the row's (key, value) [R, kv_heads, hd] of steps 1..k.
    The softmax over all those keys is the causal block and each diagonal key weighted by
    exp(score) / (exp(lse) + sum exp(diagonal scores)), computed in fp32.
    """
    if not diag:
        return out
    r, nh, hd = q.shape
    nkv = diag[0][0].shape[1]
    qg = q.float().view(r, nkv, nh // nkv, hd)
    logits = [lse.view(r, nkv, -1)] + [(qg * k.float()[:, :, None]).sum(-1) * scale for k, _ in diag]
    weights = torch.softmax(torch.stack(logits, dim=-1), dim=-1)  # [R, nkv, g, 1 + steps]
    merged = weights[..., :1] * out.float().view(r, nkv, -1, hd)
    for i, (_, v) in enumerate(diag, start=1):
        merged = merged + weights[..., i:i + 1] * v.float()[:, :, None]
    return merged.view(r, nh, hd).to(out.dtype)
