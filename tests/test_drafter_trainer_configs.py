"""The layers of SpecForge and ModelOpt dumps from the trainer's own config files next to them
(remote/drafter/data/trainerconfig.py), when no data_config.json says: SpecForge 0.2.0's run config (its
ids, its draft config's eagle_config, or its default from the target's layer count) and ModelOpt's
eagle config, with the report saying where the ids came from."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from remote.drafter.data.dumps import DumpSet
from remote.drafter.errors import ConfigError
from tests.support.drafter_support import SPEC, demo, run_eval
from tests.support.trainer_dumps import write_data_config, write_modelopt, write_specforge

N = 24
AUX, FINAL = [1, 2, 3], 4  # demo slots of layers 1, 3, 4 (non-negative ids, as SpecForge requires) and the final
IDS = [SPEC.layer_a, SPEC.layer_b, SPEC.layer_b + 1]


@pytest.fixture(scope="module")
def states() -> tuple[torch.Tensor, torch.Tensor]:
    dumps = DumpSet.open(demo().data)
    samples = [dumps.load(i) for i in range(N)]
    assert list(dumps.slots.layer_ids or ())[1:4] == IDS
    return torch.stack([s.token_ids for s in samples]), torch.stack([s.hidden for s in samples])


def dumps(tmp: Path, states: tuple[torch.Tensor, torch.Tensor], fmt: str) -> Path:
    folder = tmp / fmt / "features"
    (write_specforge if fmt == "specforge" else write_modelopt)(folder, *states, AUX, FINAL)
    return folder


def json_file(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def run_config(folder: Path, model: dict) -> Path:
    """SpecForge 0.2.0's run config (config.schema.Config as JSON), one folder above the features."""
    return json_file(folder.parent / "train.json", {
        "model": {"target_model_path": str(demo().target), **model},
        "data": {"hidden_states_path": str(folder)}, "training": {"num_epochs": 1}})


def test_a_specforge_run_configs_ids_name_the_slots(tmp_path, states):
    folder = dumps(tmp_path, states, "specforge")
    cfg = run_config(folder, {"aux_hidden_state_layer_ids": IDS})
    slots = DumpSet.open(folder).slots
    assert slots.layer_ids == (*IDS, SPEC.num_layers - 1) and slots.num_hidden_layers == SPEC.num_layers
    assert slots.path == str(cfg) and "model.aux_hidden_state_layer_ids" in (slots.source or "")
    report = run_eval(tmp_path / "out", data=folder, limit=N, layout_samples=8)
    assert report["slot_layers_from"] == f"{slots.source}: {cfg}"
    assert report["data"]["slot_layer_ids"] == [*IDS, SPEC.num_layers - 1]
    assert report["verdict"]["reason"] != "no_layer_ids"  # the verdict can name layers now


def test_without_ids_the_run_config_reads_its_draft_configs_eagle_config(tmp_path, states):
    folder = dumps(tmp_path, states, "specforge")
    draft = json_file(tmp_path / "draft" / "config.json", {"architectures": ["LlamaForCausalLMEagle3"],
                                                           "eagle_config": {"eagle_aux_hidden_state_layer_ids": IDS}})
    run_config(folder, {"draft_model_config": str(draft.parent)})
    slots = DumpSet.open(folder).slots
    assert slots.layer_ids == (*IDS, SPEC.num_layers - 1) and "draft config" in (slots.source or "")


def test_without_ids_anywhere_the_run_config_means_specforges_default(tmp_path, states):
    folder = dumps(tmp_path, states, "specforge")
    target = json_file(tmp_path / "big-target" / "config.json", {"num_hidden_layers": 32})
    json_file(folder.parent / "train.json", {"model": {"target_model_path": str(target.parent)}, "data": {}})
    slots = DumpSet.open(folder).slots
    assert slots.layer_ids == (1, 15, 28, 31) and "default" in (slots.source or "")


def test_a_modelopt_eagle_config_names_the_aux_slots_and_the_verifier_the_final(tmp_path, states):
    folder = dumps(tmp_path, states, "modelopt")
    cfg = json_file(folder / "eagle_config.json", {"eagle_aux_hidden_state_layer_ids": IDS})
    slots = DumpSet.open(folder).slots
    assert slots.layer_ids is None and slots.aux_layer_ids == tuple(IDS)  # the layer count is not in it
    report = run_eval(tmp_path / "out", data=folder, limit=N, layout_samples=8)
    assert report["data"]["slot_layer_ids"] == [*IDS, SPEC.num_layers - 1]  # completed from --verifier
    assert report["slot_layers_from"] == f"{slots.source}: {cfg}" and "ModelOpt" in report["slot_layers_from"]


def test_data_config_json_wins_over_a_trainer_config(tmp_path, states):
    folder = dumps(tmp_path, states, "modelopt")
    json_file(folder / "eagle_config.json", {"eagle_aux_hidden_state_layer_ids": [0, 2, 5]})
    given = write_data_config(folder, {"layer_ids": [*IDS, 5], "final_slot": 3, "num_hidden_layers": 6})
    slots = DumpSet.open(folder).slots
    assert slots.layer_ids == (*IDS, 5) and slots.path == str(given) and slots.source is None


def test_a_trainer_config_naming_another_number_of_layers_is_one_paragraph(tmp_path, states):
    folder = dumps(tmp_path, states, "specforge")
    cfg = run_config(folder, {"aux_hidden_state_layer_ids": [1, 3]})
    with pytest.raises(ConfigError) as err:
        DumpSet.open(folder)
    text = str(err.value)
    assert str(cfg) in text and "3 aux slots" in text and "Fix:" in text
