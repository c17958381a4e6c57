"""The patcher against the real SGLang files of every version in SGLANG_VERSIONS (PyPI wheels).

Each version is extracted once and patched by the CLI in a subprocess (module fixture); the
patched code is then executed on stand-ins and compared with the unpatched code run the same way.
"""
from __future__ import annotations

import ast
import json
import py_compile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from remote.sglang_patch import shapes, simulate, template
from remote.sglang_patch.edits import Source
from tests.support.sglang_wheels import SGLANG_VERSIONS, extract, originals, run_patcher, tree_bytes

DS, LLAMA, QWEN2, QWEN3 = ("srt/models/deepseek_v2.py", "srt/models/llama.py",
                           "srt/models/qwen2.py", "srt/models/qwen3.py")
CGR, MR = "srt/model_executor/cuda_graph_runner.py", "srt/model_executor/model_runner.py"
N, P, U = "native", "needs-patch", "unsupported"

#: state of each file before apply, per version (the findings the patcher is built on)
EXPECTED: dict[str, dict[str, str]] = {
    "0.4.10.post2": {DS: U, LLAMA: P, QWEN2: U, QWEN3: N, CGR: P, MR: N},
    "0.5.2": {DS: U, LLAMA: P, QWEN2: N, QWEN3: N, CGR: P, MR: N},
    "0.5.5": {DS: P, LLAMA: P, QWEN2: N, QWEN3: N, CGR: P, MR: N},
    "0.5.10": {DS: P, LLAMA: P, QWEN2: N, QWEN3: N, CGR: P, MR: P},
    "0.5.13": {DS: P, LLAMA: P, QWEN2: N, QWEN3: N, CGR: N, MR: N},
    "0.5.20": {DS: P, LLAMA: P, QWEN2: N, QWEN3: N, CGR: N, MR: N},
    "0.5.23": {DS: P, LLAMA: N, QWEN2: N, QWEN3: N, CGR: N, MR: N},
}
#: DeepSeek (and so Kimi) parts: (setter, capture site)
DEEPSEEK_PARTS = {
    "0.5.5": (N, P), "0.5.10": (N, P), "0.5.13": (P, P), "0.5.20": (P, N), "0.5.23": (P, N),
}
MODEL_FILES = (DS, LLAMA, QWEN2, QWEN3)


def expected_states(version: str, found: dict[str, str] | None = None) -> dict[str, str]:
    """EXPECTED[version], or a failure telling what to add for a newly listed version."""
    if version not in EXPECTED:
        pytest.fail(f"SGLang {version} is in SGLANG_VERSIONS but not in EXPECTED: add its file "
                    f"states (status found {found})")
    return EXPECTED[version]


def _json(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "patch.json").read_text())


def _rows(payload: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["file"]: row for row in payload["files"]}


