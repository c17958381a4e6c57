"""Which trainer's layout a draft folder is, from its config and its weight names.

The config family (``remote.eagle.formats``: speculators or flat) decides where the decoder fields
and the aux ids are; the layout adds what a trainer's export does differently and what the config
alone cannot show:

* **speculators**: ``speculators_model_type`` / ``transformer_layer_config``, layers ``layers.*``.
* **flat**: ``LlamaForCausalLMEagle3``, layer 0 ``midlayer.*``. SpecForge writes this layout with
  ``specforge export --to sglang`` (no ``embed_tokens``: the report's embed_source is ``verifier``)
  and ``--to hf`` (with ``embed_tokens``); SGLang-native drafts are the same files.
* **modelopt**: ModelOpt's HF export: a flat config whose ``eagle_config`` carries ModelOpt's own
  keys (``use_aux_hidden_state``, ``use_last_layernorm``, ...), layer 0 ``layers.0.*``, ``d2t``
  without ``t2d``, no ``embed_tokens``.
* **eagle**: the original EAGLE repository's EAGLE-3 checkpoints: a plain ``LlamaForCausalLM``
  config with ``draft_vocab_size`` (nothing in it says EAGLE-3), ``midlayer.*`` + ``fc.weight``
  weights, usually ``pytorch_model.bin``.

Every layout but speculators stores ids in SGLang's output-of-layer convention
(``convention.serving_convention``). Where two readings of a folder would compute different
drafts (two layer 0s, a final norm the config disowns), it is an error naming both, never a guess.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ...eagle import formats
from ...eagle.formats import EAGLE_CONFIG, FLAT, SPECULATORS
from ..errors import ConfigError, UnsupportedError

MODELOPT, EAGLE = "modelopt", "eagle"
LAYOUTS = (SPECULATORS, FLAT, MODELOPT, EAGLE)
#: eagle_config keys only ModelOpt's export template writes (hf_spec_configs.llama_eagle_template_config;
#: its ``use_aux_hidden_state`` is in SpecForge/SGLang configs too, so it does not count)
MODELOPT_KEYS = ("use_input_layernorm_in_first_layer", "use_last_layernorm", "use_mtp_layernorm",
                 "next_layer_regular", "parallel_draft_step", "parallel_draft_heads_num_layers")


def detect(raw: dict[str, Any], cfg_path: Path, weight_names: list[str] | None) -> str | None:
    """The layout of a draft whose config is ``raw`` and whose tensors are ``weight_names`` (None:
    weights not opened yet); None when neither shows an EAGLE-3 draft (the caller's error)."""
    family = formats.detect(raw)
    names = weight_names or []
    _one_layer_zero(names, cfg_path)
    if family == SPECULATORS:
        return SPECULATORS
    if family == FLAT:
        eagle = raw.get(EAGLE_CONFIG)
        if isinstance(eagle, dict) and any(k in eagle for k in MODELOPT_KEYS):
            _check_modelopt(eagle, names, cfg_path)
            return MODELOPT
        return FLAT
    if any(n.startswith("midlayer.") for n in names) and "fc.weight" in names:
        return EAGLE
    return None


def _one_layer_zero(names: list[str], cfg_path: Path) -> None:
    """``midlayer.*`` and ``layers.0.*`` together are two first layers: which one a server loads
    depends on the server (SGLang <= 0.5.11 reads only ``midlayer.*``)."""
    mid = sorted(n for n in names if n.startswith("midlayer."))
    layer0 = sorted(n for n in names if re.match(r"^(model\.)?layers\.0\.", n))
    if mid and layer0:
        raise ConfigError(
            "The draft's weights hold two first layers, so they have two readings: the flat layout's "
            f"midlayer.* ({len(mid)} tensors) and the speculators/ModelOpt layout's layers.0.* "
            f"({len(layer0)} tensors)", path=cfg_path.parent, tensor=f"{mid[0]} / {layer0[0]}",
            expected="one of the two namings", found="both",
            fix="keep the weights of one save only (re-export the draft from its trainer)")


def _check_modelopt(eagle: dict[str, Any], names: list[str], cfg_path: Path) -> None:
    """ModelOpt flags the drafter cannot read as the engines do are refused, naming both readings."""
    field = f"{EAGLE_CONFIG}.use_aux_hidden_state"
    if eagle.get("use_aux_hidden_state") is False:
        raise UnsupportedError(
            "This ModelOpt draft is EAGLE-1/2 (no aux hidden states), not EAGLE-3", path=cfg_path, field=field,
            expected="true", found="false", fix="evaluate an EAGLE-3 draft (ModelOpt eagle3 mode)")
    field = f"{EAGLE_CONFIG}.use_last_layernorm"
    if eagle.get("use_last_layernorm") is False and (not names or "norm.weight" in names):
        raise ConfigError(
            "The config and the weights read two ways: ModelOpt's use_last_layernorm=false means logits "
            "from the un-normed hidden state, while SGLang and vLLM apply the norm.weight the checkpoint "
            "carries", path=cfg_path, field=field, expected="true (the flag ModelOpt's EAGLE-3 export "
            "writes with norm.weight)", found="false",
            fix="use the config.json ModelOpt exported with these weights")


def notes(layout: str, raw: dict[str, Any], names: list[str]) -> list[str]:
    """``checkpoint.warnings`` about how this layout's trainer and the engines read it differently."""
    out: list[str] = []
    eagle = raw.get(EAGLE_CONFIG)
    if not isinstance(eagle, dict):
        eagle = {}
    norm_output = raw.get("norm_output", eagle.get("norm_output"))
    if layout != SPECULATORS and isinstance(norm_output, bool):
        out.append(
            f"norm_output={str(norm_output).lower()} has two readings: SpecForge 0.2.0 reads it as 'apply "
            "norm before lm_head' (default true; it always feeds the un-normed hidden state to the next "
            "step), SGLang, vLLM and speculators as 'feed the normed hidden state to the next step'; the "
            "report scores the engines' reading" + ("" if norm_output else ", which applies the norm"))
    if layout != SPECULATORS and any(re.match(r"^(model\.)?layers\.0\.", n) for n in names):
        out.append("layer 0 is named layers.0.* (not midlayer.*): SGLang up to 0.5.11 loads only "
                   "midlayer.* and silently skips these weights; serve with SGLang >= 0.5.12 or vLLM")
    rope = raw.get("rope_scaling")
    if layout == MODELOPT and isinstance(rope, dict) and (rope.get("rope_type") or rope.get("type")) == "yarn":
        out.append(f"rope_scaling {rope} has two readings: ModelOpt's export writes its "
                   "eagle_export_rope_scaling (default yarn, factor 32) over a draft trained with the "
                   "default rope, or the draft was trained with this yarn rope (export override off). "
                   "The engines serve this rope and the report scores it; if ModelOpt injected it, the "
                   "served draft differs from the trained one at every position (pass --config with "
                   "rope_scaling null to score the trained draft)")
    if layout == EAGLE:
        archs = raw.get("architectures")
        out.append(f"the config (architectures {archs}) does not say EAGLE-3; the weights do (midlayer.*, "
                   "fc.weight). SGLang picks the draft class from architectures: set it to "
                   "[\"LlamaForCausalLMEagle3\"] and add eagle_config.eagle_aux_hidden_state_layer_ids "
                   "(`invoke draft-config`) before serving")
    return out


def modelopt_norm_note(input_norm: Any) -> str | None:
    """ModelOpt's HF EAGLE-3 training forward runs layer 0 as transformers' LlamaDecoderLayer with a
    pre-attention hook: the hook gets ``input_layernorm(h)`` and feeds ``hidden_norm`` of it, so the
    trained hidden half is ``hidden_norm(input_layernorm(h))``; SGLang and vLLM feed
    ``hidden_norm(h)``. RMSNorm ignores a common scale, so the two agree only while
    ``layers.0.input_layernorm.weight`` is constant; a note with its spread otherwise."""
    low, high = float(input_norm.min()), float(input_norm.max())
    scale = max(abs(low), abs(high))
    if scale == 0 or (high - low) <= 1e-6 * scale:
        return None
    return (f"ModelOpt trained layer 0 on hidden_norm(input_layernorm(h)), SGLang and vLLM serve "
            f"hidden_norm(h): the two differ unless layers.0.input_layernorm.weight is constant, and it "
            f"spans [{low:.4g}, {high:.4g}]; the report scores the served forward, so its accuracy can be "
            "below ModelOpt's training accuracy for this reason alone")
