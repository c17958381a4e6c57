"""SpecForge's and ModelOpt's dump formats: the demo written out in each gives the verdict and fix the
speculators format gives for the same states, and bad files are refused in one paragraph each."""
from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from remote.drafter import DataError
from remote.drafter.data.dumps import DumpSet
from remote.drafter.errors import ConfigError, CorruptFileError, MissingTensorError, ShapeMismatchError
from tests.support.drafter_support import SPEC, demo, run_eval
from tests.support.trainer_dumps import write_data_config, write_modelopt, write_specforge, write_speculators

N = 96
FAST = {"limit": N, "layout_samples": 48}
AUX, FINAL = [0, 1, 2], 4  # the demo's slots of the trained layers -1, 1, 3, and its final slot (layer 5)
HELD = {"layer_ids": [-1, SPEC.layer_a, SPEC.layer_b, SPEC.num_layers - 1], "layer_id_convention": "sglang",
        "final_slot": 3, "num_hidden_layers": SPEC.num_layers}


@pytest.fixture(scope="module")
def states() -> tuple[torch.Tensor, torch.Tensor]:
    """The first N demo samples: ids [N, T] and all five slots [N, T, 5, H]."""
    dumps = DumpSet.open(demo().data)
    samples = [dumps.load(i) for i in range(N)]
    return torch.stack([s.token_ids for s in samples]), torch.stack([s.hidden for s in samples])


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory, states: tuple[torch.Tensor, torch.Tensor]) -> dict[str, Path]:
    ids, slots = states
    root = tmp_path_factory.mktemp("trainers")
    out = {name: root / name for name in ("speculators", "specforge", "modelopt")}
    write_speculators(out["speculators"], ids, slots, AUX + [FINAL])
    write_specforge(out["specforge"], ids, slots, AUX, FINAL, per_folder=16, gz_from=48)
    write_modelopt(out["modelopt"], ids, slots, AUX, FINAL)
    for folder in out.values():
        write_data_config(folder, HELD)
    return out


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, folders: dict[str, Path]) -> dict:
    return run_eval(tmp_path_factory.mktemp("ref"), data=folders["speculators"], **FAST)


def _scan(report: dict) -> dict[tuple[int, ...], float]:
    return {tuple(r["layer_ids"]): r["acc"] for r in report["layouts"]}


def test_the_reference_is_the_demos_mismatch_with_layer_4_not_held(reference: dict) -> None:
    v = reference["verdict"]
    assert (v["status"], v["fix_layer_ids"]) == ("MISMATCH", SPEC.trained_ids)
    # the configured [1, 3, 4] (SGLang ids) make vLLM capture layer 4, which these dumps do not hold:
    # the message names it in vLLM's own ids, where it is layer 5
    assert v["served_slots"] is None and "not all in this dump (missing [5])" in v["message"]


@pytest.mark.parametrize("fmt", ["specforge", "modelopt"])
def test_the_demo_in_a_trainers_format_gives_the_same_verdict_and_fix(fmt: str, folders: dict[str, Path],
                                                                     reference: dict, tmp_path: Path) -> None:
    report = run_eval(tmp_path, data=folders[fmt], **FAST)
    v, ref = report["verdict"], reference["verdict"]
    assert (v["status"], v["fix_layer_ids"], v["fix_layer_ids_vllm"]) == (
        "MISMATCH", ref["fix_layer_ids"], ref["fix_layer_ids_vllm"])
    assert v["message"] == ref["message"]
    assert _scan(report) == pytest.approx(_scan(reference), abs=1e-9)   # the same states, the same numbers
    data = report["data"]
    assert data["formats"] == [fmt] and data["slots"] == 4 and data["final_slot"] == 3
    assert data["final_slot_source"].endswith("hidden_state" if fmt == "specforge" else "hidden_states")
    assert report["slot_layers_from"] == str(folders[fmt] / "data_config.json")
    assert data["slot_layer_ids"] == HELD["layer_ids"]


