"""Every refusal leaves SGLang and the state folder untouched and explains itself on stderr."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from remote import exitcodes
from remote.sglang_patch import actions, locate
from remote.sglang_patch.errors import CompileFailed
from remote.sglang_patch.state import StateStore
from tests.support.sglang_wheels import (
    STUB_INIT,
    UNSUPPORTED_VERSION,
    copy_code,
    extract,
    originals,
    run_patcher,
    tree_bytes,
)

LLAMA = "srt/models/llama.py"


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _refused(proc: subprocess.CompletedProcess[str], out: Path, error_type: str) -> str:
    assert proc.returncode == exitcodes.REFUSED, proc.stdout + proc.stderr
    payload = json.loads((out / "patch.json").read_text())
    assert payload["ok"] is False and payload["error_type"] == error_type
    assert payload["changed"] == []
    assert payload["error"] in proc.stderr
    assert "\n" not in proc.stderr.strip(), "the error is one paragraph"
    return proc.stderr


def _synthetic(root: Path, files: dict[str, str]) -> Path:
    """A fake sglang (version 9.9.9) holding only ``files``."""
    pkg = root / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(STUB_INIT)
    (pkg / "version.py").write_text('__version__ = "9.9.9"\n')
    for rel, text in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(textwrap.dedent(text))
    return root


UNKNOWN_SETTER = {LLAMA: """
    class LlamaModel:
        def forward(self, hidden_states, residual, aux_hidden_states):
            for i in range(3):
                if i in self.layers_to_capture:
                    aux_hidden_states.append(hidden_states + residual)

    class LlamaForCausalLM:
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            self.model.layers_to_capture = sorted(layer_ids or [])
    """}
UNKNOWN_CAPTURE = {LLAMA: """
    class LlamaModel:
        def forward(self, hidden_states, residual, aux_hidden_states):
            for i in range(3):
                if i in self.layers_to_capture:
                    pass

    class LlamaForCausalLM:
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            self.model.layers_to_capture = [v + 1 for v in layer_ids]
    """}
UNKNOWN_RUNNER = {"srt/model_executor/cuda_graph_runner.py": """
    def capture(model):
        model.set_eagle3_layers_to_capture()
    """, "srt/model_executor/model_runner.py": """
    def init(self, ids):
        self.model.set_eagle3_layers_to_capture(ids)
    """, LLAMA: UNKNOWN_CAPTURE[LLAMA].replace("pass", "aux_hidden_states.append(hidden_states)")}


@pytest.mark.parametrize("files, culprit", [
    (UNKNOWN_SETTER, "llama.py"), (UNKNOWN_CAPTURE, "llama.py"),
    (UNKNOWN_RUNNER, "cuda_graph_runner.py"),
], ids=["setter", "capture", "runner-call"])
def test_unknown_code_shape_is_refused(tmp_path, files, culprit):
    root = _synthetic(tmp_path / "site", files)
    before = _snapshot(root)
    proc = run_patcher(root, "apply", state_dir=tmp_path / "state", out=tmp_path / "out")
    message = _refused(proc, tmp_path / "out", "UnknownShape")
    assert culprit in message and "does not recognise" in message and "9.9.9" in message
    assert _snapshot(root) == before
    assert not (tmp_path / "state").exists()
    status = run_patcher(root, "status", state_dir=tmp_path / "state", out=tmp_path / "s")
    assert status.returncode == 0
    rows = {r["file"]: r for r in json.loads((tmp_path / "s" / "patch.json").read_text())["files"]}
    culprit_row = next(r for f, r in rows.items() if f.endswith(culprit))
    assert culprit_row["state"] == "unsupported" and culprit_row["known_shape"] is False


def test_revert_refuses_a_file_edited_after_the_patch(tmp_path):
    root = extract("0.5.13", tmp_path / "site")
    state = tmp_path / "state"
    assert run_patcher(root, "apply", state_dir=state).returncode == 0
    llama = root / "sglang" / LLAMA
    llama.write_bytes(llama.read_bytes() + b"# a local hotfix\n")
    before, state_before = _snapshot(root), _snapshot(state)
    proc = run_patcher(root, "revert", state_dir=state, out=tmp_path / "out")
    message = _refused(proc, tmp_path / "out", "ModifiedFile")
    assert str(llama) in message and "--force-reinstall" in message
    assert _snapshot(root) == before and _snapshot(state) == state_before
    assert run_patcher(root, "status", state_dir=state, out=tmp_path / "s").returncode == 0
    payload = json.loads((tmp_path / "s" / "patch.json").read_text())
    rows = {r["file"]: r["state"] for r in payload["files"]}
    assert rows[LLAMA] == "modified" and rows["srt/models/deepseek_v2.py"] == "patched"
    again = run_patcher(root, "apply", state_dir=state, out=tmp_path / "a")
    _refused(again, tmp_path / "a", "ModifiedFile")
    assert _snapshot(root) == before


def test_revert_refuses_patched_code_without_a_record(tmp_path):
    root = extract("0.5.13", tmp_path / "site")
    assert run_patcher(root, "apply", state_dir=tmp_path / "state").returncode == 0
    before = _snapshot(root)
    proc = run_patcher(root, "revert", state_dir=tmp_path / "other", out=tmp_path / "out")
    message = _refused(proc, tmp_path / "out", "ModifiedFile")
    assert "no record" in message and str(tmp_path / "other") in message
    assert _snapshot(root) == before


def _world_readable_dir() -> Path:
    # pytest's tmp_path sits under a 0700 folder that another user cannot enter
    path = Path(tempfile.mkdtemp(prefix="draftops-ro-"))
    path.chmod(0o755)
    return path


def test_read_only_site_packages_is_refused_before_any_write():
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    as_nobody = (setpriv, "--reuid=65534", "--regid=65534", "--clear-groups")
    probe = subprocess.run([*as_nobody, sys.executable, "-c", "import os; print(os.getuid())"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != "65534":
        pytest.skip(f"cannot run {sys.executable} as uid 65534: {probe.stderr.strip()}")
    base = _world_readable_dir()
    try:
        root = extract("0.5.13", base / "site")
        code = copy_code(base / "code")
        state = base / "state"
        state.mkdir(mode=0o777)
        state.chmod(0o777)  # writable by nobody: only site-packages may block the apply
        out = base / "out"
        out.mkdir()
        out.chmod(0o777)
        for path in [base, *base.rglob("*")]:
            if path not in (state, out):
                path.chmod(0o755 if path.is_dir() else 0o644)
        before = _snapshot(root)
        proc = run_patcher(root, "apply", state_dir=state, out=out, cwd=code, prefix=as_nobody)
        message = _refused(proc, out, "NotWritable")
        assert "uid 65534" in message and str(root / "sglang" / LLAMA) in message
        assert _snapshot(root) == before
        assert list(state.iterdir()) == []
    finally:
        shutil.rmtree(base)


def test_version_without_configured_ids_is_refused(tmp_path):
    root = extract(UNSUPPORTED_VERSION, tmp_path / "site")
    before = _snapshot(root)
    proc = run_patcher(root, "apply", state_dir=tmp_path / "state", out=tmp_path / "out")
    message = _refused(proc, tmp_path / "out", "UnsupportedVersion")
    assert "0.4.6" in message and "takes no layer ids" in message
    assert _snapshot(root) == before


def test_explicitly_requested_unsupported_model_is_refused(tmp_path):
    root = extract("0.5.2", tmp_path / "site")
    before = _snapshot(root)
    proc = run_patcher(root, "apply", "--models", "kimi,llama", state_dir=tmp_path / "state",
                       out=tmp_path / "out")
    message = _refused(proc, tmp_path / "out", "UnsupportedVersion")
    assert "deepseek_v2" in message and "0.5.5" in message
    assert _snapshot(root) == before
    ok = run_patcher(root, "apply", "--models", "llama", state_dir=tmp_path / "state",
                     out=tmp_path / "ok")
    assert ok.returncode == 0
    changed = json.loads((tmp_path / "ok" / "patch.json").read_text())["changed"]
    assert changed == [LLAMA, "srt/model_executor/cuda_graph_runner.py"]


def test_missing_sglang_is_refused(tmp_path):
    proc = run_patcher(tmp_path, "status", state_dir=tmp_path / "state", out=tmp_path / "out")
    message = _refused(proc, tmp_path / "out", "SglangNotFound")
    assert "find_spec('sglang')" in message


def test_patch_that_does_not_compile_is_never_written(tmp_path, monkeypatch):
    root = extract("0.5.10", tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr("remote.sglang_patch.template.guarded_capture",
                        lambda hidden, residual: f"({hidden} +)")
    install = locate.locate()
    store = StateStore(tmp_path / "state", install.version)
    with pytest.raises(CompileFailed, match="does not compile"):
        actions.apply(install, store)
    assert tree_bytes(root) == originals("0.5.10")
    assert not (tmp_path / "state").exists()


def test_failed_write_rolls_back_every_file(tmp_path, monkeypatch):
    root = extract("0.5.10", tmp_path / "site")
    monkeypatch.syspath_prepend(str(root))
    real = actions._byte_compile
    calls = []

    def flaky(path: Path) -> None:
        calls.append(path)
        real(path)
        if len(calls) == 3:
            raise CompileFailed(f"{path} rejected by the test")

    monkeypatch.setattr(actions, "_byte_compile", flaky)
    install = locate.locate()
    with pytest.raises(CompileFailed, match="rejected by the test"):
        actions.apply(install, StateStore(tmp_path / "state", install.version))
    assert len(calls) == 3
    assert tree_bytes(root) == originals("0.5.10")
    modes = {os.stat(root / "sglang" / rel).st_mode for rel in originals("0.5.10")}
    assert len(modes) == 1


def test_verify_reports_a_tampered_backup(tmp_path):
    root = extract("0.5.23", tmp_path / "site")
    state = tmp_path / "state"
    assert run_patcher(root, "apply", state_dir=state).returncode == 0
    [backup] = (state / "0.5.23").glob("*.orig")
    backup.write_bytes(backup.read_bytes() + b"# tampered\n")
    proc = run_patcher(root, "verify", state_dir=state, out=tmp_path / "v")
    assert proc.returncode == 1
    checks = json.loads((tmp_path / "v" / "patch.json").read_text())["checks"]
    [bad] = [c for c in checks if not c["ok"]]
    assert bad["check"] == "backup" and "does not match the recorded sha256" in bad["detail"]
    before = _snapshot(root)
    revert = run_patcher(root, "revert", state_dir=state, out=tmp_path / "r")
    _refused(revert, tmp_path / "r", "StateError")
    assert _snapshot(root) == before
