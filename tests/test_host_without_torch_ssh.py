"""A host whose python has no torch (issue 35, item 18), over a real sshd with the system's own
python3 as the host's interpreter: test-drafter says in one paragraph which host, which python and
the command that sets the ml-env up (no traceback); env.check shows its table and then fails, since
that ml-env cannot run the evaluator; a host with no `env:` entry is told to add one first, not to
run an env.setup that would refuse it."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh
BARE = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"


def _bare_has_no_torch() -> bool:
    return subprocess.run([BARE, "-c", "import torch"], capture_output=True, timeout=60).returncode != 0


@pytest.fixture(params=["no-env-entry", "env-entry"])
def bare_project(request, make_project, sshd, tmp_path, no_inventory_env):
    if not _bare_has_no_torch():
        pytest.skip(f"{BARE} imports torch")
    extra = {"env": {"venv": str(tmp_path / "ml-env"), "base_python": BARE}} if request.param == "env-entry" else {}
    project = make_project({"box": ssh_entry(sshd, tmp_path, python=BARE, **extra)}, default="box")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(project)
    return project, request.param


def _said(done: subprocess.CompletedProcess) -> str:
    return " ".join((done.stdout + done.stderr).split())


def test_test_drafter_names_the_host_its_python_and_the_setup(bare_project, tmp_path):
    project, kind = bare_project
    done = invoke(project, "sync", "test-drafter", "--ckpt", str(tmp_path / "d"), "--data", str(tmp_path / "x"))
    said = _said(done)
    assert done.returncode == 1, said
    assert "Traceback" not in said and "No module named" not in said, said
    assert f"Host 'box' runs its tools with {BARE}, which cannot import torch or safetensors" in said, said
    assert " -m invoke env.setup`" in said           # box is the default host: no --host (issue 35, item 16)
    if kind == "no-env-entry":
        assert "has no `env:` entry in hosts.yaml" in said and "remote/requirements-cpu.txt" in said
    else:
        assert f"into {tmp_path / 'ml-env'}" in said


def test_env_check_fails_when_the_ml_env_cannot_run_the_evaluator(bare_project):
    project, _ = bare_project
    done = invoke(project, "env.check")
    said = _said(done)
    assert done.returncode == 1, said
    assert "not importable" in said                       # the table is still shown, then the verdict on it
    assert f"Host 'box' runs its tools with {BARE}, which cannot import torch" in said
    assert " -m invoke env.setup`" in said           # box is the default host: no --host (issue 35, item 16)
