"""A tiny standard Llama for the demo target: init, a forward that captures every layer boundary,
sampling, greedy decoding, and reading/writing the HF folder layout.

The model is exactly ``transformers``' ``LlamaForCausalLM`` (full causal attention, default rope, no
custom fields), so vLLM and SGLang load the saved folder as is and compute what this module computes.
``head_dim`` is 32 because vLLM's CPU attention supports head sizes of 32 and up.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ... import jsonread
from ..errors import ConfigError, MissingTensorError
from ..store.tensorstore import TensorStore
from . import layers, rope
from .layers import AttnShape, KVCache, Weights


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 64
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 6
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 32
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    bos_token_id: int = 1
    eos_token_id: int = 2

    def hf_config(self) -> dict[str, Any]:
        """config.json of a standard ``LlamaForCausalLM`` (read the same by transformers 4 and 5)."""
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **asdict(self),
                "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
                "rope_scaling": None, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
                "tie_word_embeddings": False, "torch_dtype": "float32", "use_cache": True}

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], path: Path) -> TinyConfig:
        """The fields this module needs, refusing what it does not implement (it would compute
        something other than what a server computes)."""
        if cfg.get("model_type") != "llama":
            raise ConfigError("Only Llama targets can be decoded here (field model_type)", path=path,
                              expected="llama", found=cfg.get("model_type"))
        for key, ok in (("rope_scaling", None), ("sliding_window", None)):
            if cfg.get(key) not in (ok, {}):
                raise ConfigError(f"This target needs a feature the tiny decoder does not implement "
                                  f"(field {key})", path=path, expected=ok, found=cfg.get(key))
        rope_type = (cfg.get("rope_parameters") or {}).get("rope_type", "default")
        if rope_type != "default":
            raise ConfigError("Only default rope is implemented (field rope_parameters.rope_type)",
                              path=path, expected="default", found=rope_type)
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in cfg.items() if k in names}
        values.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
        values["rope_theta"] = float((cfg.get("rope_parameters") or {}).get("rope_theta",
                                                                              cfg.get("rope_theta", 10000.0)))
        return cls(**values)


#: RoPE pair amplitudes (head_dim 32, rope_theta 10000; found by a linear program) whose attention
#: score peaks at relative distance 0 (``SELF``) or equally at 0 and 1 (``PAIR``, the query rotated
#: back by half a position) and stays below 75% (67%) of that peak at every other distance < 2048.
SELF_PAIRS = (1.0, .14, .09, .04, .12, .07, .06, .08, .05, .05, .03, .07, 0.0, 0.0, 0.0, 0.0)
PAIR_PAIRS = (1.0, .26, .23, .25, .22, .09, .15, .12, .07, .13, .05, .26, 0.0, 0.0, 0.0, 0.0)
MAX_PEAK_RATIO = 0.8


def peak_ratio(cfg: TinyConfig, amplitudes: tuple[float, ...], shift: float) -> float:
    """Largest score at a distance outside the peak, as a share of the peak (distances < max pos)."""
    freq, _ = rope.inv_freq(rope.RopeSpec(theta=cfg.rope_theta), cfg.head_dim)
    d = torch.arange(cfg.max_position_embeddings, dtype=torch.float64)[:, None] - shift
    g = torch.cos(d * freq.to(torch.float64)) @ torch.tensor(amplitudes, dtype=torch.float64)
    first_other = 1 if shift == 0 else 2
    return float(g[first_other:].max() / g[0])


def _positional_qk(cfg: TinyConfig, amplitudes: tuple[float, ...], shift: float, sharpness: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """q/k projections that read only hidden dim 0, which is the same for every token: the scores
    then depend on the relative position alone, ``sum_j a_j cos(theta_j (d - shift))``, scaled
    until the softmax is hard."""
    half, hd = cfg.head_dim // 2, cfg.head_dim
    if len(amplitudes) != half or peak_ratio(cfg, amplitudes, shift) > MAX_PEAK_RATIO:
        raise ValueError(f"the demo's positional attention is tuned for head_dim 32 and rope_theta 10000 "
                         f"up to 2048 positions; got head_dim {hd}, rope_theta {cfg.rope_theta}, "
                         f"max_position_embeddings {cfg.max_position_embeddings}")
    freq, _ = rope.inv_freq(rope.RopeSpec(theta=cfg.rope_theta), hd)
    amp = sharpness * torch.tensor(amplitudes).sqrt()
    phase = -shift * freq
    q = torch.zeros(cfg.num_attention_heads * hd, cfg.hidden_size)
    k = torch.zeros(cfg.num_key_value_heads * hd, cfg.hidden_size)
    for head in range(cfg.num_attention_heads):
        q[head * hd:head * hd + half, 0] = amp * torch.cos(phase)
        q[head * hd + half:(head + 1) * hd, 0] = amp * torch.sin(phase)
    for head in range(cfg.num_key_value_heads):
        k[head * hd:head * hd + half, 0] = amp
    return q, k


def init_weights(cfg: TinyConfig, gen: torch.Generator, proj_std: float = 0.15, head_std: float = 1.0,
                 embed_rms: float = 0.02, sharpness: float = 4.0) -> Weights:
    """Random weights around a fixed positional skeleton, in HF naming.

    Embedding rows have equal norms and the same value in dim 0, so after layer 0's RMSNorm dim 0
    is one constant for every token.  Layer 0's q/k projections read only that dim: its attention
    depends on position alone and puts half its weight on the previous token and half on the
    current one.  Later layers keep random q/k/v but their ``o_proj`` is zero, so they add nothing
    from other positions.  The model is a standard full-attention Llama whose next token is a
    function of the last two tokens, which keeps the demo's language learnable by a one-layer draft
    in seconds; values, MLPs and lm_head are random, so every layer still transforms the state
    (which layers a draft reads matters)."""
    h, hd, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size

    def rand(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    unit = torch.randn(cfg.vocab_size, h - 1, generator=gen)
    unit = unit / unit.norm(dim=1, keepdim=True)
    embed = torch.cat([torch.ones(cfg.vocab_size, 1), unit], dim=1) * (embed_rms * h ** 0.5 / 2 ** 0.5)
    w: Weights = {"model.embed_tokens.weight": embed, "model.norm.weight": torch.ones(h),
                  "lm_head.weight": rand(cfg.vocab_size, h, std=head_std)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        if i == 0:
            q, k = _positional_qk(cfg, PAIR_PAIRS, 0.5, sharpness)
            v = rand(cfg.num_key_value_heads * hd, h, std=proj_std)
            v[:, 0] = 0.0  # values carry the tokens, not the constant dim
            o = rand(h, cfg.num_attention_heads * hd, std=proj_std)
            gain = torch.full((h,), float((2 * (h - 1) / h) ** 0.5))  # content back to unit RMS per dim
            gain[0] = 1.0
        else:
            q = rand(cfg.num_attention_heads * hd, h, std=proj_std)
            k = rand(cfg.num_key_value_heads * hd, h, std=proj_std)
            v = rand(cfg.num_key_value_heads * hd, h, std=proj_std)
            o = torch.zeros(h, cfg.num_attention_heads * hd)
            gain = torch.ones(h)
        w.update({
            p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
            p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": o,
            p + "mlp.gate_proj.weight": rand(inter, h, std=proj_std),
            p + "mlp.up_proj.weight": rand(inter, h, std=proj_std),
            p + "mlp.down_proj.weight": rand(h, inter, std=proj_std),
            p + "input_layernorm.weight": gain, p + "post_attention_layernorm.weight": torch.ones(h),
        })
    return w


def forward(cfg: TinyConfig, w: Weights, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] -> (states [B, T, n+1, H] after 0..n layers, pre-norm; logits [B, T, V]).

    Positions are 0..T-1, as a server numbers a prompt's tokens."""
    b, t = ids.shape
    shape = AttnShape(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps)
    freq, scale = rope.inv_freq(rope.RopeSpec(theta=cfg.rope_theta), cfg.head_dim)
    cs = rope.cos_sin(torch.arange(t).expand(b, t), freq, scale, torch.float32)
    valid = torch.ones(b, t, dtype=torch.bool)
    h = w["model.embed_tokens.weight"][ids]
    states = [h]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = layers.rms_norm(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        h = h + layers.attention(x, w, p + "self_attn.", shape, cs, KVCache(), valid)
        h = h + layers.mlp(layers.rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps),
                           w, p + "mlp.")
        states.append(h)
    logits = layers.rms_norm(h, w["model.norm.weight"], cfg.rms_norm_eps) @ w["lm_head.weight"].T
    return torch.stack(states, dim=2), logits


