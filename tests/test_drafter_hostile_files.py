"""Hostile variants of the files and flags the findings read (issue #25/#29's outside probe): each is one
clear paragraph naming the file and field, or a documented skip, never a traceback or a figure made up."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from remote.drafter.data import chattemplate
from remote.drafter.errors import ConfigError

TEMPLATE = "<|im_start|>{{ m }}<|im_end|>"
DEEP = "[" * 100_000 + "]" * 100_000


def tokenizer(folder: Path, config: dict | str, tokenizer_json: dict | str | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer_config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    if tokenizer_json is not None:
        (folder / "tokenizer.json").write_text(
            tokenizer_json if isinstance(tokenizer_json, str) else json.dumps(tokenizer_json))
    return folder


@pytest.mark.parametrize("which", ["tokenizer_config.json", "tokenizer.json"])
def test_a_tokenizer_file_nested_too_deep_is_one_paragraph_naming_it(tmp_path, which):
    folder = tokenizer(tmp_path, DEEP if which == "tokenizer_config.json" else {"chat_template": TEMPLATE},
                       DEEP if which == "tokenizer.json" else None)
    with pytest.raises(ConfigError) as err:
        chattemplate.Template.read(folder)
    assert err.value.path == str(folder / which) and "nested too deep" in str(err.value)


@pytest.mark.parametrize("key", ["²", "-3", str(2**70)])
def test_an_added_token_key_that_is_no_token_id_is_named(tmp_path, key):
    """``"²".isdigit()`` is true and ``int("²")`` fails; an id past int64 overflowed the marker tensor."""
    folder = tokenizer(tmp_path, {"chat_template": TEMPLATE,
                                  "added_tokens_decoder": {key: {"content": "<|im_start|>", "special": True}}})
    with pytest.raises(ConfigError) as err:
        chattemplate.Template.read(folder)
    assert err.value.field == f"added_tokens_decoder[{key!r}]" and "tokenizer_config.json" in str(err.value)


@pytest.mark.parametrize("bad", [2**70, -5, True])
def test_an_added_token_id_outside_int64_or_negative_is_named(tmp_path, bad):
    folder = tokenizer(tmp_path, {"chat_template": TEMPLATE},
                       {"added_tokens": [{"id": bad, "content": "<|im_start|>", "special": True}]})
    with pytest.raises(ConfigError) as err:
        chattemplate.Template.read(folder)
    assert err.value.path == str(folder / "tokenizer.json") and err.value.field == "added_tokens[0].id"


def test_good_added_tokens_still_become_role_markers(tmp_path):
    folder = tokenizer(tmp_path, {"chat_template": TEMPLATE, "added_tokens_decoder": {
        "7": {"content": "<|im_start|>", "special": True}}},
        {"added_tokens": [{"id": 8, "content": "<|im_end|>", "special": True}]})
    template = chattemplate.Template.read(folder)
    assert template is not None and template.markers == {7: "<|im_start|>", 8: "<|im_end|>"}
    scan = chattemplate.Scan(template)
    scan.see(0, torch.tensor([7, 3, 8]))
    assert scan.to_dict()["status"] == "chat"


@pytest.mark.parametrize("body", ['{"num_train_samples": Infinity}', DEEP, '{"num_train_samples": 0.5}',
                                  '{"num_train_samples": NaN, "num_train_epochs": Infinity}'])
def test_a_trainer_file_with_no_usable_size_is_no_evidence(tmp_path, body):
    """Infinity was int()ed into an OverflowError, a deep file raised RecursionError, 0.5 samples became
    "0 samples"; none of them is a training size, so the finding says the size is unknown."""
    from remote.drafter.causes import training

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "training_args.json").write_text(body)
    assert training.training_size(str(tmp_path / "config.json"), str(tmp_path)) == \
        {"samples": None, "epochs": None, "source": None}


def test_a_trainer_files_whole_size_is_still_read(tmp_path):
    from remote.drafter.causes import training

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "training_args.json").write_text('{"args": {"num_train_samples": 5000.0, "num_train_epochs": 2}}')
    assert training.training_size(str(tmp_path / "config.json"), str(tmp_path)) == \
        {"samples": 5000, "epochs": 2, "source": str(tmp_path / "training_args.json")}


def vocab_map(root: Path, d2t: torch.Tensor, vocab: int = 64) -> Path:
    folder = root / "vocab_mapping"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"d2t": d2t, "t2d": torch.ones(vocab, dtype=torch.bool)}, folder / "vocab_mapping.pt")
    return folder / "vocab_mapping.pt"


@pytest.mark.parametrize("offset", [-100, 1000, 2**62])
def test_a_data_map_onto_ids_outside_the_target_vocab_is_refused_not_scored(tmp_path, offset):
    """It made a vocab-map-differs finding whose examples mapped draft ids to target id -100 or 2**62."""
    from remote.drafter.data import trainermap
    from remote.drafter.errors import CorruptFileError

    file = vocab_map(tmp_path, torch.full((48,), offset, dtype=torch.long))
    with pytest.raises(CorruptFileError) as err:
        trainermap.compare(tmp_path, torch.zeros(48, dtype=torch.long), 64)
    assert err.value.path == str(file) and err.value.tensor == "d2t" and "outside the target's 64" in str(err.value)


def test_a_data_map_of_float_offsets_says_so(tmp_path):
    from remote.drafter.data import trainermap
    from remote.drafter.errors import CorruptFileError

    vocab_map(tmp_path, torch.full((48,), float("nan")))
    with pytest.raises(CorruptFileError) as err:
        trainermap.compare(tmp_path, torch.zeros(48, dtype=torch.long), 64)
    assert "not integer offsets" in str(err.value) and "float32" in str(err.value)


def test_a_data_map_within_the_vocab_is_still_compared(tmp_path):
    from remote.drafter.data import trainermap

    d2t = torch.zeros(48, dtype=torch.long)
    d2t[3] = 10
    vocab_map(tmp_path, d2t)
    facts = trainermap.compare(tmp_path, torch.zeros(48, dtype=torch.long), 64)
    assert facts is not None and facts["files"][0]["draft_ids_differing"] == 1


@pytest.mark.parametrize("version", ["0.5.x; rm -rf", "0.5.\x1b[31m13", "0.5.13 (patched)", "0.5.13\n"])
def test_an_engine_version_that_is_no_version_is_refused(version):
    """It was accepted for its leading digits and quoted into every engine finding's text as given."""
    from remote.drafter import EvalOptions
    from remote.drafter.errors import OptionError

    with pytest.raises(OptionError) as err:
        EvalOptions(ckpt=Path("c"), data=Path("d"), engine_version=version).validate()
    assert err.value.field == "--engine-version"


