"""Load an EAGLE-3 draft checkpoint in either config format, inferring structure from the weights.

Formats (reference §1): *speculators* (``speculators_model_type`` + nested
``transformer_layer_config``, layers named ``layers.*``) and *flat* (``LlamaForCausalLMEagle3``:
the top level is the Llama config, layer 0 named ``midlayer.*``, ids under ``eagle_config``).
The config is trusted only for what the weights cannot show (heads, eps, rope, the norm flags);
widths, the number of aux slots, head_dim, norms present and vocab sizes come from the tensors.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .errors import (
    ConfigError,
    MissingTensorError,
    ShapeMismatchError,
    UnsupportedError,
)
from .model import DraftArch, Eagle3Draft
from .rope import RopeSpec
from .tensorstore import TensorStore
from .verifier import Verifier

SPECULATORS, FLAT = "speculators", "flat"
_LLAMA_DEFAULTS = {"num_attention_heads": 32, "rms_norm_eps": 1e-6}  # transformers LlamaConfig


@dataclass
class CheckpointInfo:
    """What was loaded and how; becomes the report's ``checkpoint`` section."""

    format: str
    path: str
    config_path: str
    weight_files: list[str]
    configured_layer_ids: list[int] | None
    layer_ids_key: str | None
    embed_source: str
    arch: DraftArch
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "path": self.path, "config_path": self.config_path,
                "weight_files": self.weight_files, "configured_layer_ids": self.configured_layer_ids,
                "layer_ids_key": self.layer_ids_key, "embed_source": self.embed_source,
                "structure": self.arch.to_dict(), "warnings": self.warnings}


