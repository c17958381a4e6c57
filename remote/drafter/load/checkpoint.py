"""Load an EAGLE-3 draft checkpoint in any trainer's layout, inferring structure from the weights.

Config formats (``remote.eagle.formats``): *speculators* (nested ``transformer_layer_config``, layers
named ``layers.*``) and *flat* (``LlamaForCausalLMEagle3``: the top level is the Llama config, layer 0
named ``midlayer.*``, ids under ``eagle_config``); config.py reads and validates both. The layout
(``draftformat``: also ``modelopt`` and the EAGLE repository's ``eagle``) comes from config + weight
names and is the report's ``checkpoint.format``.
The config is trusted only for what the weights cannot show (heads, eps, rope, the norm flags);
widths, the number of aux slots, head_dim, norms present and vocab sizes come from the tensors.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from ...eagle import convention, formats
from ..errors import ConfigError, CorruptFileError, MissingTensorError, ShapeMismatchError
from ..model import rope
from ..model.draft import DraftArch, Eagle3Draft
from ..store.tensorstore import TensorStore
from . import config, draftformat, vocabmap
from .verifier import Verifier


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
    ids_by_engine: dict[str, list[int] | None] = field(default_factory=dict)   # what each engine reads
    vocab_map: vocabmap.MapFacts | None = None
    algorithm: str | None = None   # what the config declares (config.declared_algorithm)
    algorithm_source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "path": self.path, "config_path": self.config_path,
                "weight_files": self.weight_files, "configured_layer_ids": self.configured_layer_ids,
                "layer_ids_key": self.layer_ids_key, "embed_source": self.embed_source,
                "structure": self.arch.to_dict(), "warnings": self.warnings,
                "vocab_map": self.vocab_map.to_dict() if self.vocab_map else None,
                "algorithm": self.algorithm}


def load_checkpoint(path: str | Path, config_file: str | Path | None = None,
                    verifier: Verifier | None = None, device: str | torch.device = "cpu",
                    dtype: torch.dtype = torch.float32) -> tuple[Eagle3Draft, CheckpointInfo]:
    """Read config + weights of the draft at ``path``; returns the runnable draft and its info."""
    path = Path(path)
    raw, cfg_path = config.read_json(path, config_file)
    if formats.detect(raw) is None:   # a plain Llama config (EAGLE repo): only the weights say EAGLE-3
        store = TensorStore.open(path)
        cfg = config.parse(raw, cfg_path, draftformat.detect(raw, cfg_path, store.names()))
    else:
        cfg = config.parse(raw, cfg_path)
        store = TensorStore.open(path)
        cfg = replace(cfg, format=draftformat.detect(raw, cfg_path, store.names()) or cfg.format)
    names = {canonical_name(n): n for n in store.names()}
    warnings: list[str] = draftformat.notes(cfg.format, raw, store.names())
    arch = infer_arch(cfg, store, names, verifier, warnings)
    config.check_layer_ids(cfg, arch.num_aux, store.shape(names["fc.weight"]),
                           str(store.info(names["fc.weight"]).path))
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
    if cfg.format == draftformat.MODELOPT and (note := draftformat.modelopt_norm_note(
            weights["layers.0.input_layernorm.weight"])):
        warnings.append(note)
    _check_rope(arch, cfg)
    warnings += _unread_ids(cfg)
    info = CheckpointInfo(cfg.format, str(path), str(cfg.path), [str(f) for f in store.files], cfg.layer_ids,
                          cfg.layer_ids_key, embed_source, arch, warnings, dict(cfg.ids_by_engine),
                          vocabmap.MapFacts.of(weights["d2t"], arch.vocab_size, weights.get("t2d"),
                                               stored="d2t" in names),
                          cfg.algorithm, cfg.algorithm_source)
    return Eagle3Draft(arch, weights, device, dtype), info


def _unread_ids(cfg: config.DraftConfig) -> list[str]:
    """Ids the format's own engine never uses (e.g. top-level ids in a flat config, which SGLang ignores)."""
    engine = convention.serving_convention(cfg.format)
    name = convention.ENGINE_NAME[engine]
    reads = " then ".join(convention.READS[engine])
    used = f"it uses {cfg.layer_ids} from {cfg.layer_ids_key}" if cfg.layer_ids_key else "it captures its default"
    return [f"{field}={ids} is not used by {name}, which this {cfg.format} config is written for ({name} reads "
            f"{reads}; {used}); another engine may read it, so fix the ids in one place with `invoke "
            "draft-config`" for field, ids in cfg.unread_ids.items()]