@pytest.mark.parametrize("version", ["0.5.13", "v0.5.13.post1", "0.11.0rc1", "0.32.0+cpu", "99999"])
def test_real_engine_versions_pass(version):
    from remote.drafter import EvalOptions

    EvalOptions(ckpt=Path("c"), data=Path("d"), engine_version=version).validate()


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_bin_draft_that_is_no_regular_file_is_refused_without_opening_it(tmp_path, kind):
    """A pytorch_model.bin FIFO blocked open() forever (the eval hung); /dev/zero was called a code pickle."""
    import os
    import subprocess
    import sys

    path = tmp_path / "pytorch_model.bin"
    {"fifo": lambda: os.mkfifo(path), "device": lambda: path.symlink_to("/dev/zero"),
     "folder": path.mkdir}[kind]()
    code = ("import sys; from pathlib import Path; from remote.drafter.store.tensorstore import TensorStore\n"
            "from remote.drafter.errors import CorruptFileError\n"
            "try: TensorStore.open(Path(sys.argv[1]))\n"
            "except CorruptFileError as e: print(e)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0, done.stderr
    assert "is not a regular file" in done.stdout and str(path) in done.stdout


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_json_next_to_the_dumps_that_is_no_regular_file_is_passed_over(tmp_path, kind):
    """trainerconfig read every *.json next to the dumps: a FIFO hung, a link to /dev/zero (size 0) was read
    without end. A special file is no trainer config: passed over, as a file too large is."""
    import os
    import subprocess
    import sys

    (tmp_path / "data").mkdir()
    path = tmp_path / "data" / "a_run.json"   # sorted before the config
    os.mkfifo(path) if kind == "fifo" else path.symlink_to("/dev/zero")
    (tmp_path / "data" / "eagle.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}))
    code = ("import resource, sys; from pathlib import Path\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from remote.drafter.data import trainerconfig\n"
            "print(trainerconfig.read(Path(sys.argv[1]), 3, 'SpecForge').aux_ids)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "data")], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(1, 2, 3)"


@pytest.mark.parametrize("ids", [[1, 3, 40], [2**70, 3, 4]])
def test_trainer_config_ids_past_the_targets_layers_are_refused(tmp_path, ids):
    """A run config naming layer 40 (or 2**70) of the demo's 6-layer target became the report's slot layers."""
    from remote.drafter.data import trainerconfig
    from tests.support.drafter_support import demo

    config = tmp_path / "train.json"
    config.write_text(json.dumps({"model": {"target_model_path": str(demo().target),
                                            "aux_hidden_state_layer_ids": ids}}))
    with pytest.raises(ConfigError) as err:
        trainerconfig.read(tmp_path, 3, "SpecForge")
    assert err.value.path == str(config) and "6 layers" in str(err.value)


def test_huge_ids_are_refused_without_a_target_layer_count(tmp_path):
    from remote.drafter.data import trainerconfig

    (tmp_path / "eagle.json").write_text(json.dumps({"eagle_aux_hidden_state_layer_ids": [1, 2, 2**70]}))
    with pytest.raises(ConfigError) as err:
        trainerconfig.read(tmp_path, 3, "ModelOpt")
    assert err.value.path == str(tmp_path / "eagle.json")


def test_an_engine_state_file_with_nan_is_named_as_skipped(tmp_path):
    """A NaN engine-state sample was dropped from the engine figures silently (samples said 4, 3 scored)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from tests.support.drafter_support import demo, run_eval

    states = tmp_path / "engine-states"
    states.mkdir()
    shutil.copy(demo().data / "data_config.json", states)
    for i in range(4):
        shutil.copy(demo().data / f"hs_{i}.safetensors", states)
    tensors = load_file(states / "hs_1.safetensors")
    tensors["hidden_states"][3] = float("nan")
    save_file(tensors, states / "hs_1.safetensors")
    part = run_eval(tmp_path / "out", engine_states=states, limit=8, layout_samples=8)["engine_states"]
    assert part["samples"] == 4 and part["skipped"] == [
        {"path": str(states / "hs_1.safetensors"), "reason": part["skipped"][0]["reason"]}]
    assert "NaN" in part["skipped"][0]["reason"] and "token 3" in part["skipped"][0]["reason"]
    from draftops.documents.drafter_report import EngineStatesPart
    from draftops.report import engine_states_table

    table = engine_states_table(EngineStatesPart.model_validate(part), {})
    assert "1 not scored (NaN/inf)" in str(table.title) and "hs_1.safetensors" in str(table.title)


@pytest.mark.parametrize("where", ["tokenizer_config.json", "chat_template.jinja"])
def test_a_chat_template_of_megabytes_is_refused_naming_it(tmp_path, where):
    """A 50 MB template took 42 s to scan for the role markers of 2000 special tokens (a real one is KBs)."""
    big = "<|im_start|>" + "x" * (chattemplate.MAX_TEMPLATE + 1)
    if where == "chat_template.jinja":
        tokenizer(tmp_path, {})
        (tmp_path / where).write_text(big)
    else:
        tokenizer(tmp_path, {"chat_template": big})
    with pytest.raises(ConfigError) as err:
        chattemplate.Template.read(tmp_path)
    assert err.value.path == str(tmp_path / where) and "MB" in str(err.value)
