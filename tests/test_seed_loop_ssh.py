"""The seed's whole loop over a real sshd, as a user types it: `invoke sync test-drafter` on the demo
finds the wiring mismatch, `invoke draft-config --from-report` applies the fix, and a second
`invoke test-drafter` on the fixed draft says MATCH."""
from __future__ import annotations

import json
import shutil
import sys

import pytest

from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.drafter_support import demo
from tests.support.tasks import invoke

pytestmark = [pytest.mark.ssh, pytest.mark.slow]


def test_demo_mismatch_then_fix_then_match(make_project, sshd, tmp_path, no_inventory_env):
    # the host runs the drafter with this test's interpreter (it has torch), never a machine python3
    project = make_project({"box": ssh_entry(sshd, tmp_path, python=sys.executable)}, "box")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(project)
    # The host keeps its demo in <root>/state/demo; seed it with this process's demo (same
    # parameters, so the cache is taken as complete) instead of generating it again.
    shutil.copytree(demo().root, tmp_path / "hostroot" / "state" / "demo")
    first = invoke(project, "sync", "test-drafter")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "MISMATCH" in first.stdout and "--from-report" in first.stdout
    run_dir = next((project / "runs").glob("*-test-drafter-*"))
    report = json.loads((run_dir / "report.json").read_text())
    verdict = report["verdict"]
    assert verdict["status"] == "MISMATCH" and verdict["fix_layer_ids"][0] == -1
    assert verdict["needs_capture_patch"] is True
    layouts = {tuple(r["layer_ids"]): r["acc"] for r in report["layouts"]}
    trained = layouts[tuple(verdict["fix_layer_ids"])]
    # The verdict is the host engine's (SGLang here): SGLang reads no ids from a speculators config and
    # captures its own default, which this dump lacks, so no scanned layout is "served". The config's ids
    # as the file's engine reads them are the row tagged configured-<serving convention>.
    assert verdict["advice_engine"] == "sglang" and verdict["served_slots"] is None
    configured = next(r["acc"] for r in report["layouts"]
                      if f"configured-{verdict['serving_convention']}" in r["tags"])
    assert trained >= 0.8 and configured <= trained / 2

    host_demo = tmp_path / "hostroot" / "state" / "demo"
    for fmt, folder in (("flat", "draft_flat"), ("speculators", "draft")):
        fixed = tmp_path / f"{fmt}_to_fix"
        shutil.copytree(host_demo / folder, fixed)
        rewrite = invoke(project, "draft-config", "--ckpt", str(fixed), "--from-report", run_dir.name)
        assert rewrite.returncode == 0, rewrite.stdout + rewrite.stderr
        config = json.loads((fixed / "config.json").read_text())
        if fmt == "flat":   # SGLang reads eagle_config, in its output-of-layer ids
            assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == verdict["fix_layer_ids"]
        else:               # speculators' own field holds vLLM ids (0 = embedding)
            assert config["eagle_aux_hidden_state_layer_ids"] == verdict["fix_layer_ids_vllm"]
        again = invoke(project, "test-drafter", "--ckpt", str(fixed), "--data", str(host_demo / "data"),
                       "--verifier", str(host_demo / "target"))
        assert again.returncode == 0, again.stdout + again.stderr
        if fmt == "speculators":    # SGLang (this host's engine) never reads a speculators config's ids:
            # the rewrite is right for vLLM, but here it stays a MISMATCH whose fix is the flat copy
            assert "MISMATCH" in again.stdout and "draft-flat" in again.stdout, (fmt, again.stdout)
            continue
        assert "MATCH" in again.stdout and "MISMATCH" not in again.stdout, (fmt, again.stdout)
        # draft-config refuses a MATCH report (nothing to rewrite): the fix hint is not shown for one
        assert "fix it with" not in again.stdout and "--from-report" not in again.stdout, again.stdout
