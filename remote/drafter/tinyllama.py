"""A tiny Llama-style target model for the demo: init, a forward that captures every layer
boundary, sampling, and saving in HF layout (so ``--verifier`` can read it like a real target)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from . import layers, rope
from .layers import AttnShape, KVCache, Weights


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 64
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 6
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 16
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    windows: tuple[int, ...] = (2, 1, 1, 1, 1, 1)  # attention window per layer (keys incl. self)

    @property
    def receptive_field(self) -> int:
        """Tokens the last position's logits depend on (sampling only recomputes these)."""
        return 1 + sum(w - 1 for w in self.windows)

    def hf_config(self) -> dict:
        cfg = asdict(self)
        windows = cfg.pop("windows")
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **cfg,
                "hidden_act": "silu", "max_position_embeddings": 4096, "tie_word_embeddings": False,
                "torch_dtype": "float32", "draftops_attention_windows": windows}


def init_weights(cfg: TinyConfig, gen: torch.Generator, embed_std: float = 0.02,
                 proj_std: float = 0.15, head_std: float = 0.3) -> Weights:
    """Random weights in HF naming; std values chosen so layers add real structure."""
    h, hd = cfg.hidden_size, cfg.head_dim

    def rand(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * std

    w: Weights = {"model.embed_tokens.weight": rand(cfg.vocab_size, h, std=embed_std),
                  "model.norm.weight": torch.ones(h), "lm_head.weight": rand(cfg.vocab_size, h, std=head_std)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.update({
            p + "self_attn.q_proj.weight": rand(cfg.num_attention_heads * hd, h, std=proj_std),
            p + "self_attn.k_proj.weight": rand(cfg.num_key_value_heads * hd, h, std=proj_std),
            p + "self_attn.v_proj.weight": rand(cfg.num_key_value_heads * hd, h, std=proj_std),
            p + "self_attn.o_proj.weight": rand(h, cfg.num_attention_heads * hd, std=proj_std),
            p + "mlp.gate_proj.weight": rand(cfg.intermediate_size, h, std=proj_std),
            p + "mlp.up_proj.weight": rand(cfg.intermediate_size, h, std=proj_std),
            p + "mlp.down_proj.weight": rand(h, cfg.intermediate_size, std=proj_std),
            p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
        })
    return w


def forward(cfg: TinyConfig, w: Weights, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] -> (states [B, T, n+1, H] after 0..n layers, pre-norm; logits [B, T, V])."""
    b, t = ids.shape
    shapes = [AttnShape(cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps,
                        window=wnd) for wnd in cfg.windows]
    freq, scale = rope.inv_freq(rope.RopeSpec(theta=cfg.rope_theta), cfg.head_dim)
    cs = rope.cos_sin(torch.arange(t).expand(b, t), freq, scale, torch.float32)
    valid = torch.ones(b, t, dtype=torch.bool)
    h = w["model.embed_tokens.weight"][ids]
    states = [h]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        x = layers.rms_norm(h, w[p + "input_layernorm.weight"], cfg.rms_norm_eps)
        h = h + layers.attention(x, w, p + "self_attn.", shapes[i], cs, KVCache(), valid)
        h = h + layers.mlp(layers.rms_norm(h, w[p + "post_attention_layernorm.weight"], cfg.rms_norm_eps),
                           w, p + "mlp.")
        states.append(h)
    logits = layers.rms_norm(h, w["model.norm.weight"], cfg.rms_norm_eps) @ w["lm_head.weight"].T
    return torch.stack(states, dim=2), logits


def sample(cfg: TinyConfig, w: Weights, prompts: torch.Tensor, length: int, temperature: float,
           gen: torch.Generator) -> torch.Tensor:
    """Extend ``prompts`` [B, P] to ``length`` tokens by sampling the model; each step reruns only
    the receptive field (rope is relative, so the absolute offset does not matter)."""
    ids = prompts
    while ids.shape[1] < length:
        _, logits = forward(cfg, w, ids[:, -cfg.receptive_field:])
        probs = torch.softmax(logits[:, -1] / temperature, dim=-1)
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], dim=1)
    return ids


def save(cfg: TinyConfig, w: Weights, folder: Path, shards: int = 2) -> None:
    """HF layout: config.json + sharded safetensors with a weight-map index."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg.hf_config(), indent=2) + "\n")
    names = sorted(w)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: w[n].contiguous() for n in part}, str(folder / fname))
        weight_map.update({n: fname for n in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in w.values())},
             "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
