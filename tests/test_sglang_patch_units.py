"""Pieces of the patcher that need no SGLang run: version lookup, injected helpers, edits, files."""
from __future__ import annotations

import json
import stat
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from remote import exitcodes, fileio
from remote.sglang_patch import locate, template
from remote.sglang_patch.edits import Edit, Source
from remote.sglang_patch.targets import resolve_models
from tests.support.sglang_wheels import extract, run_patcher


@pytest.mark.parametrize("version, metadata, source", [
    ("0.5.2", True, "metadata"), ("0.5.2", False, "version.py"), ("0.5.23", False, "_version.py"),
])
def test_version_is_read_without_importing_sglang(tmp_path, monkeypatch, version, metadata, source):
    root = extract(version, tmp_path, metadata=metadata)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.delitem(sys.modules, "sglang", raising=False)
    install = locate.locate()
    assert (install.version, install.version_source) == (version, source)
    assert install.root == (root / "sglang").resolve()
    assert "sglang" not in sys.modules, "locate() must not execute sglang/__init__.py"


@pytest.fixture()
def helpers() -> dict[str, Any]:
    namespace: dict[str, Any] = {"__name__": "helpers_under_test"}
    exec(compile(template.HELPER_BLOCK, "<helpers>", "exec"), namespace)
    return namespace


def _model(inner: Any) -> SimpleNamespace:
    return SimpleNamespace(pp_group=SimpleNamespace(is_last_rank=True), model=inner,
                           capture_aux_hidden_states=False)


def test_negative_ids_reach_a_model_level_setter_with_stale_flags_cleared(helpers):
    layers = [SimpleNamespace(_is_layer_to_capture=i in (2, 30)) for i in range(40)]

    class MoeModel:  # Qwen MoE style: the inner model flags its layers itself
        def __init__(self) -> None:
            self.layers = layers

        def set_eagle3_layers_to_capture(self, indices):
            self.layers_to_capture = indices
            for i in indices:
                self.layers[i]._is_layer_to_capture = True

    model = _model(MoeModel())
    helpers[template.SET_HELPER](model, [-1, 2, 30], original=None)
    assert model.model.layers_to_capture == [0, 3, 31]
    assert [i for i, layer in enumerate(layers) if layer._is_layer_to_capture] == [0, 3, 31]
    assert model.capture_aux_hidden_states is True


def test_a_call_without_ids_reuses_the_last_explicit_ids(helpers):
    model = _model(SimpleNamespace(layers_to_capture=[]))
    defaults = []
    helpers[template.SET_HELPER](model, [-1, 5], original=defaults.append)
    helpers[template.SET_HELPER](model, None, original=defaults.append)
    assert model.model.layers_to_capture == [0, 6] and defaults == []


def test_non_last_pipeline_rank_captures_nothing(helpers):
    model = _model(SimpleNamespace(layers_to_capture=[]))
    model.pp_group.is_last_rank = False
    helpers[template.SET_HELPER](model, [-1, 2], original=None)
    assert model.model.layers_to_capture == [] and model.capture_aux_hidden_states is False


def test_configured_ids_come_from_the_running_servers_draft_config(helpers, tmp_path, monkeypatch):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(
        {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 30]}}))
    server_args = types.ModuleType("sglang.srt.server_args")
    server_args.get_global_server_args = lambda: SimpleNamespace(  # type: ignore[attr-defined]
        speculative_draft_model_path=str(draft))
    monkeypatch.setitem(sys.modules, "sglang.srt.server_args", server_args)
    monkeypatch.setenv(template.ENV_LAYER_IDS, "7,8")
    configured = helpers[template.CONFIG_HELPER]
    assert configured() == [-1, 2, 30]
    assert configured(str(tmp_path / "no-such-draft")) == [7, 8]
    assert configured(str(tmp_path / "no-such-draft"), use_env=False) is None
    monkeypatch.setenv(template.ENV_LAYER_IDS, "1,x")
    assert configured(str(tmp_path / "no-such-draft")) is None


def test_edits_are_byte_exact_and_refuse_overlaps():
    data = "x = 1\nif True:\n    y = 'ü' + z\n".encode()
    src = Source(data)
    stmt = src.tree.body[1].body[0]
    new = src.apply([src.comment_before(stmt, "note"), Edit(*src.span(stmt.value), "(w)")])
    assert new == b"x = 1\nif True:\n    # note\n    y = (w)\n"
    with pytest.raises(ValueError, match="overlapping"):
        src.apply([Edit(0, 3, "a"), Edit(2, 4, "b")])


def test_atomic_write_keeps_the_mode_and_backups_are_never_overwritten(tmp_path):
    path = tmp_path / "f.py"
    path.write_bytes(b"old")
    path.chmod(0o640)
    fileio.atomic_write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["f.py"]
    with pytest.raises(FileExistsError):
        fileio.write_exclusive(path, b"other")
    assert path.read_bytes() == b"new"


def test_model_names_and_aliases():
    assert resolve_models(None) == ["deepseek_v2", "llama", "qwen2", "qwen3"]
    assert resolve_models(["Kimi", "deepseek", "qwen3"]) == ["deepseek_v2", "qwen3"]
    with pytest.raises(ValueError, match="unknown model 'gpt'"):
        resolve_models(["gpt"])


def test_cli_rejects_unknown_model_names(tmp_path):
    root = extract("0.5.23", tmp_path / "site")
    proc = run_patcher(root, "status", "--models", "gpt", state_dir=tmp_path / "s",
                       out=tmp_path / "o")
    assert proc.returncode == exitcodes.REFUSED and "unknown model 'gpt'" in proc.stderr
    assert json.loads(Path(tmp_path / "o" / "patch.json").read_text())["ok"] is False


KNOWN_LLAMA = """
class LlamaModel:
    def forward(self, hidden_states, residual):
        aux_hidden_states = []
        for i in range(3):
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
        return aux_hidden_states


class LlamaForCausalLM:
    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if not self.pp_group.is_last_rank:
            return
        self.capture_aux_hidden_states = True
        if layer_ids is None:
            self.model.layers_to_capture = [2, 4, 6]
        else:
            self.model.layers_to_capture = [val + 1 for val in layer_ids]
"""


def test_verify_import_check_imports_each_patched_module(tmp_path):
    pkg = tmp_path / "site" / "sglang"
    (pkg / "srt" / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text('__version__ = "9.9.9"\n')
    (pkg / "srt" / "models" / "llama.py").write_text(KNOWN_LLAMA)
    state = tmp_path / "state"
    assert run_patcher(tmp_path / "site", "apply", state_dir=state).returncode == 0
    proc = run_patcher(tmp_path / "site", "verify", "--import-check", state_dir=state,
                       out=tmp_path / "v")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = json.loads((tmp_path / "v" / "patch.json").read_text())["checks"]
    assert {"file": "srt/models/llama.py", "check": "import sglang.srt.models.llama",
            "ok": True, "detail": "ok"} in checks
    (pkg / "srt" / "__init__.py").write_text("raise RuntimeError('boom in srt')\n")
    proc = run_patcher(tmp_path / "site", "verify", "--import-check", state_dir=state)
    assert proc.returncode == 1 and "boom in srt" in proc.stderr
