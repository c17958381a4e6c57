"""The trainers' layouts told apart from config + weight names (remote/drafter/load/draftformat.py), the
original EAGLE repository's ``pytorch_model.bin`` checkpoints, folders with two readings, and bad
exports: each refusal one paragraph naming the file. No trainer package needed (the parity with
the trainers' own code is tests/test_drafter_trainer_parity.py)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from remote.drafter import load_checkpoint
from remote.drafter.errors import ConfigError, CorruptFileError, DrafterError, MissingTensorError
from remote.drafter.load.verifier import Verifier
from tests.support.drafter_lab import TRAINED, lab, save, trained_weights

MODELOPT_EAGLE_CONFIG = {"eagle_aux_hidden_state_layer_ids": TRAINED, "use_aux_hidden_state": True,
                         "use_input_layernorm_in_first_layer": True, "use_last_layernorm": True,
                         "use_mtp_layernorm": False, "next_layer_regular": True, "parallel_draft_step": 1,
                         "parallel_draft_heads_num_layers": 1}


def _flat(folder: Path) -> tuple[Path, dict[str, Any], dict[str, torch.Tensor]]:
    save(folder, trained_weights(0), TRAINED, fmt="flat")
    return folder, json.loads((folder / "config.json").read_text()), load_file(str(folder / "model.safetensors"))


def _rewrite(folder: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], bin_file: bool = False) -> Path:
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").unlink(missing_ok=True)
    if bin_file:
        torch.save(tensors, folder / "pytorch_model.bin")
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _logits(folder: Path) -> tuple[list[torch.Tensor], Any]:
    draft, info = load_checkpoint(folder, verifier=Verifier(lab().target))
    gen = torch.Generator().manual_seed(0)
    aux = torch.randn(2, 9, draft.arch.num_aux * draft.arch.aux_hidden_size, generator=gen)
    ids = torch.randint(0, draft.arch.vocab_size, (2, 9), generator=gen)
    with torch.inference_mode():
        return draft.forward(aux, ids, 3), info


def _refusal(kind: type[DrafterError], folder: Path) -> str:
    with pytest.raises(kind) as caught:
        load_checkpoint(folder, verifier=Verifier(lab().target))
    text = str(caught.value)
    assert "\n" not in text and "Fix:" in text, text
    return text


def test_the_eagle_repositorys_bin_checkpoint_loads_as_its_own_layout(tmp_path: Path) -> None:
    """A plain LlamaForCausalLM config (nothing EAGLE-3 in it) with midlayer.* + fc.weight in a
    pytorch_model.bin: the weights say EAGLE-3, and it computes what the same tensors do as flat."""
    reference, _ = _logits(_flat(tmp_path / "flat")[0])
    folder, config, tensors = _flat(tmp_path / "eagle")
    plain = {k: v for k, v in config.items() if k not in ("eagle_config", "architectures")}
    _rewrite(folder, {**plain, "architectures": ["LlamaForCausalLM"]}, tensors, bin_file=True)
    logits, info = _logits(folder)
    assert info.format == "eagle" and info.weight_files == [str(folder / "pytorch_model.bin")]
    assert info.configured_layer_ids is None and info.embed_source == "verifier"
    assert any("does not say EAGLE-3" in w for w in info.warnings)
    assert all(torch.equal(a, b) for a, b in zip(reference, logits, strict=True))


def test_a_plain_llama_config_with_a_targets_weights_is_still_not_a_draft(tmp_path: Path) -> None:
    folder, config, _ = _flat(tmp_path / "target")
    plain = {k: v for k, v in config.items() if k not in ("eagle_config", "architectures")}
    _rewrite(folder, plain, {"model.layers.0.mlp.up_proj.weight": torch.zeros(2, 2),
                             "model.embed_tokens.weight": torch.zeros(3, 2)})
    assert "not an EAGLE-3 draft config" in _refusal(ConfigError, folder)


def test_modelopt_layout_is_named_and_reads_layers_0(tmp_path: Path) -> None:
    reference, _ = _logits(_flat(tmp_path / "flat")[0])
    folder, config, tensors = _flat(tmp_path / "modelopt")
    renamed = {n.replace("midlayer.", "layers.0.", 1): t for n, t in tensors.items() if n != "t2d"}
    _rewrite(folder, {**config, "eagle_config": MODELOPT_EAGLE_CONFIG}, renamed)
    logits, info = _logits(folder)
    assert info.format == "modelopt" and info.configured_layer_ids == TRAINED
    assert any("SGLang up to 0.5.11" in w for w in info.warnings)
    assert all(torch.equal(a, b) for a, b in zip(reference, logits, strict=True))


def test_modelopt_without_its_last_layernorm_names_both_readings(tmp_path: Path) -> None:
    folder, config, tensors = _flat(tmp_path / "modelopt")
    renamed = {n.replace("midlayer.", "layers.0.", 1): t for n, t in tensors.items()}
    _rewrite(folder, {**config, "eagle_config": {**MODELOPT_EAGLE_CONFIG, "use_last_layernorm": False}}, renamed)
    text = _refusal(ConfigError, folder)
    assert "use_last_layernorm" in text and "SGLang and vLLM apply the norm.weight" in text
    assert str(folder / "config.json") in text


def test_two_first_layers_are_two_readings(tmp_path: Path) -> None:
    folder, config, tensors = _flat(tmp_path / "both")
    extra = {n.replace("midlayer.", "layers.0.", 1): t.clone() for n, t in tensors.items() if n.startswith("midlayer.")}
    _rewrite(folder, config, {**tensors, **extra})
    text = _refusal(ConfigError, folder)
    assert "midlayer.*" in text and "layers.0.*" in text and str(folder) in text


def test_safetensors_and_bin_in_one_folder_are_two_saves(tmp_path: Path) -> None:
    folder, _, tensors = _flat(tmp_path / "two")
    torch.save(tensors, folder / "pytorch_model.bin")
    text = _refusal(ConfigError, folder)
    assert "model.safetensors" in text and "pytorch_model.bin" in text and "two readings" in text


# -- bad exports: one paragraph each, naming the file ------------------------------------------------

def test_an_export_missing_a_tensor(tmp_path: Path) -> None:
    folder, config, tensors = _flat(tmp_path / "missing")
    del tensors["midlayer.mlp.down_proj.weight"]
    _rewrite(folder, config, tensors)
    text = _refusal(MissingTensorError, folder)
    assert "layers.0.mlp.down_proj.weight" in text and str(folder) in text


def test_an_fc_whose_width_disagrees_with_the_config(tmp_path: Path) -> None:
    """The config lists 3 aux layers; an fc.weight two slots wide cannot read them."""
    folder, config, tensors = _flat(tmp_path / "fc")
    hidden = tensors["fc.weight"].shape[0]
    _rewrite(folder, config, {**tensors, "fc.weight": tensors["fc.weight"][:, : 2 * hidden].contiguous()})
    text = _refusal(ConfigError, folder)
    assert f"fc.weight [{hidden}, {2 * hidden}]" in text and str(folder / "model.safetensors") in text
    assert "eagle_config.eagle_aux_hidden_state_layer_ids" in text and str(folder / "config.json") in text


class _RunsCode:
    """Unpickling this runs ``touch`` (what a hostile pytorch_model.bin would do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_a_bin_that_would_run_code_is_refused_unread(tmp_path: Path) -> None:
    folder, config, tensors = _flat(tmp_path / "hostile")
    plain = {k: v for k, v in config.items() if k not in ("eagle_config", "architectures")}
    marker = tmp_path / "ran"
    _rewrite(folder, plain, {**tensors, "fc.weight": _RunsCode(marker)}, bin_file=True)  # type: ignore[dict-item]
    text = _refusal(CorruptFileError, folder)
    assert "pickle that would run code" in text and str(folder / "pytorch_model.bin") in text
    assert not marker.exists()