@pytest.fixture(scope="module", params=SGLANG_VERSIONS)
def patched(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """One version, surveyed and then patched once by the CLI."""
    version = request.param
    base = tmp_path_factory.mktemp(f"sglang-{version}")
    root = extract(version, base / "site")
    state = base / "state"
    status = run_patcher(root, "status", state_dir=state, out=base / "status")
    assert status.returncode == 0, status.stderr
    applied = run_patcher(root, "apply", state_dir=state, out=base / "apply")
    assert applied.returncode == 0, applied.stderr
    return SimpleNamespace(version=version, root=root, state=state, stdout=applied.stdout,
                           status=_json(base / "status"), apply=_json(base / "apply"),
                           before=originals(version), after=tree_bytes(root))


def test_status_reports_the_known_state_of_every_file(patched):
    payload = patched.status
    assert payload["schema"] == "draftops.sglang-patch/1"
    assert payload["sglang_version"] == patched.version
    assert payload["version_source"] == "metadata"
    assert Path(payload["sglang_dir"]) == (patched.root / "sglang").resolve()
    rows = _rows(payload)
    found = {f: r["state"] for f, r in rows.items()}
    assert found == expected_states(patched.version, found)
    assert all(r["known_shape"] for r in rows.values())
    if patched.version in DEEPSEEK_PARTS:
        parts = rows[DS]["parts"]
        assert (parts["setter"], parts["capture"]) == DEEPSEEK_PARTS[patched.version]


def test_apply_patches_exactly_the_files_that_need_it(patched, tmp_path):
    expected = expected_states(patched.version)
    needs = [f for f, state in expected.items() if state == P]
    assert sorted(patched.apply["changed"]) == sorted(needs)
    assert '"event": "result"' in patched.stdout and '"event": "progress"' in patched.stdout
    for rel, data in patched.before.items():
        if rel in needs:
            assert patched.after[rel] != data
            assert template.MARKER.encode() in patched.after[rel]
            py_compile.compile(str(patched.root / "sglang" / rel),
                               cfile=str(tmp_path / "x.pyc"), doraise=True)
        else:
            assert patched.after[rel] == data, f"{rel} must stay byte-identical"
    after = {f: r["state"] for f, r in _rows(patched.apply).items()}
    assert after == {f: ("patched" if s == P else s) for f, s in expected.items()}


def _setter_files(patched) -> list[str]:
    return [f for f in MODEL_FILES
            if f in patched.after and simulate.setter_classes(patched.after[f])]


def test_patched_setter_maps_minus_one_to_the_embedding(patched):
    files = _setter_files(patched)
    assert files, "every supported version has at least one model setter"
    for rel in files:
        new, old = patched.after[rel], patched.before[rel]
        for cls in simulate.setter_classes(new):
            assert simulate.run_setter(new, cls, [-1, 2, 30]) == [0, 3, 31], (rel, cls)
            # the upstream convention keeps its upstream meaning
            assert simulate.run_setter(new, cls, [1, 29, 57]) == \
                simulate.run_setter(old, cls, [1, 29, 57]) == [2, 30, 58]
            assert simulate.run_setter(new, cls, [2, 30, 58]) == \
                simulate.run_setter(old, cls, [2, 30, 58])
            assert simulate.run_setter(new, cls, None, num_layers=61) == \
                simulate.run_setter(old, cls, None, num_layers=61) == [2, 30, 58]
            if rel in patched.apply["changed"]:
                assert simulate.run_setter(new, cls, [30, -1, 2, 2]) == [0, 3, 31]
                assert simulate.run_setter(new, cls, None, env_ids="-1,2,30") == [0, 3, 31]


@pytest.mark.parametrize("version", [v for v, parts in DEEPSEEK_PARTS.items() if parts[0] == P])
def test_deepseek_heuristic_loses_the_embedding_without_the_patch(version):
    old = originals(version)[DS]
    assert simulate.run_setter(old, "DeepseekV2ForCausalLM", [-1, 2, 30]) == [-1, 2, 30]


def test_capture_site_stores_the_embedding_at_loop_index_zero(patched):
    for rel in MODEL_FILES:
        if rel not in patched.after or _rows(patched.apply)[rel]["state"] == U:
            continue
        new, old = patched.after[rel], patched.before[rel]
        for a2a in (False, True):
            blocks = simulate.run_capture_blocks(new, index=0, hidden=1.5, residual=None, a2a=a2a)
            assert all(block == [1.5] for block in blocks), (rel, blocks)
            later = simulate.run_capture_blocks(new, index=3, hidden=1.5, residual=2.0, a2a=a2a)
            assert all(block == [3.5] for block in later), (rel, later)
        capture_state = _rows(patched.status)[rel]["parts"].get("capture")
        if capture_state == P:
            with pytest.raises(TypeError):
                simulate.run_capture_blocks(old, index=0, hidden=1.5, residual=None)
            assert _bare_capture_sums(new) == 0 < _bare_capture_sums(old)


def _bare_capture_sums(data: bytes) -> int:
    """Number of unguarded ``hidden_states + residual`` inside capture blocks (ast check)."""
    count = 0
    for kind, node in shapes.capture_sites(ast.parse(data)):
        if kind == "if":
            for sub in ast.walk(node):
                if isinstance(sub, ast.Call):
                    for arg in sub.args:
                        count += _is_sum(arg)
    return count


def _is_sum(node: ast.AST) -> int:
    return int(isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)
               and isinstance(node.right, ast.Name) and node.right.id == "residual")


