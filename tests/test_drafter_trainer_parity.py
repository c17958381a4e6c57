"""fp32 parity of the draft forward with SpecForge's and ModelOpt's own EAGLE-3 forward, on drafts
each trainer's own export code wrote (tests/support/trainer_peers.py; in CI a missing package fails).

SpecForge 0.2.0: a random ``LlamaForCausalLMEagle3`` is saved as its training checkpoint
(``training_state.pt``, embeddings dropped as its trainer does) and exported with
``export_to_sglang`` (no embed_tokens: the verifier supplies it) and ``export_to_hf`` (embed_tokens
from the target folder). Both load as the flat layout; every TTT step's logits match SpecForge's
draft model driven as ``OnlineEagle3Model.forward`` drives it (project_hidden_states, then per step
embed_input_ids, backbone with the shared cache_hidden, compute_logits, ids shifted by
``specforge.utils.padding``; that loop's module imports triton, so it is restated here).

ModelOpt: its ``EagleModule`` (transformers' LlamaDecoderLayer plus its EAGLE-3 hook) exported by
its ``EagleExporter``; its TTT (``HFEagleModel.forward``) rolls the hidden states one row per step
under ``get_ttt_msk_func``'s mask, so its step k at row t is our chain starting at row t-k.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from remote.drafter import load_checkpoint
from remote.drafter.load.verifier import Verifier
from tests.support.trainer_peers import eager, load_modelopt, load_specforge, random_like

BOUND = 1e-5   # |ours - theirs| / (1 + max |theirs|), fp32, every step
H, VOCAB, DRAFT_VOCAB, STEPS = 48, 80, 60, 3


@pytest.fixture(scope="module")
def specforge() -> Any:
    return load_specforge()


@pytest.fixture(scope="module")
def modelopt() -> Any:
    return load_modelopt()


def _vocab(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    keep = torch.sort(torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB]).values
    return keep - torch.arange(DRAFT_VOCAB), torch.zeros(VOCAB, dtype=torch.bool).index_fill_(0, keep, True)


def _target(folder: Path, embed: torch.Tensor) -> Path:
    """A target folder holding what the drafter reads from a verifier (embedding, norm, head)."""
    folder.mkdir(parents=True)
    save_file({"model.embed_tokens.weight": embed.contiguous(), "model.norm.weight": torch.ones(embed.shape[1]),
               "lm_head.weight": torch.randn(VOCAB, embed.shape[1])}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4,
                                                    "hidden_size": embed.shape[1], "vocab_size": VOCAB}))
    return folder


def _inputs(gen: torch.Generator, width: int, n: int = 12, batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(batch, n, width, generator=gen) * 3, torch.randint(0, VOCAB, (batch, n), generator=gen)


def _worst(ref: list[torch.Tensor], mine: list[torch.Tensor]) -> float:
    return max(float((r - m).abs().max()) / (1 + float(r.abs().max())) for r, m in zip(ref, mine, strict=True))


# -- SpecForge ------------------------------------------------------------------------------------

SPECFORGE_CONFIG = {
    "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
    "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-5, "vocab_size": VOCAB,
    "draft_vocab_size": DRAFT_VOCAB, "max_position_embeddings": 256, "rope_theta": 10000.0,
    "pretraining_tp": 1, "tie_word_embeddings": False,
    "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_aux_hidden_state": True},
}
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def _specforge_exports(sf: Any, tmp: Path, config: dict[str, Any]) -> tuple[Path, Path, Path, Any]:
    """SpecForge's two exports of one random draft, the target folder, and the model (fp32)."""
    from specforge.modeling.auto import AutoDraftModelConfig

    cfg_file = tmp / "draft_config.json"
    cfg_file.write_text(json.dumps(config))
    model = sf.model(AutoDraftModelConfig.from_file(str(cfg_file))).float().eval()
    gen = torch.Generator().manual_seed(7)
    weights = random_like(model.state_dict(), 7)
    weights["d2t"], weights["t2d"] = _vocab(gen)
    # bf16 values: the exports are bf16, and the sglang one reads the target's embedding as it is
    weights = {k: v.bfloat16().float() if v.is_floating_point() else v for k, v in weights.items()}
    model.load_state_dict(weights)
    target = _target(tmp / "target", weights["embed_tokens.weight"])
    trained = {k: v for k, v in model.state_dict().items() if "embed" not in k.lower()}
    torch.save({"strategy": "eagle3", "draft_state_dict": trained}, tmp / "training_state.pt")
    sglang = Path(sf.export_to_sglang(str(tmp / "training_state.pt"), str(cfg_file), str(tmp / "sglang")))
    hf = Path(sf.export_to_hf(str(tmp / "training_state.pt"), str(cfg_file), str(tmp / "hf"),
                              embedding_source=str(target)))
    # the exports are bf16 (materialize_draft): the reference runs the exported values in fp32
    exported = load_file(str(hf / "model.safetensors"))
    exported = {k: v.float() if v.is_floating_point() else v for k, v in exported.items()}
    model.load_state_dict(exported)
    return sglang, hf, target, model


