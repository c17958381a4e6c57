"""The outside probe after the findings landing (trainer formats, engine states, trainer configs): each
hostile file is one paragraph naming it, never an internal-error traceback or a figure made up."""
from __future__ import annotations

import json

import pytest
import torch

from remote.drafter.errors import CorruptFileError
from remote.drafter.store import torchfile

FIX = "remake it"


@pytest.mark.parametrize("kind", ["sparse", "meta"])
def test_a_torch_file_holding_a_sparse_or_meta_tensor_is_refused_naming_it(tmp_path, kind):
    """weights_only lets both through; a .bin draft, a dump or a vocab map holding one reached
    reshape/.item() and ended as an INTERNAL traceback."""
    tensor = torch.eye(4).to_sparse() if kind == "sparse" else torch.empty(4, device="meta")
    file = tmp_path / "pytorch_model.bin"
    torch.save({"fc.weight": torch.ones(2), "nested": {"d2t": tensor}}, file)
    with pytest.raises(CorruptFileError) as err:
        torchfile.load(file, FIX)
    assert err.value.path == str(file) and err.value.tensor == "nested.d2t" and FIX in str(err.value)


def test_an_empty_torch_file_is_called_empty_not_a_gzip_stream(tmp_path):
    """A zero-byte pytorch_model.bin or vocab_mapping.pt was 'The gzip stream is cut short'."""
    file = tmp_path / "vocab_mapping.pt"
    file.write_bytes(b"")
    with pytest.raises(CorruptFileError) as err:
        torchfile.load(file, FIX)
    assert "empty (0 bytes)" in str(err.value) and "gzip" not in str(err.value)


def test_dense_saves_still_load(tmp_path):
    file = tmp_path / "x.pt"
    torch.save({"a": [torch.ones(3)], "b": (torch.zeros(2, dtype=torch.long),)}, file)
    assert torchfile.load(file, FIX)["a"][0].sum() == 3


@pytest.mark.parametrize("final", [2**63, 5])
def test_an_engine_state_final_slot_past_its_slots_is_refused_naming_the_file(tmp_path, final):
    """final_slot 2**63 in engine-states/data_config.json was 'Overflow when unpacking long long', an
    INTERNAL traceback deep in the scan; 5 of 5 slots indexed past the states."""
    from safetensors.torch import save_file

    from remote.drafter.data import engine_states
    from remote.drafter.data.dumps import DumpSet
    from remote.drafter.errors import ConfigError

    dumps, states = tmp_path / "dumps", tmp_path / "engine-states"
    for folder in (dumps, states):
        folder.mkdir()
        save_file({"token_ids": torch.arange(6), "hidden_states": torch.zeros(6, 5, 8)},
                  str(folder / "hs_0.safetensors"))
    (states / "data_config.json").write_text(json.dumps(
        {"layer_ids": [0, 1, 2, 3, 4], "layer_id_convention": "vllm", "final_slot": final}))
    with pytest.raises(ConfigError) as err:
        engine_states.open_for(states, DumpSet.open(dumps), 8)
    assert err.value.path == str(states / "data_config.json") and err.value.field == "final_slot"


@pytest.mark.parametrize("layers", [2**63, 1e308, 10**20])
def test_a_target_layer_count_past_any_target_is_refused_naming_the_target_config(tmp_path, layers):
    """SpecForge's default ids [1, n//2-1, n-4] of such a count became slot layer ids of 20 to 309
    digits in the report, and its final slot n-1 the verdict's layer."""
    from remote.drafter.data import trainerconfig
    from remote.drafter.errors import ConfigError

    (tmp_path / "tgt").mkdir()
    (tmp_path / "tgt" / "config.json").write_text(json.dumps({"num_hidden_layers": layers}))
    (tmp_path / "features").mkdir()
    (tmp_path / "train.json").write_text(json.dumps({"model": {"target_model_path": "tgt"}, "data": {}}))
    with pytest.raises(ConfigError) as err:
        trainerconfig.read(tmp_path / "features", 3, "SpecForge")
    assert err.value.path == str(tmp_path / "tgt" / "config.json") and err.value.field == "num_hidden_layers"
    assert "train.json" in str(err.value)


def test_a_figure_that_overflowed_is_written_as_null_and_said_the_report_stays_json(tmp_path):
    """One dump value of 3e38 squared past float32 in the slot norms: report.json held ``Infinity``,
    which the local reader refuses, so a finished evaluation showed no report at all."""
    from remote.drafter import report

    path = report.write({"schema": report.SCHEMA, "slot_norms": [{"rms": 1.0}, {"rms": float("inf")}],
                         "x": (float("nan"),), "warnings": []}, tmp_path)
    doc = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"{c} in report.json"))
    assert doc["slot_norms"] == [{"rms": 1.0}, {"rms": None}] and doc["x"] == [None]
    assert "slot_norms[1].rms, x[0]" in doc["warnings"][0]


def test_a_dump_value_near_the_float32_limit_leaves_a_report_the_local_side_reads(tmp_path):
    """End to end: a finite 3e38 in the first dumps; the slot norm overflows, report.json says null and
    the local model and the slot table take it ("n/a"), instead of refusing the whole report."""
    import shutil

    from rich.console import Console
    from safetensors.torch import load_file, save_file

    from draftops import report as view
    from draftops.documents import load
    from draftops.documents.drafter_report import DrafterReport
    from tests.support.drafter_support import demo, run_eval

    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(demo().data / "data_config.json", data)
    for i in range(8):
        tensors = load_file(str(demo().data / f"hs_{i}.safetensors"))
        tensors["hidden_states"][0, 0, 0] = 3e38
        save_file(tensors, str(data / f"hs_{i}.safetensors"))
    run_eval(tmp_path / "out", ckpt=demo().draft_fixed, data=data, limit=8, layout_samples=8)
    doc = load(DrafterReport, tmp_path / "out" / "report.json")
    assert doc.slot_norms[0].rms is None and any("slot_norms[0].rms" in w for w in doc.warnings)
    console = Console(width=120, record=True)
    console.print(view.slot_table(doc))
    assert "n/a" in console.export_text()