def load_checkpoint(path: str | Path, config_file: str | Path | None = None,
                    verifier: Verifier | None = None, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple[Eagle3Draft, CheckpointInfo]:
    """Read config + weights of the draft at ``path``; returns the runnable draft and its info."""
    path = Path(path)
    cfg, cfg_path = read_config(path, config_file)
    fmt = detect_format(cfg, cfg_path)
    store = TensorStore.open(path)
    names = {canonical_name(n): n for n in store.names()}
    warnings: list[str] = []
    arch = infer_arch(cfg, fmt, store, names, verifier, warnings, cfg_path)
    weights = {canon: store.get(orig) for canon, orig in names.items()
               if canon != "embed_tokens.weight" and not canon.startswith("verifier_")}
    embed_source = "checkpoint"
    if "embed_tokens.weight" in names:
        weights["embed_tokens.weight"] = store.get(names["embed_tokens.weight"])
    else:
        weights["embed_tokens.weight"] = _verifier(verifier, path).embed_tokens()
        embed_source = "verifier"
    weights.update(_vocab_maps(arch, weights, names, store, path))
    origins = {canon: str(store.info(orig).path) for canon, orig in names.items()}
    if embed_source == "verifier":
        origins["embed_tokens.weight"] = f"verifier {verifier.path if verifier else ''}".strip()
    check_shapes(arch, weights, origins, str(path))
    ids, key = configured_layer_ids(cfg, fmt)
    if ids is not None and len(ids) != arch.num_aux:
        warnings.append(f"config lists {len(ids)} aux layer ids but fc.weight takes {arch.num_aux} slots; "
                        "the weights win")
    if arch.norm_before_residual:
        warnings.append("norm_before_residual=true: SGLang's LlamaForCausalLMEagle3 ignores this flag "
                        "(its residual is always the un-normed hidden), so SGLang serves a different model")
    info = CheckpointInfo(fmt, str(path), str(cfg_path), [str(f) for f in store.files], ids, key,
                          embed_source, arch, warnings)
    return Eagle3Draft(arch, weights, device, dtype), info


def read_config(path: Path, config_file: str | Path | None) -> tuple[dict[str, Any], Path]:
    """The JSON config: ``config_file`` when given, else ``path/config.json``."""
    cfg_path = Path(config_file) if config_file else (path / "config.json" if path.is_dir()
                                                      else path.parent / "config.json")
    if not cfg_path.is_file():
        raise ConfigError("The draft config file does not exist", path=cfg_path,
                          fix="pass --config FILE (e.g. the config_speculators.json backup)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"The draft config is not valid JSON ({exc})", path=cfg_path,
                          fix="repair it or pass --config with a good copy") from exc
    if not isinstance(cfg, dict):
        raise ConfigError("The draft config is not a JSON object", path=cfg_path,
                          fix="pass --config with the draft's config.json")
    return cfg, cfg_path


def detect_format(cfg: dict[str, Any], cfg_path: Path) -> str:
    """speculators when ``speculators_model_type``/``transformer_layer_config`` is there, else flat."""
    if "speculators_model_type" in cfg or "transformer_layer_config" in cfg:
        return SPECULATORS
    if "hidden_size" in cfg or any("Eagle3" in a for a in cfg.get("architectures") or []):
        return FLAT
    raise ConfigError(
        "The config is neither speculators nor flat LlamaForCausalLMEagle3 format", path=cfg_path,
        expected="'speculators_model_type' or 'hidden_size' at top level", found=sorted(cfg)[:8],
        fix="pass --config with the draft's own config.json",
    )


def layer_config(cfg: dict[str, Any], fmt: str) -> dict[str, Any]:
    return dict(cfg.get("transformer_layer_config") or {}) if fmt == SPECULATORS else cfg


def configured_layer_ids(cfg: dict[str, Any], fmt: str) -> tuple[list[int] | None, str | None]:
    """Aux ids as written, and the key they came from (vLLM's lookup order)."""
    if cfg.get("eagle_aux_hidden_state_layer_ids") is not None:
        return [int(i) for i in cfg["eagle_aux_hidden_state_layer_ids"]], "eagle_aux_hidden_state_layer_ids"
    eagle = cfg.get("eagle_config") or {}
    if eagle.get("eagle_aux_hidden_state_layer_ids") is not None:
        return ([int(i) for i in eagle["eagle_aux_hidden_state_layer_ids"]],
                "eagle_config.eagle_aux_hidden_state_layer_ids")
    return None, None


def canonical_name(name: str) -> str:
    """speculators naming: ``midlayer.`` -> ``layers.0.``, ``midlayers.j``/``model.`` prefixes dropped."""
    name = re.sub(r"^model\.", "", name)
    name = re.sub(r"^midlayer\.", "layers.0.", name)
    return re.sub(r"^midlayers\.(\d+)\.", r"layers.\1.", name)


def infer_arch(cfg: dict[str, Any], fmt: str, store: TensorStore, names: dict[str, str],
               verifier: Verifier | None, warnings: list[str], cfg_path: Path) -> DraftArch:
    """Structure from the weights, with the config filling in what weights cannot show."""
    tlc = layer_config(cfg, fmt)

    def shape(canon: str) -> tuple[int, ...]:
        if canon not in names:
            raise MissingTensorError("A draft tensor is missing", path=", ".join(map(str, store.files)),
                                     tensor=canon, expected="present", found="absent",
                                     fix="use the complete checkpoint folder written by the trainer")
        return store.shape(names[canon])

    hidden, fc_in = shape("fc.weight")
    cfg_hidden = tlc.get("hidden_size")
    if cfg_hidden is not None and int(cfg_hidden) != hidden:
        raise ShapeMismatchError(
            "The config's hidden_size disagrees with fc.weight", path=cfg_path, tensor="fc.weight",
            expected=f"[{cfg_hidden}, A*{cfg_hidden}]", found=[hidden, fc_in],
            fix="pass --config with the config that belongs to these weights",
        )
    aux_hidden = int(cfg.get("target_hidden_size") or tlc.get("target_hidden_size") or hidden)
    if fc_in % aux_hidden:
        raise ShapeMismatchError(
            "fc.weight's input width is not a whole number of aux slots × hidden size",
            path=store.info(names["fc.weight"]).path, tensor="fc.weight",
            expected=f"[{hidden}, A*{aux_hidden}] for an integer A", found=[hidden, fc_in],
            fix="set target_hidden_size in the config to the target's hidden size, or use the "
                "fc.weight this draft was trained with",
        )
    q_rows = shape("layers.0.self_attn.q_proj.weight")[0]
    heads = tlc.get("num_attention_heads")
    if heads is None and tlc.get("head_dim"):
        heads = q_rows // int(tlc["head_dim"])
    if heads is None:
        heads = _LLAMA_DEFAULTS["num_attention_heads"]
        warnings.append(f"config has no num_attention_heads; using the transformers default {heads}")
    heads = int(heads)
    if q_rows % heads:
        raise ShapeMismatchError(
            "q_proj rows are not a multiple of num_attention_heads",
            path=cfg_path, tensor="layers.0.self_attn.q_proj.weight",
            expected=f"rows divisible by {heads}", found=[q_rows],
            fix="fix num_attention_heads in the config")
    head_dim = q_rows // heads
    if tlc.get("head_dim") and int(tlc["head_dim"]) != head_dim:
        warnings.append(f"config head_dim={tlc['head_dim']} but q_proj implies {head_dim}; using {head_dim}")
    kv_rows = shape("layers.0.self_attn.k_proj.weight")[0]
    num_layers = 1 + max(int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n)))
    if tlc.get("hidden_act", "silu") != "silu":
        raise UnsupportedError("Only SiLU-gated MLP drafts are implemented", path=cfg_path,
                               tensor="hidden_act", expected="silu", found=tlc.get("hidden_act"),
                               fix="extend remote/drafter/layers.py:mlp")
    vocab = _target_vocab(names, store, tlc, verifier)
    layer_types = tlc.get("layer_types") or []
    window = tlc.get("sliding_window")
    windows = tuple(int(window) if window and i < len(layer_types) and layer_types[i] == "sliding_attention"
                    else None for i in range(num_layers))
    nbf = "input_norm.weight" in names
    if cfg.get("norm_before_fc") and not nbf:
        raise MissingTensorError("norm_before_fc is set but the checkpoint has no input_norm.weight",
                                 path=", ".join(map(str, store.files)), tensor="input_norm.weight",
                                 expected=f"[{fc_in}]", found="absent",
                                 fix="use the checkpoint the trainer wrote, or set norm_before_fc=false")
    return DraftArch(
        hidden_size=hidden, num_heads=heads, num_kv_heads=kv_rows // head_dim, head_dim=head_dim,
        intermediate_size=shape("layers.0.mlp.gate_proj.weight")[0], num_layers=num_layers,
        num_aux=fc_in // aux_hidden, aux_hidden_size=aux_hidden,
        draft_vocab_size=shape("lm_head.weight")[0], vocab_size=vocab,
        rms_norm_eps=float(tlc.get("rms_norm_eps", _LLAMA_DEFAULTS["rms_norm_eps"])),
        rope=RopeSpec.from_config(tlc),
        norm_before_residual=bool(cfg.get("norm_before_residual", False)),
        norm_output=bool(cfg.get("norm_output", False)),
        norm_before_fc=nbf, fc_norm="fc_norm.0.weight" in names,
        qk_norm="layers.0.self_attn.q_norm.weight" in names, sliding_windows=windows,
    )


