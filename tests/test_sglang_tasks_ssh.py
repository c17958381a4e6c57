"""`invoke patch-sglang` and `invoke draft-config` end to end: real sshd, a host ml-env venv holding
the real SGLang 0.5.13 sources (from the PyPI wheel), jobs, pulled JSON, rendered tables."""
from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import BOTH_INSTALLS, REPO, copy_remote_package, ssh_entry
from tests.support.draft_configs import FLAT_CONFIG, make_ckpt, make_target
from tests.support.sglang_wheels import extract, originals, tree_bytes
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh
VERSION = "0.5.13"


@pytest.fixture
def sglang_project(make_project, sshd, tmp_path, no_inventory_env):
    venv = tmp_path / "ml-env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    site = Path(purelib)
    extract(VERSION, site)
    project = make_project({"box": ssh_entry(sshd, tmp_path, python=str(venv / "bin" / "python"))}, "box")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(project)
    return project, site


@pytest.mark.parametrize("laptop", BOTH_INSTALLS, indirect=True)   # the base install drives it too
def test_patch_sglang_status_apply_verify_revert(sglang_project, laptop):
    project, site = sglang_project
    status = invoke(project, "patch-sglang")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "SGLang 0.5.13" in status.stdout and "needs-patch" in status.stdout
    applied = invoke(project, "patch-sglang.apply")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "(changed)" in applied.stdout
    patched = (site / "sglang/srt/models/deepseek_v2.py").read_text()
    assert "draftops sglang-patch" in patched
    verify = invoke(project, "patch-sglang.verify")
    assert verify.returncode == 0 and "FAIL" not in verify.stdout, verify.stdout + verify.stderr
    reverted = invoke(project, "patch-sglang.revert")
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    assert tree_bytes(site) == originals(VERSION)


def test_patch_sglang_refuses_when_no_sglang_is_installed(make_project, sshd, tmp_path, no_inventory_env):
    project = make_project({"box": ssh_entry(sshd, tmp_path, python=sys.executable)}, "box")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(project)
    result = invoke(project, "patch-sglang.apply")
    assert result.returncode == 1 and "No `sglang` package is importable" in result.stderr


@pytest.mark.parametrize("laptop", BOTH_INSTALLS, indirect=True)   # the base install drives it too
def test_draft_config_rewrites_with_backup_and_warns_about_the_patch(sglang_project, tmp_path, laptop):
    project, _ = sglang_project
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    target = make_target(tmp_path / "target")
    result = invoke(project, "draft-config", "--ckpt", str(ckpt), "--layer-ids=-1,2,30", "--target", str(target))
    assert result.returncode == 0, result.stdout + result.stderr
    config = json.loads((ckpt / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 30]
    assert list(ckpt.glob("config.json.draftops-bak-*")) and "backup:" in result.stdout
    assert "warning" in result.stdout and "patch" in result.stdout.lower()
    bad = invoke(project, "draft-config", "--ckpt", str(ckpt), "--layer-ids=-1,2,99", "--target", str(target))
    assert bad.returncode == 1 and "99" in bad.stderr
    assert json.loads((ckpt / "config.json").read_text()) == config


def test_draft_config_from_a_report_without_fix_is_refused(sglang_project, tmp_path):
    project, _ = sglang_project
    ckpt = make_ckpt(tmp_path / "draft", FLAT_CONFIG)
    run = project / "runs" / "20261130-000000-test-drafter-abcd"
    run.mkdir(parents=True)
    (run / "report.json").write_text(json.dumps({"verdict": {"status": "MATCH", "fix_layer_ids": None,
                                                             "needs_capture_patch": False}}))
    result = invoke(project, "draft-config", "--ckpt", str(ckpt), "--from-report", run.name)
    assert result.returncode == 1 and "MATCH" in result.stderr
    assert json.loads((ckpt / "config.json").read_text()) == FLAT_CONFIG
