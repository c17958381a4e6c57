"""One EAGLE-3 format rule for every tool (issue 8): the evaluator's loader, draft-config and serve
inspect read the SAME config files and must agree on the format and on the ids the format's own
engine reads. The case that used to disagree: a config with ``hidden_size`` and top-level ids, no
``eagle_config`` and no Eagle3 architecture, was "flat" to the evaluator but "not an EAGLE-3 draft
config" to draft-config (and had no format in serve inspect)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from remote.draft_config import config_file
from remote.draft_config.errors import ConfigFormatError
from remote.drafter.errors import ConfigError
from remote.drafter.load import config as drafter_config
from remote.drafter.load.checkpoint import load_checkpoint
from remote.drafter.load.verifier import Verifier
from remote.eagle import formats
from remote.serve.configs import draft_facts, inspect
from tests.support.draft_configs import run_cli
from tests.support.drafter_lab import TRAINED, lab, save, trained_weights
from tests.support.sglang_wheels import REPO

IDS = formats.IDS_KEY
LLAMA = {"model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
         "vocab_size": 96}


def _write(folder: Path, config: dict[str, Any]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _format_or_refusal(load: Callable[[Path], Any], refusal: type[Exception], folder: Path) -> str | None:
    """The format ``load`` finds, or None when it refuses with the shared "not a draft" paragraph."""
    try:
        return load(folder).format
    except refusal as exc:
        assert "not an EAGLE-3 draft config" in str(exc) and str(folder / "config.json") in str(exc)
        return None


CASES = {
    # the case that disagreed: the ids field is EAGLE-3's own, and vLLM serves such a config with it
    "hidden_size and top-level ids": ({**LLAMA, IDS: [0, 2, 3]}, formats.FLAT),
    "top-level ids set to null": ({**LLAMA, IDS: None}, formats.FLAT),
    "eagle_config without architectures": ({**LLAMA, "eagle_config": {IDS: [1, 2, 3]}}, formats.FLAT),
    "Eagle3 architecture in any case": ({**LLAMA, "architectures": ["Eagle3LlamaForCausalLM"]}, formats.FLAT),
    "speculators": ({"speculators_model_type": "eagle3", "transformer_layer_config": LLAMA, IDS: [0, 2, 3]},
                    formats.SPECULATORS),
    # a hidden_size alone is any model's config, most often the target's: --ckpt at the wrong folder
    "a target's config": ({**LLAMA, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 5}, None),
    "hidden_size alone": (dict(LLAMA), None),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_three_tools_detect_the_same_format(tmp_path: Path, name: str) -> None:
    config, expected = CASES[name]
    folder = _write(tmp_path / "draft", config)
    target = _write(tmp_path / "target", {"num_hidden_layers": 5, "hidden_size": 32})
    served = inspect("vllm", target, folder, sglang_status=False)["draft"]
    evaluator = _format_or_refusal(drafter_config.read, ConfigError, folder)
    draft_config = _format_or_refusal(config_file.load, ConfigFormatError, folder)
    assert (evaluator, draft_config, served["format"]) == (expected,) * 3
    assert formats.detect(config) == expected


def test_hidden_size_with_top_level_ids_agrees_in_evaluator_draft_config_and_serve(tmp_path: Path) -> None:
    """The decided case end to end, on a real checkpoint: all three call it flat, and all three say
    SGLang (the flat format's engine) reads no ids there, while vLLM reads the top-level ones. draft-config
    writes eagle_config and warns about the top-level ids; afterwards all three read the new ids."""
    ckpt = save(tmp_path / "draft", trained_weights(0), TRAINED, fmt="flat")
    config = json.loads((ckpt / "config.json").read_text())
    del config["architectures"], config["eagle_config"]
    config[IDS] = [0, 2, 3]   # TRAINED in vLLM's after-k-layers convention, where vLLM reads first
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))
    target = _write(tmp_path / "target", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 5,
                                          "hidden_size": 32})
    verifier = Verifier(lab().target)

    def views() -> tuple[Any, dict[str, Any], dict[str, Any]]:
        _, info = load_checkpoint(ckpt, verifier=verifier)
        facts = draft_facts("sglang", ckpt, None)
        loaded = config_file.load(ckpt)
        return info, facts, {"format": loaded.format, "ids": loaded.file_ids()}

    info, facts, dc = views()
    assert info.format == facts["format"] == dc["format"] == formats.FLAT
    assert info.configured_layer_ids is None and info.layer_ids_key is None
    assert facts["ids_by_engine"] == info.ids_by_engine == {"sglang": None, "vllm": [0, 2, 3]} and dc["ids"] is None
    assert facts["reading"]["fallback"] and facts["reading"]["ignored"] == {IDS: [0, 2, 3]}
    assert any(w.startswith(f"{IDS}=[0, 2, 3] is not used by SGLang") for w in info.warnings), info.warnings

    proc, result = run_cli("--ckpt", str(ckpt), "--layer-ids", ",".join(map(str, TRAINED)),
                           "--target", str(target), out=tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert result["format"] == formats.FLAT and result["field"] == formats.NESTED_FIELD
    assert result["old_ids"] is None and result["written_ids"] == TRAINED and result["changed"]
    assert any(w.startswith(f"top-level {IDS}=[0, 2, 3] left as is") for w in result["warnings"])

    info, facts, dc = views()
    assert info.configured_layer_ids == facts["ids_by_engine"]["sglang"] == dc["ids"] == TRAINED
    assert info.ids_by_engine == facts["ids_by_engine"]
    assert info.layer_ids_key == formats.NESTED_FIELD
    assert facts["ids_by_engine"]["vllm"] == [0, 2, 3], "the top-level ids still come first for vLLM"


def test_the_rules_import_without_torch_so_the_local_side_can_use_them() -> None:
    """remote/eagle is stdlib only: the laptop (draftops/report.py, serve checks) imports it."""
    code = ("import sys, remote.eagle.formats, remote.eagle.convention, remote.eagle.weights, draftops.report; "
            "heavy = sorted(m for m in ('torch', 'safetensors', 'numpy') if m in sys.modules); "
            "assert not heavy, heavy")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