def test_specforge_rows_folders_are_read_in_natural_order_gz_included(
        folders: dict[str, Path], states: tuple[torch.Tensor, torch.Tensor]) -> None:
    ids, slots = states
    dumps = DumpSet.open(folders["specforge"])
    assert len(dumps.files) == N and dumps.files[16].parent.name == "rows_16-32"   # not rows_160 before rows_16
    assert dumps.files[60].name == "data_60.ckpt.gz"
    for i in (0, 17, 60, N - 1):
        sample = dumps.load(i)
        assert torch.equal(sample.token_ids, ids[i])
        assert torch.equal(sample.hidden, slots[i][:, AUX + [FINAL]])
        assert sample.loss_mask is not None and bool(sample.loss_mask.all())


def test_without_a_data_config_the_report_says_the_layers_are_unknown_and_why(
        folders: dict[str, Path], tmp_path: Path) -> None:
    data = tmp_path / "modelopt"
    data.mkdir()
    for f in sorted(folders["modelopt"].glob("*.pt"))[:24]:
        (data / f.name).symlink_to(f)
    report = run_eval(tmp_path / "out", data=data, limit=24, layout_samples=8)
    assert report["slot_layers_from"].startswith("unknown: ModelOpt dumps do not record their layers")
    assert "capture-check" in report["slot_layers_from"]
    assert (report["verdict"]["status"], report["verdict"]["reason"]) == ("UNKNOWN", "no_layer_ids")
    assert report["data"]["final_slot"] == 3    # the format says which slot is the final one
    assert "YAML" not in report["slot_layers_from"]
    (tmp_path / "run.yaml").write_text("model:\n  aux_hidden_state_layer_ids: [1, 2, 3]\n")  # one folder up
    report = run_eval(tmp_path / "out2", data=data, limit=24, layout_samples=8)
    assert f"{tmp_path / 'run.yaml'} looks like a trainer's YAML run config" in report["slot_layers_from"]
    assert report["verdict"]["reason"] == "no_layer_ids"   # named, never guessed from


# ---- bad input: one paragraph naming the file, nothing scored ------------------------------------------

def _refused(tmp_path: Path, data: Path, error: type[Exception], *words: str) -> str:
    out = tmp_path / "out"
    with pytest.raises(error) as exc:
        run_eval(out, data=data, limit=8, layout_samples=4)
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg and "Fix:" in msg
    for word in words:
        assert word in msg, (word, msg)
    assert not (out / "report.json").exists()
    return msg


def _specforge_copy(tmp_path: Path, folders: dict[str, Path], count: int = 8) -> Path:
    data = tmp_path / "data"
    (data / "rows_0-16").mkdir(parents=True)
    for i in range(count):
        src = folders["specforge"] / "rows_0-16" / f"data_{i}.ckpt"
        (data / "rows_0-16" / src.name).write_bytes(src.read_bytes())
    write_data_config(data, HELD)
    return data


def _record(folders: dict[str, Path], i: int = 0) -> dict[str, torch.Tensor]:
    return torch.load(folders["specforge"] / "rows_0-16" / f"data_{i}.ckpt", weights_only=True)


def test_a_ckpt_that_is_not_a_torch_file(folders: dict[str, Path], tmp_path: Path) -> None:
    data = _specforge_copy(tmp_path, folders)
    bad = data / "rows_0-16" / "data_0.ckpt"
    bad.write_bytes(b"sample 0: written by a tool that crashed\n" * 20)
    _refused(tmp_path, data, CorruptFileError, str(bad), "not a readable torch save", "prepare_hidden_states")


