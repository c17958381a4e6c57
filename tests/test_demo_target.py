"""The demo target is a standard HF Llama: transformers loads it and its tokenizer as is and computes
what tinyllama computes; its attention is positional (a two-token function at any length); the
greedy decode and SERVE.json that the serve task builds on; bad targets are refused clearly."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from remote.drafter import greedy
from remote.drafter.demo import wordtokenizer
from remote.drafter.demo.build import SERVE_SCHEMA, read_serve_info
from remote.drafter.errors import ConfigError, MissingTensorError, NonFiniteError
from remote.drafter.model import tinyllama
from tests.support.drafter_support import SPEC, demo

REPO = Path(__file__).resolve().parent.parent


def test_transformers_loads_the_target_and_computes_the_same_logits() -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(demo().target), dtype=torch.float32)
    assert type(model).__name__ == "LlamaForCausalLM"
    cfg, weights = tinyllama.load(demo().target)
    ids = torch.randint(0, cfg.vocab_size, (2, 300), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = model(ids).logits
    _, ours = tinyllama.forward(cfg, weights, ids)
    assert (theirs - ours).abs().max() < 1e-3
    assert torch.equal(theirs.argmax(-1), ours.argmax(-1))


def test_the_saved_tokenizer_loads_with_tokenizers_and_transformers() -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(str(demo().target))
    assert len(tok) == SPEC.vocab_size == json.loads((demo().target / "config.json").read_text())["vocab_size"]
    assert (tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = "w05 w17 </s> w63 nonsense"
    assert tok(text)["input_ids"] == wordtokenizer.encode(text, SPEC.vocab_size) == [5, 17, 2, 63, 0]
    assert tok.decode([5, 17, 63]) == wordtokenizer.decode([5, 17, 63]) == "w05 w17 w63"
    assert tok.apply_chat_template([{"role": "user", "content": "w05 w06"}], tokenize=False).split() == ["w05", "w06"]
    from tokenizers import Tokenizer
    assert Tokenizer.from_file(str(demo().target / "tokenizer.json")).get_vocab_size() == SPEC.vocab_size


def test_attention_is_positional_so_the_next_token_depends_on_two_tokens_at_any_length() -> None:
    cfg, weights = tinyllama.load(demo().target)
    ids = torch.randint(0, cfg.vocab_size, (1, 1500), generator=torch.Generator().manual_seed(2))
    _, full = tinyllama.forward(cfg, weights, ids)
    for t in (1, 7, 400, 1499):  # far positions carry fp32 rope rounding (angles near 1500 rad)
        _, pair = tinyllama.forward(cfg, weights, ids[:, t - 1:t + 1])
        assert torch.allclose(full[0, t], pair[0, -1], atol=1e-2), t
        assert full[0, t].argmax() == pair[0, -1].argmax()
    assert tinyllama.peak_ratio(cfg, tinyllama.PAIR_PAIRS, 0.5) < tinyllama.MAX_PEAK_RATIO
    assert tinyllama.peak_ratio(cfg, tinyllama.SELF_PAIRS, 0.0) < tinyllama.MAX_PEAK_RATIO
    with pytest.raises(ValueError, match="head_dim 32 and rope_theta 10000"):
        tinyllama.init_weights(tinyllama.TinyConfig(rope_theta=500.0), torch.Generator().manual_seed(0))


def test_kv_cached_sampling_steps_equal_the_full_forward() -> None:
    cfg, weights = tinyllama.load(demo().target)
    ids = torch.randint(0, cfg.vocab_size, (3, 20), generator=torch.Generator().manual_seed(3))
    _, full = tinyllama.forward(cfg, weights, ids)
    decoder = tinyllama._Decoder(cfg, weights, 3, 20)
    steps = [decoder.step(ids[:, :6])] + [decoder.step(ids[:, i:i + 1]) for i in range(6, 20)]
    incremental = torch.cat(steps, dim=1)
    assert (incremental - full).abs().max() < 1e-2  # summation order differs; scores run to hundreds
    assert torch.equal(incremental.argmax(-1), full.argmax(-1))


def test_greedy_decode_extends_one_token_at_a_time() -> None:
    cfg, weights = tinyllama.load(demo().target)
    out = greedy.greedy_decode(demo().target, [5, 17], 6)
    assert len(out) == 6
    _, logits = tinyllama.forward(cfg, weights, torch.tensor([[5, 17, *out[:-1]]]))
    assert logits[0, 1:].argmax(-1).tolist() == out


def test_serve_info_names_the_folders_and_both_conventions() -> None:
    info = read_serve_info(demo().root)
    assert info["schema"] == SERVE_SCHEMA and info["method"] == "eagle3"
    assert info["draft_layer_ids_sglang"] == [-1, SPEC.layer_a, SPEC.layer_b]
    assert info["draft_layer_ids_vllm"] == [0, SPEC.layer_a + 1, SPEC.layer_b + 1]
    draft_cfg = json.loads((Path(info["draft_path"]) / "config.json").read_text())
    assert draft_cfg["eagle_aux_hidden_state_layer_ids"] == info["draft_layer_ids_vllm"]
    buggy_cfg = json.loads((Path(info["draft_buggy_path"]) / "config.json").read_text())
    assert buggy_cfg["eagle_aux_hidden_state_layer_ids"] == info["buggy_layer_ids_vllm"]
    target_cfg = json.loads((Path(info["target_path"]) / "config.json").read_text())
    assert target_cfg["num_hidden_layers"] == info["num_hidden_layers"] == SPEC.num_layers
    assert target_cfg["architectures"] == ["LlamaForCausalLM"]
    assert not any(k for k in target_cfg if "window" in k or k.startswith("draftops"))
    assert (Path(info["tokenizer_path"]) / "tokenizer.json").is_file()


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "remote.drafter.greedy", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_greedy_cli_refuses_bad_targets_and_prompts(tmp_path: Path) -> None:
    missing = run_cli("--target", str(tmp_path / "nope"), "--prompt-ids", "1,2")
    assert missing.returncode == 3 and "config" in missing.stderr and "Traceback" not in missing.stderr
    bad_ids = run_cli("--target", str(demo().target), "--prompt-ids", "1,x")
    assert bad_ids.returncode == 2 and "comma-separated integers" in bad_ids.stderr
    out_of_range = run_cli("--target", str(demo().target), "--prompt-ids", "1,64")
    assert out_of_range.returncode == 2 and "outside the vocabulary" in out_of_range.stderr
    ok = run_cli("--target", str(demo().target), "--prompt", "w05 w17", "--max-tokens", "3")
    assert ok.returncode == 0 and json.loads(ok.stdout)["prompt_ids"] == [5, 17]


def copy_target(tmp_path: Path) -> Path:
    dest = tmp_path / "target"
    shutil.copytree(demo().target, dest)
    return dest


def test_nan_weights_missing_tensors_and_unsupported_configs_are_refused(tmp_path: Path) -> None:
    target = copy_target(tmp_path)
    tensors = load_file(str(target / "model.safetensors"))
    tensors["model.layers.2.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(tensors, str(target / "model.safetensors"))
    with pytest.raises(NonFiniteError, match="up_proj.weight.*1 NaN"):
        tinyllama.load(target)
    del tensors["model.layers.2.mlp.up_proj.weight"]
    save_file(tensors, str(target / "model.safetensors"))
    with pytest.raises(MissingTensorError, match="up_proj"):
        tinyllama.load(target)
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}))
    with pytest.raises(ConfigError, match="rope_scaling"):
        tinyllama.load(target)
    (target / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        tinyllama.load(target)