def canonical_name(name: str) -> str:
    """speculators naming: ``midlayer.`` -> ``layers.0.``, ``midlayers.j``/``model.`` prefixes dropped."""
    name = re.sub(r"^model\.", "", name)
    name = re.sub(r"^midlayer\.", "layers.0.", name)
    return re.sub(r"^midlayers\.(\d+)\.", r"layers.\1.", name)


def infer_arch(cfg: config.DraftConfig, store: TensorStore, names: dict[str, str],
               verifier: Verifier | None, warnings: list[str]) -> DraftArch:
    """Structure from the weights, with the (validated) config filling in what weights cannot show."""
    def shape(canon: str) -> tuple[int, ...]:
        if canon not in names:
            raise MissingTensorError("A draft tensor is missing", path=", ".join(map(str, store.files)),
                                     tensor=canon, expected="present", found="absent",
                                     fix="use the complete checkpoint folder written by the trainer")
        return store.shape(names[canon])

    hidden, fc_in, aux_hidden = _fc_dims(cfg, shape("fc.weight"), store.info(names["fc.weight"]).path)
    heads, head_dim, kv_heads = _heads(cfg, shape("layers.0.self_attn.q_proj.weight")[0],
                                       shape("layers.0.self_attn.k_proj.weight")[0], warnings)
    num_layers = 1 + max(int(m.group(1)) for n in names if (m := re.match(r"layers\.(\d+)\.", n)))
    windows = tuple(cfg.sliding_window if cfg.sliding_window and i < len(cfg.layer_types)
                    and cfg.layer_types[i] == "sliding_attention" else None for i in range(num_layers))
    nbf = "input_norm.weight" in names
    if cfg.norm_before_fc and not nbf:
        raise MissingTensorError("norm_before_fc is set but the checkpoint has no input_norm.weight",
                                 path=", ".join(map(str, store.files)), tensor="input_norm.weight",
                                 expected=f"[{fc_in}]", found="absent",
                                 fix="use the checkpoint the trainer wrote, or set norm_before_fc=false")
    return DraftArch(
        hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=shape("layers.0.mlp.gate_proj.weight")[0], num_layers=num_layers,
        num_aux=fc_in // aux_hidden, aux_hidden_size=aux_hidden,
        draft_vocab_size=shape("lm_head.weight")[0], vocab_size=_target_vocab(names, store, cfg, verifier),
        rms_norm_eps=cfg.rms_norm_eps, rope=cfg.rope,
        norm_before_residual=cfg.norm_before_residual, norm_output=cfg.norm_output,
        norm_before_fc=nbf, fc_norm="fc_norm.0.weight" in names,
        qk_norm="layers.0.self_attn.q_norm.weight" in names, sliding_windows=windows,
    )


def _fc_dims(cfg: config.DraftConfig, fc_shape: tuple[int, ...], fc_file: Path) -> tuple[int, int, int]:
    """(hidden, fc input width, aux hidden size) from fc.weight, checked against the config."""
    if len(fc_shape) != 2:
        raise ShapeMismatchError("fc.weight is not a matrix", path=fc_file,
                                 tensor="fc.weight", expected="[H, A*H]", found=list(fc_shape),
                                 fix="use the fc.weight this draft was trained with")
    hidden, fc_in = fc_shape
    if cfg.hidden_size is not None and cfg.hidden_size != hidden:
        raise ShapeMismatchError(
            "The config's hidden_size disagrees with fc.weight", path=cfg.path,
            field=cfg.layer_field("hidden_size"), tensor="fc.weight",
            expected=f"[{cfg.hidden_size}, A*{cfg.hidden_size}]", found=[hidden, fc_in],
            fix="pass --config with the config that belongs to these weights",
        )
    aux_hidden = cfg.target_hidden_size or hidden
    if fc_in % aux_hidden:
        raise ShapeMismatchError(
            "fc.weight's input width is not a whole number of aux slots × hidden size",
            path=fc_file, tensor="fc.weight",
            expected=f"[{hidden}, A*{aux_hidden}] for an integer A", found=[hidden, fc_in],
            fix="set target_hidden_size in the config to the target's hidden size, or use the "
                "fc.weight this draft was trained with",
        )
    return hidden, fc_in, aux_hidden