def test_runner_calls_pass_the_configured_ids(patched, tmp_path):
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps(
        {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 30]}}))
    for rel in (CGR, MR):
        if rel not in patched.apply["changed"]:
            continue
        data = patched.after[rel]
        calls = [n for n in ast.walk(ast.parse(data)) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr == template.SETTER]
        assert calls and all(len(c.args) == 1 for c in calls), rel
        helper = _load_helpers(data)[template.RUNNER_HELPER]
        server_args = SimpleNamespace(speculative_draft_model_path=str(draft))
        assert helper(SimpleNamespace(server_args=server_args)) == [-1, 2, 30]
        assert helper(SimpleNamespace(server_args=server_args,
                                      eagle_aux_hidden_state_layer_ids=[1, 29, 57])) == [1, 29, 57]
        assert helper(SimpleNamespace(server_args=SimpleNamespace(
            speculative_draft_model_path=str(tmp_path / "missing")))) is None


def _load_helpers(data: bytes) -> dict[str, Any]:
    tree = ast.parse(data)
    helpers = [n for n in tree.body
               if isinstance(n, ast.FunctionDef) and n.name in template.HELPERS]
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module(body=helpers, type_ignores=[]), "<helpers>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("version", SGLANG_VERSIONS)
def test_apply_is_idempotent_and_revert_is_byte_identical(version, tmp_path):
    root = extract(version, tmp_path / "site")
    state = tmp_path / "state"
    first = run_patcher(root, "apply", state_dir=state, out=tmp_path / "a1")
    assert first.returncode == 0, first.stderr
    patched_bytes = tree_bytes(root)
    second = run_patcher(root, "apply", state_dir=state, out=tmp_path / "a2")
    assert second.returncode == 0, second.stderr
    assert _json(tmp_path / "a2")["changed"] == []
    assert tree_bytes(root) == patched_bytes
    verify = run_patcher(root, "verify", state_dir=state, out=tmp_path / "v")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    checks = _json(tmp_path / "v")["checks"]
    assert checks and all(c["ok"] for c in checks)
    revert = run_patcher(root, "revert", state_dir=state, out=tmp_path / "r")
    assert revert.returncode == 0, revert.stderr
    assert sorted(_json(tmp_path / "r")["changed"]) == sorted(_json(tmp_path / "a1")["changed"])
    assert tree_bytes(root) == originals(version)
    assert run_patcher(root, "status", state_dir=state, out=tmp_path / "s").returncode == 0
    after_revert = {r["file"]: r["state"] for r in _json(tmp_path / "s")["files"]}
    assert after_revert == expected_states(version)
    again = run_patcher(root, "revert", state_dir=state, out=tmp_path / "r2")
    assert again.returncode == 0 and _json(tmp_path / "r2")["changed"] == []


def test_verify_fails_on_an_unpatched_install(tmp_path):
    root = extract("0.5.13", tmp_path / "site")
    proc = run_patcher(root, "verify", state_dir=tmp_path / "state", out=tmp_path / "v")
    assert proc.returncode == 1
    payload = _json(tmp_path / "v")
    assert payload["ok"] is False and "needs-patch" in payload["error"]
    failed = {c["file"] for c in payload["checks"] if not c["ok"]}
    assert failed == {DS, LLAMA}


def test_shape_analysis_is_line_number_free(patched):
    """Shifting a file by a few lines must not change what is recognised or how it is patched."""
    for rel, data in patched.before.items():
        if rel not in MODEL_FILES:
            continue
        shifted = b"# shifted\n" * 7 + data
        a, b = shapes.analyze_model(Source(data)), shapes.analyze_model(Source(shifted))
        assert [(p.name, p.state) for p in a.parts] == [(p.name, p.state) for p in b.parts]
        if a.state == P:
            assert Source(shifted).apply(b.planned_edits()) == b"# shifted\n" * 7 + \
                Source(data).apply(a.planned_edits())