class _Decoder:
    """Incremental decoding with a per-layer KV cache: each step runs one new token per row, so
    sampling costs one forward over the whole sequence instead of one per generated token."""

    def __init__(self, cfg: TinyConfig, w: Weights, batch: int, length: int) -> None:
        self.cfg, self.w = cfg, w
        self.freq, self.scale = rope.inv_freq(rope.RopeSpec(theta=cfg.rope_theta), cfg.head_dim)
        shape = (batch, cfg.num_key_value_heads, length, cfg.head_dim)
        self.k = [torch.zeros(shape) for _ in range(cfg.num_hidden_layers)]
        self.v = [torch.zeros(shape) for _ in range(cfg.num_hidden_layers)]
        self.pos = 0

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, n] at positions pos..pos+n-1 -> logits [B, n, V]."""
        cfg, w = self.cfg, self.w
        b, n = ids.shape
        start, end = self.pos, self.pos + n
        cos, sin = rope.cos_sin(torch.arange(start, end).expand(b, n), self.freq, self.scale, torch.float32)
        hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]  # [n, end]
        h = w["model.embed_tokens.weight"][ids]
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            x = layers.rms_norm(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
            q = layers.linear(x, w, p + "self_attn.q_proj").view(b, n, nh, hd).transpose(1, 2)
            k = layers.linear(x, w, p + "self_attn.k_proj").view(b, n, nkv, hd).transpose(1, 2)
            self.k[i][:, :, start:end] = rope.apply(k, cos, sin)
            self.v[i][:, :, start:end] = layers.linear(x, w, p + "self_attn.v_proj").view(b, n, nkv, hd).transpose(1, 2)
            q = rope.apply(q, cos, sin).reshape(b, nkv, nh // nkv * n, hd)
            scores = (q @ self.k[i][:, :, :end].transpose(-1, -2) * hd ** -0.5).view(b, nkv, nh // nkv, n, end)
            probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).view(b, nkv, -1, end)
            attn = (probs @ self.v[i][:, :, :end]).view(b, nh, n, hd).transpose(1, 2).reshape(b, n, nh * hd)
            h = h + layers.linear(attn, w, p + "self_attn.o_proj")
            h = h + layers.mlp(layers.rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps),
                               w, p + "mlp.")
        self.pos = end
        return layers.rms_norm(h, w["model.norm.weight"], cfg.rms_norm_eps) @ w["lm_head.weight"].T


def sample(cfg: TinyConfig, w: Weights, prompts: torch.Tensor, length: int, temperature: float,
           gen: torch.Generator) -> torch.Tensor:
    """Extend ``prompts`` [B, P] to ``length`` tokens by sampling the model at ``temperature``."""
    decoder = _Decoder(cfg, w, prompts.shape[0], length)
    ids, logits = prompts, decoder.step(prompts)
    while ids.shape[1] < length:
        probs = torch.softmax(logits[:, -1] / temperature, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen)
        ids = torch.cat([ids, nxt], dim=1)
        if ids.shape[1] < length:
            logits = decoder.step(nxt)
    return ids


def greedy(cfg: TinyConfig, w: Weights, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The ``max_new_tokens`` tokens a greedy (temperature 0) server returns for ``prompt``."""
    if not prompt:
        raise ValueError("greedy decoding needs a non-empty prompt")
    bad = [i for i in prompt if not 0 <= i < cfg.vocab_size]
    if bad:
        raise ValueError(f"prompt ids {bad} are outside the vocabulary 0..{cfg.vocab_size - 1}")
    ids = torch.tensor([prompt], dtype=torch.long)
    with torch.inference_mode():
        for _ in range(max_new_tokens):
            _, logits = forward(cfg, w, ids)
            ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[0, len(prompt):].tolist()


