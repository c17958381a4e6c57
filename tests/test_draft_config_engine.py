"""`invoke draft-config` advises for the engine the host serves with (issue 22, item 4): on a vLLM host
(the built-in `local`) it skips the SGLang survey and its SGLang-only warnings, which an SGLang host
still gets. Real runs of the task on the generated demo, over the real sshd for the SGLang host."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.drafter_support import demo
from tests.support.tasks import invoke

SGLANG_ONLY = ("sglang", "capture patch", "SGLang's target never reads")


def _run(make_project, sshd, tmp_path: Path, where: str) -> tuple[str, dict]:
    """`draft-config --ckpt demo --layer-ids=-1,1,3` (ids with the embedding) on ``where``: its output and
    the draft_config.json it left in its pulled run folder."""
    box = ssh_entry(sshd, tmp_path, python=sys.executable, engine="sglang")
    root = make_project({"box": box}, default=where)
    (root / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(root)
    host_root = tmp_path / "hostroot" if where == "box" else root / ".draftops"
    shutil.copytree(demo().root, host_root / "state" / "demo")
    out = invoke(root, "draft-config", "--ckpt", "demo", "--layer-ids=-1,1,3")
    assert out.returncode == 0, out.stdout + out.stderr
    [result] = (root / "runs").glob("*-draft-config-*/draft_config.json")
    return " ".join((out.stdout + out.stderr).split()), json.loads(result.read_text())


@pytest.mark.ssh
def test_draft_config_on_a_vllm_host_says_nothing_about_sglang(make_project, sshd, tmp_path, no_inventory_env):
    text, result = _run(make_project, sshd, tmp_path, "local")
    assert "wrote [0, 2, 4]" in text, text
    assert not [w for w in result["warnings"] if any(s.lower() in w.lower() for s in SGLANG_ONLY)], result
    assert "sglang" not in text.lower(), text


@pytest.mark.ssh
def test_draft_config_on_an_sglang_host_still_surveys_its_sglang(make_project, sshd, tmp_path, no_inventory_env):
    text, result = _run(make_project, sshd, tmp_path, "box")
    assert "wrote [0, 2, 4]" in text, text
    warnings = result["warnings"]      # this python has no sglang: the survey says so, and the format note
    assert any("could not read the host's SGLang capture status" in w for w in warnings), result
    assert any("SGLang's target never reads" in w for w in warnings), result
    assert "sglang" in text.lower(), text