def _target_vocab(names: dict[str, str], store: TensorStore, tlc: dict[str, Any],
                  verifier: Verifier | None) -> int:
    if "embed_tokens.weight" in names:
        return store.shape(names["embed_tokens.weight"])[0]
    if "t2d" in names:
        return store.shape(names["t2d"])[0]
    if verifier is not None and verifier.embed_name:
        return verifier.store.shape(verifier.embed_name)[0]
    return int(tlc.get("vocab_size", 32000))


def _verifier(verifier: Verifier | None, path: Path) -> Verifier:
    if verifier is None:
        raise MissingTensorError(
            "The draft checkpoint has no embed_tokens.weight and no verifier was given",
            path=path, tensor="embed_tokens.weight", expected="in the checkpoint or the verifier",
            found="absent", fix="pass --verifier DIR (the target model folder)",
        )
    return verifier


def _vocab_maps(arch: DraftArch, weights: dict[str, torch.Tensor], names: dict[str, str],
                store: TensorStore, path: Path) -> dict[str, torch.Tensor]:
    """d2t/t2d as stored, an identity for a full-vocab draft, and a consistency check."""
    if "d2t" not in weights:
        if arch.draft_vocab_size != arch.vocab_size:
            raise MissingTensorError(
                "The draft vocab is smaller than the target's but d2t is missing",
                path=path, tensor="d2t", expected=f"[{arch.draft_vocab_size}] int64", found="absent",
                fix="copy d2t/t2d from the training output into the checkpoint",
            )
        return {"d2t": torch.zeros(arch.draft_vocab_size, dtype=torch.long)}
    d2t = weights["d2t"].to(torch.long)
    targets = d2t + torch.arange(d2t.shape[0])
    out = {"d2t": d2t}
    if "t2d" in weights:
        t2d = weights["t2d"].to(torch.bool)
        if t2d.shape[0] != arch.vocab_size or not torch.equal(torch.nonzero(t2d).flatten(),
                                                              targets.sort().values):
            raise ShapeMismatchError(
                "t2d does not select the same target ids as d2t",
                path=store.info(names["t2d"]).path, tensor="t2d",
                expected=f"[{arch.vocab_size}] bool with {arch.draft_vocab_size} true at d + d2t[d]",
                found=f"{list(t2d.shape)} with {int(t2d.sum())} true",
                fix="use the d2t/t2d pair written together by the trainer",
            )
        out["t2d"] = t2d
    if int(targets.min()) < 0 or int(targets.max()) >= arch.vocab_size:
        raise ShapeMismatchError("d2t maps draft ids outside the target vocab", path=path, tensor="d2t",
                                 expected=f"targets in [0, {arch.vocab_size})",
                                 found=f"[{int(targets.min())}, {int(targets.max())}]",
                                 fix="use the d2t written with this checkpoint")
    return out


