"""Each bad input gets a DrafterError whose one-paragraph message names file, tensor, shapes and fix."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from remote import events
from remote.drafter import (
    ConfigError,
    CorruptFileError,
    DrafterError,
    EmptyDataError,
    MissingTensorError,
    ShapeMismatchError,
    load_checkpoint,
)
from remote.drafter.data.dumps import DumpSet
from tests.support.drafter_support import demo, run_eval

REPO = Path(__file__).resolve().parent.parent


def _copy_draft(tmp_path: Path) -> Path:
    dst = tmp_path / "draft"
    shutil.copytree(demo().draft, dst)
    return dst


def _edit_weights(folder: Path, edit) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


def _one_paragraph(err: DrafterError, *parts: str) -> str:
    msg = str(err)
    assert "\n" not in msg and msg.count("Fix:") == 1
    for part in parts:
        assert part in msg, (part, msg)
    return msg


def test_fc_width_not_a_multiple_of_the_hidden_size(tmp_path: Path) -> None:
    ckpt = _copy_draft(tmp_path)
    _edit_weights(ckpt, lambda t: t.update({"fc.weight": torch.zeros(64, 3 * 64 + 5)}))
    with pytest.raises(ShapeMismatchError) as exc:
        load_checkpoint(ckpt)
    _one_paragraph(exc.value, str(ckpt / "model.safetensors"), "fc.weight", "[64, A*64]", "[64, 197]",
                   "target_hidden_size")


def test_hidden_size_of_data_differs_from_the_draft(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    save_file({"token_ids": torch.arange(10), "hidden_states": torch.zeros(10, 5, 32)},
              str(data / "hs_0.safetensors"))
    with pytest.raises(ShapeMismatchError) as exc:
        run_eval(tmp_path / "out", data=data)
    _one_paragraph(exc.value, str(data / "hs_0.safetensors"), "hidden_states", "[T, S, 64]", "[10, 5, 32]",
                   "different target")


def test_truncated_checkpoint(tmp_path: Path) -> None:
    ckpt = _copy_draft(tmp_path)
    file = ckpt / "model.safetensors"
    raw = file.read_bytes()
    file.write_bytes(raw[: len(raw) - 1000])
    with pytest.raises(CorruptFileError) as exc:
        load_checkpoint(ckpt)
    assert exc.value.tensor  # names the tensor whose bytes are cut off
    _one_paragraph(exc.value, str(file), "truncated", f"{len(raw)} bytes", f"{len(raw) - 1000} bytes", "re-copy")


def test_corrupt_header(tmp_path: Path) -> None:
    ckpt = _copy_draft(tmp_path)
    file = ckpt / "model.safetensors"
    raw = bytearray(file.read_bytes())
    raw[8:20] = b"not json!!!!"
    file.write_bytes(bytes(raw))
    with pytest.raises(CorruptFileError) as exc:
        load_checkpoint(ckpt)
    _one_paragraph(exc.value, str(file), "header")


def test_truncated_dump_files(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    raw = (demo().data / "hs_0.safetensors").read_bytes()
    (data / "hs_0.safetensors").write_bytes(raw[:-64])
    with pytest.raises(CorruptFileError) as exc:
        DumpSet.open(data).load(0)
    _one_paragraph(exc.value, "hs_0.safetensors", "hidden_states")
    pt = tmp_path / "pt"
    pt.mkdir()
    raw = (demo().data_pt / "data_0.pt").read_bytes()
    (pt / "data_0.pt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(CorruptFileError) as exc:
        DumpSet.open(pt).load(0)
    _one_paragraph(exc.value, "data_0.pt", "regenerate")


def test_empty_data_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "data_config.json").write_text("{}")
    with pytest.raises(EmptyDataError) as exc:
        run_eval(tmp_path / "out", data=tmp_path / "empty")
    _one_paragraph(exc.value, str(tmp_path / "empty"), "*.safetensors or *.pt")


def test_missing_draft_tensor(tmp_path: Path) -> None:
    ckpt = _copy_draft(tmp_path)
    _edit_weights(ckpt, lambda t: t.pop("layers.0.hidden_norm.weight"))
    with pytest.raises(MissingTensorError) as exc:
        load_checkpoint(ckpt)
    _one_paragraph(exc.value, str(ckpt), "layers.0.hidden_norm.weight", "[64]", "absent")


def test_missing_embedding_without_verifier() -> None:
    with pytest.raises(MissingTensorError) as exc:
        load_checkpoint(demo().draft_flat)
    _one_paragraph(exc.value, "embed_tokens.weight", "--verifier")


def test_missing_tensor_in_a_dump(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    save_file({"token_ids": torch.arange(10)}, str(data / "hs_0.safetensors"))
    with pytest.raises(MissingTensorError) as exc:
        DumpSet.open(data).load(0)
    _one_paragraph(exc.value, "hs_0.safetensors", "hidden_states", "token_ids")


def test_wrong_shape_from_the_config(tmp_path: Path) -> None:
    ckpt = _copy_draft(tmp_path)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["transformer_layer_config"]["hidden_size"] = 128
    (ckpt / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ShapeMismatchError) as exc:
        load_checkpoint(ckpt)
    _one_paragraph(exc.value, "config.json", "fc.weight", "[64, 192]", "--config")


def test_missing_config(tmp_path: Path) -> None:
    ckpt = _copy_draft(tmp_path)
    (ckpt / "config.json").unlink()
    with pytest.raises(ConfigError) as exc:
        load_checkpoint(ckpt)
    _one_paragraph(exc.value, "config.json", "--config")


def test_a_checkpoint_path_that_does_not_exist_is_named_as_such(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "draft"
    with pytest.raises(ConfigError) as exc:
        load_checkpoint(missing)
    msg = _one_paragraph(exc.value, "does not exist", str(missing), "--ckpt")
    assert str(missing.parent / "config.json") not in msg      # not the parent's config.json


def test_cli_reports_errors_as_event_and_exit_code(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "remote.drafter", "eval", "--ckpt", str(demo().draft),
                           "--data", str(tmp_path / "empty"), "--out", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3
    assert "error:" in proc.stderr and "Fix:" in proc.stderr
    errors = [e for e in map(events.parse, proc.stdout.splitlines()) if e and e["event"] == "error"]
    assert errors and errors[0]["kind"] == "empty_data" and errors[0]["fix"]
    assert not (tmp_path / "report.json").exists()


def test_dump_files_that_disagree(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(demo().data, data)
    save_file({"token_ids": torch.arange(10), "hidden_states": torch.zeros(10, 4, 64)},
              str(data / "hs_7.safetensors"))
    with pytest.raises(ShapeMismatchError) as exc:
        run_eval(tmp_path / "out", data=data, limit=16, layout_samples=4)
    _one_paragraph(exc.value, "hs_7.safetensors", "hidden_states", "[T, 5, 64]", "[10, 4, 64]")


def _data_with_config(tmp_path: Path, **changes: object) -> Path:
    data = tmp_path / "data"
    shutil.copytree(demo().data, data)
    cfg = json.loads((data / "data_config.json").read_text())
    cfg.update(changes)
    (data / "data_config.json").write_text(json.dumps(cfg))
    return data


def test_a_layer_named_twice_in_data_config_is_a_clear_error(tmp_path: Path) -> None:
    # two slots cannot hold one layer; taken as given, the verdict told to serve [-1, 1, 1]
    data = _data_with_config(tmp_path, layer_ids=[-1, 1, 1, 4, 5])
    with pytest.raises(ConfigError) as exc:
        DumpSet.open(data)
    _one_paragraph(exc.value, "data_config.json", "layer_ids", "[-1, 1, 1, 4, 5]", "distinct")


def test_a_vllm_convention_id_below_the_embedding_is_a_clear_error(tmp_path: Path) -> None:
    # vLLM ids start at 0 (the embedding); -1 became SGLang id -2 and a fix of [-2, 0, 2]
    data = _data_with_config(tmp_path, layer_id_convention="vllm")
    with pytest.raises(ConfigError) as exc:
        DumpSet.open(data)
    _one_paragraph(exc.value, "data_config.json", "layer_ids", ">= 0", "vllm")
    data = _data_with_config(tmp_path / "ok", layer_id_convention="vllm", layer_ids=[0, 2, 4, 5, 6])
    assert DumpSet.open(data).slots.layer_ids == (-1, 1, 3, 4, 5)


def test_a_bad_data_config_value_points_at_the_dump_not_the_draft_config(tmp_path: Path) -> None:
    # --config replaces the draft's config.json, never data_config.json
    data = _data_with_config(tmp_path, final_slot=-1)
    with pytest.raises(ConfigError) as exc:
        DumpSet.open(data)
    msg = _one_paragraph(exc.value, "data_config.json", "final_slot", ">= 0")
    fix = msg.split("Fix:")[1]
    assert "--config" not in fix and "trained with" not in fix and "hidden-state generator" in fix


def test_two_weight_files_holding_one_tensor_are_refused(tmp_path: Path) -> None:
    # no model.safetensors and no index: every *.safetensors is a shard; two saves of the draft
    # (step100 and step200) were merged tensor by tensor, the later name winning silently
    ckpt = tmp_path / "draft"
    ckpt.mkdir()
    shutil.copy(demo().draft / "config.json", ckpt)
    shutil.copy(demo().draft / "model.safetensors", ckpt / "step100.safetensors")
    shutil.copy(demo().draft / "model.safetensors", ckpt / "step200.safetensors")
    _edit_weights_file(ckpt / "step200.safetensors", lambda t: t["fc.weight"].mul_(0.5))
    with pytest.raises(ConfigError) as exc:
        load_checkpoint(ckpt)
    _one_paragraph(exc.value, "step100.safetensors", "step200.safetensors", "same tensor", "Tensor: ")


def _edit_weights_file(file: Path, edit) -> None:
    tensors = load_file(str(file))
    edit(tensors)
    save_file(tensors, str(file))


def _target_with(tmp_path: Path, edit) -> Path:
    target = tmp_path / "target"
    shutil.copytree(demo().target, target)
    _edit_weights_file(target / "model.safetensors", edit)
    return target


@pytest.mark.parametrize("tensor", ["lm_head.weight", "model.norm.weight"])
def test_a_verifier_head_or_norm_of_another_width_is_a_clear_error(tmp_path: Path, tensor: str) -> None:
    # the embedding has the draft's width, so only these tensors show that the target is another
    # model; the lm_head crashed the run with a RuntimeError, the norm broadcast or crashed later
    def narrow(t: dict[str, torch.Tensor]) -> None:
        t[tensor] = t[tensor][..., :32].contiguous()
    target = _target_with(tmp_path, narrow)
    with pytest.raises(ShapeMismatchError) as exc:
        run_eval(tmp_path / "out", verifier=target, limit=8, layout_samples=4)
    _one_paragraph(exc.value, str(target / "model.safetensors"), tensor, "64", "32", "--verifier")


def test_a_verifier_without_lm_head_whose_config_says_untied_is_a_clear_error(tmp_path: Path) -> None:
    # the embedding stood in for the missing head: every target was wrong and the verdict blamed
    # the draft (UNKNOWN near_chance, "the draft looks barely trained")
    target = _target_with(tmp_path, lambda t: t.pop("lm_head.weight"))
    assert json.loads((target / "config.json").read_text())["tie_word_embeddings"] is False
    with pytest.raises(MissingTensorError) as exc:
        run_eval(tmp_path / "out", verifier=target, limit=8, layout_samples=4)
    _one_paragraph(exc.value, str(target), "lm_head.weight", "tie_word_embeddings")


def _eval_cli(out: Path, limit: int = 4) -> subprocess.CompletedProcess[str]:
    d = demo()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    return subprocess.run([sys.executable, "-m", "remote.drafter", "eval", "--ckpt", str(d.draft), "--data",
                           str(d.data), "--device", "cpu", "--limit", str(limit), "--layout-samples", "2",
                           "--out", str(out)], cwd=REPO, env={**env, "PYTHONDONTWRITEBYTECODE": "1"},
                          capture_output=True, text=True, timeout=300,
                          preexec_fn=_file_size_limit(4096))


def _file_size_limit(limit: int):
    """preexec_fn: files the process writes stop at ``limit`` bytes (EFBIG, as on a full disk)."""
    def apply() -> None:
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_report_that_cannot_be_written_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    # report.json (~13 kB) on a disk that takes 4 kB: a traceback (exit 4) and a cut-off report.json.tmp
    proc = _eval_cli(tmp_path / "out")
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and "report.json" in proc.stderr and "--out" in proc.stderr
    assert list((tmp_path / "out").iterdir()) == []
    # --out naming a file, not a folder
    (tmp_path / "file").write_text("x")
    proc = _eval_cli(tmp_path / "file")
    assert proc.returncode == 3 and "Traceback" not in proc.stderr and "--out" in proc.stderr, proc.stderr
