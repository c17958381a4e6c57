"""Rotary position embedding tables, matching transformers' ``ROPE_INIT_FUNCTIONS`` bit for bit.

Only the rope types an EAGLE-3 Llama draft can carry are implemented (default, linear, llama3,
yarn, and dynamic below its original length); the dimension is always the draft's ``head_dim``
(never derived from the 2H attention input: the seed's "RoPE dimension" bug).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import UnsupportedError

SUPPORTED_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


@dataclass(frozen=True)
class RopeSpec:
    """Normalised rope parameters (transformers 5 ``rope_parameters`` form)."""

    rope_type: str = "default"
    theta: float = 10000.0
    params: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def source(cfg: dict[str, Any]) -> tuple[str | None, dict[str, Any], str]:
        """Where the rope parameters live: the key (``rope_parameters`` (tf 5) or ``rope_scaling``
        (tf 4), None when neither), the parameter dict, and its dotted path for messages."""
        for key in ("rope_parameters", "rope_scaling"):
            params = cfg.get(key)
            if params:
                if isinstance(params, dict) and isinstance(params.get("sliding_attention"), dict):
                    # per-layer-type dict: speculators picks this one
                    return key, params["sliding_attention"], f"{key}.sliding_attention."
                return key, params, f"{key}."
        return None, {}, ""

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> RopeSpec:
        """Read ``rope_parameters`` (tf 5) or ``rope_theta`` + ``rope_scaling`` (tf 4); the values are
        validated by ``config.parse`` before a draft is built from them."""
        params = dict(cls.source(cfg)[1])
        rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
        params.pop("type", None)
        params = {k: v for k, v in params.items() if v is not None}  # null = absent, as in transformers
        theta = params.pop("rope_theta", None)
        theta = float(theta if theta is not None else _given(cfg, "rope_theta", 10000.0))
        max_pos = _given(cfg, "max_position_embeddings", 2048)
        if rope_type in ("llama3", "yarn", "longrope"):
            params.setdefault("original_max_position_embeddings",
                              _given(cfg, "original_max_position_embeddings", max_pos))
        params.setdefault("max_position_embeddings", max_pos)
        return cls(rope_type, theta, params)

    def to_dict(self) -> dict[str, Any]:
        return {"rope_type": self.rope_type, "rope_theta": self.theta, **self.params}


def _given(cfg: dict[str, Any], key: str, default: Any) -> Any:
    value = cfg.get(key)
    return default if value is None else value


def inv_freq(spec: RopeSpec, head_dim: int) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim/2] (fp32) and the cos/sin scale for ``spec``."""
    dim = int(head_dim * float(spec.params.get("partial_rotary_factor", 1.0)))
    base = spec.theta
    freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))
    p = spec.params
    if spec.rope_type == "default":
        return freq, 1.0
    if spec.rope_type == "linear":
        return freq / float(p["factor"]), 1.0
    if spec.rope_type == "dynamic":  # equals default below the original length (check_range)
        return freq, 1.0
    if spec.rope_type == "llama3":
        return _llama3(freq, p), 1.0
    if spec.rope_type == "yarn":
        return _yarn(base, dim, p)
    raise UnsupportedError(
        f"Rope type {spec.rope_type!r} is not implemented",
        expected=" / ".join(SUPPORTED_TYPES), found=spec.rope_type,
        fix="add it to remote/drafter/model/rope.py (copy transformers' init function)",
    )


def check_range(spec: RopeSpec, max_position: int) -> None:
    """Refuse positions where dynamic-NTK rope would rescale (not implemented)."""
    limit = int(spec.params.get("max_position_embeddings", 2048))
    if spec.rope_type == "dynamic" and max_position > limit:
        raise UnsupportedError(
            "Dynamic-NTK rope beyond its original length is not implemented",
            expected=f"positions <= {limit}", found=f"{max_position}",
            fix="evaluate on shorter samples (--max-len) or use a draft with static rope",
        )


def _llama3(freq: torch.Tensor, p: dict[str, Any]) -> torch.Tensor:
    factor = p["factor"]
    low, high = p["low_freq_factor"], p["high_freq_factor"]
    old = p["original_max_position_embeddings"]
    low_wl, high_wl = old / low, old / high
    wavelen = 2 * math.pi / freq
    out = torch.where(wavelen > low_wl, freq / factor, freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, out)


def _yarn(base: float, dim: int, p: dict[str, Any]) -> tuple[torch.Tensor, float]:
    orig = p["original_max_position_embeddings"]
    factor = p.get("factor") or p["max_position_embeddings"] / orig

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attn = p.get("attention_factor")
    if attn is None:
        m, m_all = p.get("mscale"), p.get("mscale_all_dim")
        attn = float(mscale(factor, m) / mscale(factor, m_all)) if m and m_all else mscale(factor)
    beta_fast, beta_slow = p.get("beta_fast") or 32, p.get("beta_slow") or 1

    def corr_dim(rot: float) -> float:
        return (dim * math.log(orig / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extra = 1 - ramp
    freq = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
    return freq, float(attn)


def cos_sin(positions: torch.Tensor, freq: torch.Tensor, scale: float,
            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [..., head_dim] for integer ``positions``, computed in fp32 like HF."""
    f = freq.to(positions.device, torch.float32)
    angles = positions.to(torch.float32).unsqueeze(-1) * f
    emb = torch.cat((angles, angles), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Full neox rotation of x [B, heads, N, hd] with cos/sin [B, N, hd]."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