def save(cfg: TinyConfig, w: Weights, folder: Path) -> None:
    """HF layout: config.json, generation_config.json and one model.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({n: w[n].contiguous() for n in sorted(w)}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg.hf_config(), indent=2) + "\n")
    generation = {"bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")


def load(folder: str | Path) -> tuple[TinyConfig, Weights]:
    """Read a Llama folder written by :func:`save` (or any small standard Llama checkpoint)."""
    folder = Path(folder)
    file = folder / "config.json"
    try:
        raw = jsonread.load(file)
    except OSError as exc:
        raise ConfigError(f"Cannot read the target config ({exc.strerror})", path=file,
                          fix="pass the target model folder (config.json + safetensors)") from exc
    except ValueError as exc:
        raise ConfigError(f"The target config.json is not valid JSON ({exc})", path=file,
                          fix="repair the file or regenerate the demo") from exc
    cfg = TinyConfig.from_hf(raw, file)
    store = TensorStore.open(folder)  # get() refuses NaN/inf with a NonFiniteError naming file and tensor
    weights = {n: store.get(n).to(torch.float32) for n in store.names()}
    for name in _expected_names(cfg):
        if name not in weights:
            raise MissingTensorError("The target checkpoint lacks a tensor of its config's architecture",
                                     path=folder, tensor=name, expected="present", found="absent",
                                     fix="pass a complete Llama folder (or regenerate the demo)")
    return cfg, weights


def _expected_names(cfg: TinyConfig) -> list[str]:
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        names += [p + f"self_attn.{x}_proj.weight" for x in "qkvo"]
        names += [p + f"mlp.{x}_proj.weight" for x in ("gate", "up", "down")]
        names += [p + "input_layernorm.weight", p + "post_attention_layernorm.weight"]
    return names