def expected_shapes(arch: DraftArch) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor the forward reads, for ``arch``."""
    h, hd = arch.hidden_size, arch.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, arch.num_aux * arch.aux_hidden_size),
        "embed_tokens.weight": (arch.vocab_size, h),
        "norm.weight": (h,), "lm_head.weight": (arch.draft_vocab_size, h),
        "d2t": (arch.draft_vocab_size,), "layers.0.hidden_norm.weight": (h,),
    }
    if arch.norm_before_fc:
        shapes["input_norm.weight"] = (arch.num_aux * arch.aux_hidden_size,)
    for i in range(arch.num_aux if arch.fc_norm else 0):
        shapes[f"fc_norm.{i}.weight"] = (arch.aux_hidden_size,)
    for j in range(arch.num_layers):
        p, width = f"layers.{j}.", (2 * h if j == 0 else h)
        shapes.update({
            p + "self_attn.q_proj.weight": (arch.num_heads * hd, width),
            p + "self_attn.k_proj.weight": (arch.num_kv_heads * hd, width),
            p + "self_attn.v_proj.weight": (arch.num_kv_heads * hd, width),
            p + "self_attn.o_proj.weight": (h, arch.num_heads * hd),
            p + "mlp.gate_proj.weight": (arch.intermediate_size, h),
            p + "mlp.up_proj.weight": (arch.intermediate_size, h),
            p + "mlp.down_proj.weight": (h, arch.intermediate_size),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
        if arch.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (hd,)
            shapes[p + "self_attn.k_norm.weight"] = (hd,)
    return shapes


def check_shapes(arch: DraftArch, weights: dict[str, torch.Tensor], origins: dict[str, str],
                 folder: str) -> None:
    """Every needed tensor present with the shape ``arch`` implies (``origins``: file per tensor)."""
    for name, want in expected_shapes(arch).items():
        if name not in weights:
            raise MissingTensorError("A draft tensor is missing", path=folder, tensor=name,
                                     expected=list(want), found="absent",
                                     fix="use the complete checkpoint folder written by the trainer")
        got = tuple(weights[name].shape)
        if got != want:
            raise ShapeMismatchError(
                "A tensor has the wrong shape for the structure the other tensors imply",
                path=origins.get(name, folder), tensor=name, expected=list(want), found=list(got),
                fix="make sure the checkpoint, its config and --verifier belong together")
