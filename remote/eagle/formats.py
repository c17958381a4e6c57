"""The two EAGLE-3 draft config formats: how to tell them apart and where each keeps what (stdlib only).

* **speculators** (``speculators_model_type`` and/or ``transformer_layer_config``): the draft's
  decoder config is nested under ``transformer_layer_config``; the aux layer ids sit at the top level
  in vLLM's after-k-layers convention (0 = the embedding).
* **flat** (``LlamaForCausalLMEagle3``, SGLang/vLLM-native): the top level is the Llama config; the
  ids sit in ``eagle_config`` in SGLang's output-of-layer convention (-1 = the embedding).

Detection is one rule for every tool (the evaluator, ``draft-config`` and ``serve inspect``): a
config is flat only when it carries something EAGLE-3 of its own: an ``eagle_config``, an
``*Eagle3*`` architecture, or the ids field at the top level (that field exists for EAGLE-3 drafts
only, and vLLM serves such a config with those ids). A ``hidden_size`` alone is any model's config,
most often the target's (``--ckpt`` pointed at the wrong folder), so it is not a draft.
Moving ids between the two conventions is ``convention.convert`` (id arithmetic lives there).
"""
from __future__ import annotations

from typing import Any

FLAT, SPECULATORS = "flat", "speculators"
FORMATS = (FLAT, SPECULATORS)
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
EAGLE_CONFIG = "eagle_config"
NESTED_FIELD = f"{EAGLE_CONFIG}.{IDS_KEY}"
LAYER_CONFIG = "transformer_layer_config"
#: names of the id convention a file of each format is written in (draft-config's ``file_convention``)
FILE_CONVENTION = {FLAT: "sglang-output-of-layer", SPECULATORS: "vllm-after-k-layers"}
#: why a config is neither format (one clause, for each tool's own one-paragraph error)
NOT_A_DRAFT = (f"it has no speculators_model_type or {LAYER_CONFIG} (speculators format), and no "
               f"{EAGLE_CONFIG}, top-level {IDS_KEY} or *Eagle3* entry in architectures (flat format)")


def detect(config: dict[str, Any]) -> str | None:
    """``speculators``, ``flat``, or None when ``config`` is no EAGLE-3 draft config (see module doc)."""
    if "speculators_model_type" in config or LAYER_CONFIG in config:
        return SPECULATORS
    archs = config.get("architectures")
    eagle3_arch = isinstance(archs, list) and any("eagle3" in str(a).lower() for a in archs)
    if eagle3_arch or EAGLE_CONFIG in config or IDS_KEY in config:
        return FLAT
    return None


def ids_field(fmt: str) -> str:
    """The dotted field a config of format ``fmt`` keeps its ids in (the one draft-config writes)."""
    return NESTED_FIELD if fmt == FLAT else IDS_KEY


def layer_prefix(fmt: str) -> str:
    """Prefix of the decoder fields (hidden_size, heads, rope, ...) in format ``fmt``."""
    return f"{LAYER_CONFIG}." if fmt == SPECULATORS else ""


def layer_config(config: dict[str, Any], fmt: str) -> Any:
    """The object holding the decoder fields (not checked: may be a non-dict in a broken config)."""
    return config.get(LAYER_CONFIG) if fmt == SPECULATORS else config


def field_value(config: dict[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` (e.g. ``eagle_config.eagle_aux_hidden_state_layer_ids``), None if absent."""
    holder: Any = config
    parts = dotted.split(".")
    for part in parts[:-1]:
        holder = holder.get(part) if isinstance(holder, dict) else None
    return holder.get(parts[-1]) if isinstance(holder, dict) else None


def is_int(value: Any) -> bool:
    """A JSON integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)