class _RunsCode:
    """Unpickling this runs a shell command (what weights_only=True must refuse)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_a_pickle_that_would_run_code_is_refused_unrun(folders: dict[str, Path], tmp_path: Path) -> None:
    data = _specforge_copy(tmp_path, folders)
    marker = tmp_path / "MARKER"
    bad = data / "rows_0-16" / "data_3.ckpt"
    torch.save({**_record(folders, 3), "extra": _RunsCode(marker)}, bad)
    # the payload is real: an unsafe load of the same file does run it (in a child process)
    probe = tmp_path / "probe"
    torch.save({"extra": _RunsCode(probe)}, tmp_path / "probe.ckpt")
    subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(tmp_path / 'probe.ckpt')!r}, "
                    "weights_only=False)"], check=True, timeout=120)
    assert probe.exists()
    _refused(tmp_path, data, CorruptFileError, str(bad), "would run code", "refused unread")
    assert not marker.exists()


def test_a_gzip_cut_short(folders: dict[str, Path], tmp_path: Path) -> None:
    data = _specforge_copy(tmp_path, folders, 4)
    raw = gzip.compress((folders["specforge"] / "rows_0-16" / "data_4.ckpt").read_bytes())
    bad = data / "rows_0-16" / "data_4.ckpt.gz"
    bad.write_bytes(raw[: len(raw) * 2 // 3])
    _refused(tmp_path, data, CorruptFileError, str(bad), "gzip stream is cut short")


def test_aux_width_not_a_multiple_of_the_hidden_size(folders: dict[str, Path], tmp_path: Path) -> None:
    data = _specforge_copy(tmp_path, folders)
    record = _record(folders)
    record["aux_hidden_state"] = record["aux_hidden_state"][:, :-5]
    bad = data / "rows_0-16" / "data_0.ckpt"
    torch.save(record, bad)
    _refused(tmp_path, data, ShapeMismatchError, str(bad), "aux_hidden_state is 187 wide",
             f"not a multiple of the hidden size {SPEC.hidden_size}")


@pytest.mark.parametrize("drop", ["aux_hidden_state", "input_ids", "hidden_state"])
def test_missing_keys(folders: dict[str, Path], tmp_path: Path, drop: str) -> None:
    data = _specforge_copy(tmp_path, folders)
    record = _record(folders)
    del record[drop]
    bad = data / "rows_0-16" / "data_0.ckpt"
    torch.save(record, bad)
    _refused(tmp_path, data, MissingTensorError, str(bad), f"lacks {drop}", "SpecForge")


def test_a_modelopt_file_without_aux_states(folders: dict[str, Path], tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    record = torch.load(folders["modelopt"] / "conv-0.pt", weights_only=True)
    del record["aux_hidden_states"]
    torch.save(record, data / "conv-0.pt")
    _refused(tmp_path, data, MissingTensorError, str(data / "conv-0.pt"), "aux_hidden_states")


def test_safetensors_and_ckpt_in_one_folder(folders: dict[str, Path], tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for name in ("hs_0.safetensors", "hs_1.safetensors"):
        (data / name).write_bytes((folders["speculators"] / name).read_bytes())
    (data / "data_2.ckpt").write_bytes((folders["specforge"] / "rows_0-16" / "data_2.ckpt").read_bytes())
    _refused(tmp_path, data, DataError, "mixes dump formats", "hs_0.safetensors", "data_2.ckpt")


def test_modelopt_and_legacy_pt_in_one_folder(folders: dict[str, Path], tmp_path: Path) -> None:
    """Both are .pt: told apart by their keys as they load, never read one way for both."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(6):
        (data / f"conv-{i}.pt").write_bytes((folders["modelopt"] / f"conv-{i}.pt").read_bytes())
    (data / "data_3.pt").write_bytes((demo().data_pt / "data_3.pt").read_bytes())
    write_data_config(data, HELD)
    assert DumpSet.open(data).format == "modelopt"
    _refused(tmp_path, data, DataError, "mixes dump formats", "data_3.pt is speculators legacy .pt",
             "conv-0.pt is ModelOpt")


def test_a_final_slot_that_is_not_the_files_final_state(folders: dict[str, Path], tmp_path: Path) -> None:
    data = _specforge_copy(tmp_path, folders)
    write_data_config(data, {**HELD, "final_slot": 1})
    _refused(tmp_path, data, ConfigError, "final_slot", "data_config.json", '"final_slot": 3')
