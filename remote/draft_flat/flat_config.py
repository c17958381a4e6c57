"""The flat config of a speculators-format draft: what SGLang's ``LlamaForCausalLMEagle3`` reads
(reference: speculators-eagle3.md §1, sglang-eagle3.md §3), and what it cannot serve.

Refused, because SGLang would run another forward than the one trained: ``norm_before_residual``
(SGLang's residual is always the un-normed hidden state) and a decoder other than Llama. Passed on
with a warning: ``fc_norm``, ``norm_before_fc`` and ``norm_output``, which only recent SGLang
releases read, and more than one decoder layer (SGLang <= 0.5.11 refuses it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..eagle import convention
from ..eagle.formats import EAGLE_CONFIG, IDS_KEY, LAYER_CONFIG
from .errors import NotConvertible

ARCHITECTURE = "LlamaForCausalLMEagle3"
#: decoder fields SGLang's draft reads at the top level of a flat config
DECODER_FIELDS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "max_position_embeddings",
                  "vocab_size", "tie_word_embeddings", "attention_bias", "mlp_bias", "bos_token_id",
                  "eos_token_id", "pad_token_id")
#: options of the draft forward that only recent SGLang releases read (sglang-eagle3.md §3)
RECENT_OPTIONS = ("fc_norm", "norm_before_fc", "norm_output")
SERVE_VLLM = "serve the speculators checkpoint as it is with vLLM, which reads the option"


def build(config: dict[str, Any], source: Path, layer_ids: list[int], dtype: str | None
          ) -> tuple[dict[str, Any], list[str]]:
    """(the flat config, warnings) for speculators ``config`` read from ``source``, with ``layer_ids``
    (SGLang convention) in ``eagle_config``; NotConvertible when SGLang cannot serve it as trained."""
    layer = config.get(LAYER_CONFIG)
    if not isinstance(layer, dict):
        raise NotConvertible(f"{source}: `{LAYER_CONFIG}` is {type(layer).__name__}, not an object holding the "
                             "draft's decoder config, so there is nothing to flatten. Re-export the checkpoint "
                             "with its trainer.")
    if str(layer.get("model_type", "llama")) != "llama":
        raise NotConvertible(f"{source}: the draft's decoder is `{layer.get('model_type')}` "
                             f"({LAYER_CONFIG}.model_type); SGLang serves EAGLE-3 drafts only as {ARCHITECTURE}, "
                             "a Llama decoder. Serve it with vLLM, which reads the speculators format.")
    if config.get("norm_before_residual") is True:
        raise NotConvertible(f"{source}: norm_before_residual is true: the draft was trained with its residual "
                             "taken after the hidden norm, and SGLang has no such option (its residual is always "
                             f"the un-normed hidden state), so a flat copy would serve another forward. Either "
                             f"{SERVE_VLLM}, or retrain with norm_before_residual false for SGLang.")
    flat: dict[str, Any] = {"architectures": [ARCHITECTURE]}
    flat.update({k: layer[k] for k in DECODER_FIELDS if k in layer})
    flat["model_type"] = "llama"
    flat.update(_rope(layer))
    flat["draft_vocab_size"] = config.get("draft_vocab_size") or layer.get("vocab_size")
    if config.get("target_hidden_size") is not None:
        flat["target_hidden_size"] = config["target_hidden_size"]
    if dtype is not None:
        flat["torch_dtype"] = dtype
    warnings = []
    for option in RECENT_OPTIONS:
        if config.get(option) is True:
            flat[option] = True
            warnings.append(f"{option} is true: written at the top level, where recent SGLang releases read it "
                            "(norm_before_fc from 0.5.20); an older SGLang ignores it without a word and serves "
                            f"another forward, so check the host's SGLang reads it, or {SERVE_VLLM}")
    if isinstance(flat.get("num_hidden_layers"), int) and flat["num_hidden_layers"] > 1:
        warnings.append(f"{flat['num_hidden_layers']} decoder layers: SGLang <= 0.5.11 refuses more than 1 "
                        "(\"EAGLE3 currently only supports 1 layer\"); 0.5.12 and later serve them")
    flat[EAGLE_CONFIG] = {IDS_KEY: list(layer_ids), "use_aux_hidden_state": True}
    return flat, warnings


def _rope(layer: dict[str, Any]) -> dict[str, Any]:
    """rope_theta / rope_scaling as SGLang reads them, from transformers 5's ``rope_parameters`` or
    transformers 4's own two keys."""
    params = layer.get("rope_parameters")
    if isinstance(params, dict):
        rope_type = params.get("rope_type", "default")
        scaling = None if rope_type == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
        return {"rope_theta": params.get("rope_theta", 10000.0), "rope_scaling": scaling}
    return {"rope_theta": layer.get("rope_theta", 10000.0), "rope_scaling": layer.get("rope_scaling")}


def source_ids(config: dict[str, Any]) -> list[int] | None:
    """The speculators config's own ids (vLLM convention), or None when absent or null."""
    ids = config.get(IDS_KEY)
    return ids if isinstance(ids, list) and ids and all(isinstance(i, int) and not isinstance(i, bool)
                                                         for i in ids) else None


def to_sglang(ids: list[int]) -> list[int]:
    """Speculators (vLLM after-k-layers) ids in SGLang's output-of-layer convention."""
    return convention.convert(ids, convention.VLLM, convention.SGLANG)