def test_a_target_whose_layer_weight_is_nan_says_its_layers_were_not_compared(tmp_path):
    """The tiny target's load error was swallowed: ``recomputed: false``, no note, the layer slots
    silently left out of slot_statistics (so no target-differs could be found)."""
    import shutil

    from safetensors.torch import load_file, save_file

    from remote.drafter.load.verifier import Verifier
    from remote.drafter.scoring.slotstats import SlotStats
    from tests.support.drafter_support import demo

    target = tmp_path / "target"
    shutil.copytree(demo().target, target)
    weights = load_file(str(target / "model.safetensors"))
    weights["model.layers.2.mlp.down_proj.weight"][0, 0] = float("nan")
    save_file(weights, str(target / "model.safetensors"))
    stats = SlotStats.prepare(Verifier(target), (-1, 1, 3, 4, 5), None)
    assert [t.reference for t in stats.tallies.values()] == ["embedding"]
    assert len(stats.notes) == 1 and "not recomputed" in stats.notes[0]
    assert "model.layers.2.mlp.down_proj.weight" in stats.notes[0] and str(target) in stats.notes[0]


def test_engine_states_of_which_none_is_scored_give_no_accept_length(tmp_path):
    """Every engine-state file with a NaN: all skipped, and each layout's accept length read 1.0 (1 + a
    sum over no positions), a figure of a draft that never drafts right, made up."""
    from safetensors.torch import load_file, save_file

    from tests.support.drafter_support import demo, run_eval

    states = tmp_path / "engine-states"
    states.mkdir()
    (states / "data_config.json").write_text(json.dumps(
        {"layer_ids": [0, 2, 4, 5, 6], "layer_id_convention": "vllm", "final_slot": 4, "num_hidden_layers": 6}))
    for i in range(4):
        tensors = load_file(str(demo().data / f"hs_{i}.safetensors"))
        tensors["hidden_states"][2, 1, 0] = float("nan")
        save_file(tensors, str(states / f"hs_{i}.safetensors"))
    report = run_eval(tmp_path / "out", ckpt=demo().draft_fixed, limit=8, layout_samples=8, engine_states=states)
    es = report["engine_states"]
    assert len(es["skipped"]) == 4 and es["layouts"]
    assert all(row["accept_length"] is None and row["step0_acc"] is None for row in es["layouts"])


@pytest.mark.parametrize("huge", [2**63 + 1, 1 << 16])
def test_draft_config_without_a_target_refuses_an_id_past_any_target(tmp_path, capsys, huge):
    """``--layer-ids=-1,1,9223372036854775808`` without --target was written into config.json
    (as 2**63 + 1, in vLLM's convention): an id no engine reads as a layer."""
    import shutil

    from remote import exitcodes
    from remote.draft_config.__main__ import main
    from tests.support.drafter_support import demo

    ckpt = tmp_path / "draft"
    shutil.copytree(demo().draft, ckpt)
    before = (ckpt / "config.json").read_bytes()
    code = main(["--ckpt", str(ckpt), f"--layer-ids=-1,1,{huge}", "--out", str(tmp_path / "out")])
    said = capsys.readouterr().err
    assert code == exitcodes.REFUSED and str(huge) in said and "--target" in said
    assert (ckpt / "config.json").read_bytes() == before and not list(ckpt.glob("*draftops-bak*"))


_BOMB = """
import gzip, resource, sys
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from remote.drafter.store import torchfile
from remote.drafter.errors import CorruptFileError
try:
    torchfile.load(Path(sys.argv[1]), "remake it")
except CorruptFileError as exc:
    print(exc)
"""


def test_a_gzip_bomb_sample_is_refused_before_it_fills_memory_naming_the_file(tmp_path):
    """8.3 MB expanding to 8 GiB read until MemoryError; a 2 GiB one was read whole, then called "a pickle
    that would run code". The expansion is bounded (64 times the file, at least 256 MiB), under a memory cap."""
    import gzip
    import os
    import subprocess
    import sys
    from pathlib import Path

    bomb = tmp_path / "data_0.ckpt.gz"
    zeros = bytes(1 << 24)
    with gzip.open(bomb, "wb", compresslevel=1) as out:        # 768 MiB of zeros in well under 1 MiB
        for _ in range(48):
            out.write(zeros)
    assert bomb.stat().st_size < 4 << 20
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", _BOMB, str(bomb)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gzip stream expands past 256 MiB" in done.stdout and str(bomb) in done.stdout, done.stdout
    assert "would run code" not in done.stdout


def test_a_gzip_sample_within_the_bound_still_loads(tmp_path):
    import gzip
    import io

    buffer = io.BytesIO()
    torch.save({"hidden_states": torch.randn(64, 3, 32)}, buffer)
    file = tmp_path / "data_0.ckpt.gz"
    file.write_bytes(gzip.compress(buffer.getvalue()))
    assert torchfile.load(file, FIX)["hidden_states"].shape == (64, 3, 32)


def test_bytes_that_are_no_pickle_are_not_called_code(tmp_path):
    """A sample of zeros was "a pickle that would run code"; it holds no pickle at all."""
    import gzip

    file = tmp_path / "data_0.ckpt.gz"
    file.write_bytes(gzip.compress(bytes(4096)))
    with pytest.raises(CorruptFileError) as err:
        torchfile.load(file, FIX)
    assert "is not a torch save" in str(err.value) and "run code" not in str(err.value)