def _specforge_logits(sf: Any, model: Any, aux: torch.Tensor, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    bsz, n = ids.shape
    out = []
    with torch.no_grad(), eager():
        hidden = model.project_hidden_states(aux)
        mask = model.prepare_decoder_attention_mask(torch.ones(bsz, n, dtype=torch.bool), hidden, bsz, n, 0)
        positions = torch.arange(n)[None]
        cache: list[list[torch.Tensor]] = [[], []]
        for _ in range(steps):
            embeds = model.embed_input_ids(ids).to(hidden.dtype)
            hidden = model.backbone(input_embeds=embeds, hidden_states=hidden, cache_hidden=cache,
                                    attention_mask=mask, position_ids=positions, past_key_values=None,
                                    use_cache=True)
            out.append(model.compute_logits(hidden))
            ids = sf.padding(ids, left=False)
    return out


@pytest.mark.parametrize("variant", ["plain", "fc_norm+llama3+target_hidden"])
def test_both_specforge_exports_match_specforges_forward(specforge: Any, tmp_path: Path, variant: str) -> None:
    config = dict(SPECFORGE_CONFIG)
    if variant != "plain":
        config.update(fc_norm=True, target_hidden_size=32, rope_scaling=LLAMA3_ROPE)
    sglang, hf, target, model = _specforge_exports(specforge, tmp_path, config)
    aux, ids = _inputs(torch.Generator().manual_seed(1), 3 * config.get("target_hidden_size", H))
    ref = _specforge_logits(specforge, model, aux, ids, STEPS)
    positions = torch.arange(ids.shape[1]).expand_as(ids)   # SpecForge counts from 0 (rope is relative)
    for folder, verifier, embed_source in ((sglang, Verifier(target), "verifier"), (hf, None, "checkpoint")):
        ours, info = load_checkpoint(folder, verifier=verifier)
        assert (info.format, info.embed_source) == ("flat", embed_source)
        assert info.arch.fc_norm == (variant != "plain") and info.configured_layer_ids == [1, 2, 3]
        with torch.inference_mode():
            mine = ours.forward(aux, ids, STEPS, positions=positions)
        worst = _worst(ref, mine)
        print(f"{folder.name}: max |logit diff| = {worst:.3g} x (1 + max |logit|)")
        assert worst <= BOUND


def test_a_flat_config_with_norm_output_names_both_readings(specforge: Any, tmp_path: Path) -> None:
    """SpecForge's norm_output (norm before lm_head, default true) is not SGLang's/speculators'
    (feed the normed state back): the loader says so instead of picking one silently."""
    sglang, _, target, _ = _specforge_exports(specforge, tmp_path, {**SPECFORGE_CONFIG, "norm_output": True})
    _, info = load_checkpoint(sglang, verifier=Verifier(target))
    note = next(w for w in info.warnings if w.startswith("norm_output=true"))
    assert "SpecForge 0.2.0" in note and "SGLang" in note


# -- ModelOpt -------------------------------------------------------------------------------------

def _modelopt_module(mo: Any, constant_input_norm: bool) -> tuple[Any, Any]:
    """A random EAGLE-3 EagleModule and its config, as HFEagleModel.modify builds them."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    cfg = LlamaConfig.from_dict({
        "hidden_size": H, "intermediate_size": 96, "num_hidden_layers": 1, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "vocab_size": VOCAB, "max_position_embeddings": 256, "attention_bias": False, "mlp_bias": False,
        "rope_scaling": {"rope_type": "default", "rope_theta": 10000.0}, "rope_theta": 10000.0,
        "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True, "use_aux_hidden_state": True,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3], "use_mtp_layernorm": False, "parallel_draft_step": 1,
        "parallel_draft_heads_num_layers": 1, "has_lm_head": False})
    cfg.eagle_decoder_type, cfg.draft_vocab_size, cfg._attn_implementation = "llama", DRAFT_VOCAB, "eager"
    module = mo.EagleModule(cfg, LlamaDecoderLayer).float().eval()
    weights = random_like(module.state_dict(), 11)
    weights["d2t"] = _vocab(torch.Generator().manual_seed(11))[0]
    if constant_input_norm:
        weights["layers.0.input_layernorm.weight"] = torch.ones(H)
    module.load_state_dict(weights)
    return module, cfg


#: ModelOpt's default eagle_export_rope_scaling (modelopt/torch/speculative/config.py)
MODELOPT_EXPORT_ROPE = {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 2048}


def _modelopt_export(mo: Any, module: Any, cfg: Any, folder: Path, export_rope: dict | None = None) -> Path:
    holder = torch.nn.Module()   # what EagleExporter reads of HFEagleModel: eagle_module, eagle_config, config
    holder.eagle_module, holder.eagle_config, holder.config = module, cfg, cfg
    holder.eagle_export_rope_scaling = export_rope   # HFEagleModel's field ({} / None: no injection)
    mo.EagleExporter(holder).export(folder)
    return folder


def _modelopt_logits(mo: Any, module: Any, cfg: Any, aux: torch.Tensor, embeds: torch.Tensor,
                     steps: int) -> list[torch.Tensor]:
    from transformers import DynamicCache

    bsz, n, _ = aux.shape
    module._maybe_init_rope()
    cache, positions, out = DynamicCache(config=cfg), torch.arange(n)[None], []
    with torch.no_grad():
        hidden = module.fc(aux)
        for k in range(steps):
            allowed = mo.ttt_mask(n, k)(None, None, torch.arange(n).view(1, 1, n, 1),
                                        torch.arange(n * (k + 1)).view(1, 1, 1, -1))
            mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
            post, pre, cache = module(hidden, embeds, attention_mask=mask, position_ids=positions,
                                      past_key_values=cache, use_cache=True)
            out.append(module.lm_head(post))
            hidden = pre.roll(1, 1)
    return out


def _compare_modelopt(mo: Any, tmp: Path, constant_input_norm: bool, export_rope: dict | None = None,
                      config: Path | None = None) -> tuple[float, list[str]]:
    module, cfg = _modelopt_module(mo, constant_input_norm)
    folder = _modelopt_export(mo, module, cfg, tmp / "export", export_rope)
    if config is not None:   # the exported config with rope_scaling back to the trained default
        exported = json.loads((folder / "config.json").read_text())
        config.write_text(json.dumps({**exported, "rope_scaling": None}))
    embed = torch.randn(VOCAB, H, generator=torch.Generator().manual_seed(2))
    aux, ids = _inputs(torch.Generator().manual_seed(3), 3 * H)
    ref = _modelopt_logits(mo, module, cfg, aux, embed[ids], STEPS)
    ours, info = load_checkpoint(folder, config, verifier=Verifier(_target(tmp / "target", embed)))
    assert info.format == "modelopt" and info.configured_layer_ids == [1, 2, 3]
    assert info.embed_source == "verifier" and "t2d" not in load_file(str(folder / "model.safetensors"))
    with torch.inference_mode():
        mine = ours.forward(aux, ids, STEPS, positions=torch.arange(ids.shape[1]).expand_as(ids))
    # ModelOpt's step k row t continues our chain from row t - k (its rows before k wrapped around)
    worst = _worst([r[:, k:] for k, r in enumerate(ref)], [m[:, : m.shape[1] - k] for k, m in enumerate(mine)])
    return worst, info.warnings


def test_modelopt_export_matches_modelopts_forward(modelopt: Any, tmp_path: Path) -> None:
    """With a constant layers.0.input_layernorm.weight, ModelOpt's training forward and the served
    one agree (RMSNorm ignores a common scale), so ModelOpt's logits are the reference."""
    worst, warnings = _compare_modelopt(modelopt, tmp_path, constant_input_norm=True)
    print(f"modelopt: max |logit diff| = {worst:.3g} x (1 + max |logit|)")
    assert worst <= BOUND
    assert not any("hidden_norm(input_layernorm(h))" in w for w in warnings)
    assert any("SGLang up to 0.5.11" in w for w in warnings)   # layers.0.* naming


def test_modelopt_trains_a_different_first_layer_than_the_engines_serve(modelopt: Any, tmp_path: Path) -> None:
    """ModelOpt feeds hidden_norm(input_layernorm(h)) in training, the engines hidden_norm(h): with a
    trained (non-constant) input_layernorm the logits differ, and the loader says so with the spread."""
    worst, warnings = _compare_modelopt(modelopt, tmp_path, constant_input_norm=False)
    assert worst > 1e-3
    assert any("hidden_norm(input_layernorm(h))" in w and "spans [" in w for w in warnings)


def test_modelopts_injected_export_rope_is_the_served_one_and_named(modelopt: Any, tmp_path: Path) -> None:
    """ModelOpt's export writes yarn (factor 32) over a draft trained with the default rope: the
    engines serve yarn, so the report does, and says which other reading the file has; with
    rope_scaling reset (--config) the logits are ModelOpt's training forward again."""
    served, warnings = _compare_modelopt(modelopt, tmp_path / "served", True, MODELOPT_EXPORT_ROPE)
    assert served > 1e-3 and any("eagle_export_rope_scaling" in w for w in warnings)
    trained, _ = _compare_modelopt(modelopt, tmp_path / "trained", True, MODELOPT_EXPORT_ROPE,
                                   config=tmp_path / "trained_config.json")
    assert trained <= BOUND