def _heads(cfg: config.DraftConfig, q_rows: int, kv_rows: int, warnings: list[str]) -> tuple[int, int, int]:
    """(query heads, head_dim, key/value heads): head_dim from q_proj rows / heads, never 2H/heads."""
    heads = cfg.num_attention_heads
    if heads is None and cfg.head_dim:
        heads = max(1, q_rows // cfg.head_dim)
    if heads is None:
        heads = config.DEFAULT_HEADS
        warnings.append(f"config has no num_attention_heads; using the transformers default {heads}")
    heads_field = cfg.layer_field("num_attention_heads")
    if q_rows % heads:
        raise ShapeMismatchError(
            "q_proj rows are not a multiple of num_attention_heads",
            path=cfg.path, field=heads_field, tensor="layers.0.self_attn.q_proj.weight",
            expected=f"rows divisible by {heads}", found=[q_rows],
            fix="fix num_attention_heads in the config")
    head_dim = q_rows // heads
    if head_dim % 2:
        raise ShapeMismatchError(
            "head_dim (q_proj rows / num_attention_heads) is odd, so rotary embeddings cannot split it",
            path=cfg.path, field=heads_field, tensor="layers.0.self_attn.q_proj.weight",
            expected="an even head_dim", found=f"{q_rows} rows / {heads} heads = {head_dim}",
            fix="fix num_attention_heads in the config")
    if cfg.head_dim and cfg.head_dim != head_dim:
        warnings.append(f"config head_dim={cfg.head_dim} but q_proj implies {head_dim}; using {head_dim}")
    if kv_rows % head_dim or heads % max(1, kv_rows // head_dim):
        raise ShapeMismatchError(
            "k_proj rows do not make a whole number of key/value heads that divides the query heads",
            path=cfg.path, field=heads_field, tensor="layers.0.self_attn.k_proj.weight",
            expected=f"a multiple of head_dim {head_dim} that divides {heads} heads", found=[kv_rows],
            fix="fix num_attention_heads in the config")
    return heads, head_dim, kv_rows // head_dim


def _check_rope(arch: DraftArch, cfg: config.DraftConfig) -> None:
    """The rope table must be finite for this head_dim (e.g. an extreme rope_theta overflows)."""
    freq, scale = rope.inv_freq(arch.rope, arch.head_dim)
    if not bool(torch.isfinite(freq).all()) or not math.isfinite(scale) or scale <= 0:
        raise ConfigError("The rope parameters give non-finite rotary frequencies", path=cfg.path,
                          field="rope_theta / rope_parameters", expected="finite frequencies",
                          found=arch.rope.to_dict(),
                          fix="set the rope values the draft was trained with (e.g. rope_theta 10000 or "
                              "the target's)")


def _target_vocab(names: dict[str, str], store: TensorStore, cfg: config.DraftConfig,
                  verifier: Verifier | None) -> int:
    if "embed_tokens.weight" in names:
        return store.shape(names["embed_tokens.weight"])[0]
    if "t2d" in names:
        return store.shape(names["t2d"])[0]
    if verifier is not None and verifier.embed_name:
        return verifier.store.shape(verifier.embed_name)[0]
    return cfg.vocab_size or 32000


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
        # A reduced-vocab draft without d2t is served with all offsets 0 (vLLM's zero-initialised map,
        # SGLang's absent hot-token map): draft id i drafts target id i. Loaded that way and judged by
        # the evaluation (finding vocab-map-missing) rather than refused, so the report says what it costs.
        out = {"d2t": torch.zeros(arch.draft_vocab_size, dtype=torch.long)}
        if "t2d" in weights and arch.draft_vocab_size != arch.vocab_size:
            out["t2d"] = weights["t2d"].to(torch.bool)
        return out
    raw = weights["d2t"]
    if raw.is_floating_point() or raw.dtype == torch.bool or tuple(raw.shape) != (arch.draft_vocab_size,):
        raise CorruptFileError("d2t is not an integer vector with one offset per draft token",
                               path=store.info(names["d2t"]).path, tensor="d2t",
                               expected=f"[{arch.draft_vocab_size}] int64",
                               found=f"{list(raw.shape)} {str(raw.dtype).replace('torch.', '')}",
                               fix="use the d2t written with this checkpoint by the trainer")
    d2t = raw.to(torch.long)
    targets = d2t + torch.arange(d2t.shape[0])
    out = {"d2t": d2t}
    if vocabmap.pattern(d2t, arch.vocab_size) is not None:
        # an identity or arange map: loaded as the engine would use it, judged by the evaluation
        # (finding vocab-map-identity) instead of failing on its range or on the t2d it disagrees with
        if "t2d" in weights:
            out["t2d"] = weights["t2d"].to(torch.bool)
        return out
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
        if name not in ("d2t", "t2d") and not weights[name].is_floating_point():
            raise CorruptFileError("A weight tensor is not floating point", path=origins.get(name, folder),
                                   tensor=name, expected="float32 / bfloat16 / float16",
                                   found=str(weights[name].dtype).replace("torch.", ""),
                                   fix="use the checkpoint files the trainer wrote")
        if got != want:
            raise ShapeMismatchError(
                "A tensor has the wrong shape for the structure the other tensors imply",
                path=origins.get(name, folder), tensor=name, expected=list(want), found=list(got),
                fix="make sure the checkpoint, its config and --verifier belong together")
