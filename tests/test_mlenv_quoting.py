"""R3: the ml-env commands quote every user value. Each hostile value is fed through the real `sh`
(the local host runs commands exactly as an SSH host's login shell does: ``sh -c COMMAND``)."""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from draftops.cli.env import show_env
from draftops.documents import parse
from draftops.documents.env_check import EnvCheck
from draftops.env import mlenv
from draftops.link.host import open_host

HOSTILE = {
    "single quote": "ml'env",
    "command substitution": "ml$(touch {marker})env",
    "backticks": "ml`touch {marker}`env",
    "spaces": "ml  env ",
    "newline": "ml\nenv",
    "double quote and semicolon": 'ml";touch {marker};"env',
    "glob and tilde inside": "ml*?[a]~env",
    "dash first": "-rf",
}


def hostile(tmp_path: Path, key: str) -> tuple[str, Path]:
    marker = tmp_path / "pwned"
    return str(tmp_path / "venvs" / HOSTILE[key].format(marker=marker)), marker


@pytest.mark.parametrize("key", list(HOSTILE))
def test_words_survive_a_real_shell_unchanged(tmp_path, key):
    value, marker = hostile(tmp_path, key)
    argv = ["printf", "%s\\0", value, "creating venv " + value, HOSTILE[key]]
    out = subprocess.run(["sh", "-c", mlenv._words(*argv)], capture_output=True, check=True, cwd=tmp_path).stdout
    assert out.split(b"\0")[:-1] == [a.encode() for a in argv[2:]]
    assert not marker.exists()


def test_home_relative_words_keep_home_expandable(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home dir"))
    out = subprocess.run(["sh", "-c", mlenv._words("printf", "%s", "~/a b'c")], capture_output=True,
                         check=True).stdout
    assert out == f"{tmp_path}/home dir/a b'c".encode()


def _local_project(tmp_path: Path, venv: str, base_python: str) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (tmp_path / "reqs.txt").write_text("# comments only: nothing to install\n")
    hosts = {"default": "here", "hosts": {"here": {
        "transport": "local", "root": str(tmp_path / "root"),
        "env": {"venv": venv, "base_python": base_python, "requirements": str(tmp_path / "reqs.txt")}}}}
    (project / "hosts.yaml").write_text(yaml.safe_dump(hosts))
    return project


@pytest.mark.parametrize("key", list(HOSTILE))
def test_plan_and_setup_script_run_verbatim_on_hostile_venv_paths(tmp_path, no_inventory_env, key):
    """The probe and the setup script run through sh with the venv already present (the venv-creating
    branch itself runs over SSH in test_env_ssh, once, with every hostile character at once)."""
    venv, marker = hostile(tmp_path, key)
    base = tmp_path / "base python's `dir`" / "py;thon"
    base.parent.mkdir()
    base.symlink_to(sys.executable)
    project = _local_project(tmp_path, venv, str(base))
    host = open_host(None, project)
    (Path(venv) / "bin").mkdir(parents=True)
    (Path(venv) / "bin" / "python").symlink_to(sys.executable)

    plan = mlenv.plan(host)
    assert not plan.up_to_date
    result = host.transport.run(mlenv.setup_command(host, plan))
    assert result.text.strip().endswith("env ready"), result.text
    assert (Path(venv) / mlenv.requirements_file(plan.digest)).read_bytes() == plan.requirements
    assert (Path(venv) / mlenv.HASH_FILE).read_text() == plan.digest
    assert mlenv.plan(host).up_to_date
    assert not marker.exists() and not (tmp_path / "root" / "pwned").exists()


# --- item 5: env.check shows each thing once --------------------------------------------------------

def test_env_table_lists_torch_once_and_every_package():
    report = {"python": "3.11.7", "executable": "/x/python",
              "torch": {"available": True, "version": "2.13.0", "cuda_build": "12.8", "cuda_available": True,
                        "devices": [{"index": 0, "name": "NVIDIA [b]B200[/b]", "memory_gib": 179.1,
                                     "capability": "10.0"}]},
              "nvidia_smi": [{"index": "0", "name": "B200"}, {"index": "1", "name": "B200"}],
              "packages": {"torch": "2.13.0", "safetensors": "0.5", "numpy": None, "sglang": "0.5.5"}}
    rows = _rendered_rows(report)
    assert [label for label, _ in rows if label] == ["python", "torch", "cuda:0", "nvidia-smi", "safetensors",
                                                    "numpy", "sglang"]
    shown = dict(row for row in rows if row[0])
    assert shown["torch"].startswith("2.13.0 (CUDA build 12.8")
    assert shown["cuda:0"] == "NVIDIA [b]B200[/b], 179.1 GiB, sm 10.0"       # host text is shown, not markup
    assert rows[rows.index(("nvidia-smi", shown["nvidia-smi"])) + 1] == ("", "index=1, name=B200")
    assert shown["numpy"] == "not installed"


def test_env_table_without_torch_still_lists_it_once():
    rows = _rendered_rows({"python": "3.12", "executable": "/p", "torch": {"available": False, "error": "No [x]"},
                           "nvidia_smi": None, "packages": {"torch": None, "sglang": None}})
    assert [label for label, _ in rows] == ["python", "torch", "nvidia-smi", "sglang"]
    assert dict(rows)["torch"] == "not importable: No [x]"


def _rendered_rows(report: dict) -> list[tuple[str, str]]:
    """env.check's table as shown: (label, value) per line, read back from the text."""
    out = io.StringIO()
    env = parse(EnvCheck, {"schema": EnvCheck.SCHEMA, **report}, "env.json")
    show_env(env, "ml-env on box", Console(file=out, width=200, color_system=None))
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.getvalue().splitlines()
            if line.startswith("│")]
    return [(label, value) for label, value in rows]


def test_two_setups_at_once_each_install_their_own_requirements(tmp_path, no_inventory_env):
    """Setup A uploaded its requirements, then B (after an edit) uploaded its own before A's pip read
    them: A installed B's list and recorded A's hash, reporting ready for what it never installed.
    Each setup's script now carries its own list."""
    venv = str(tmp_path / "venv")
    project = _local_project(tmp_path, venv, sys.executable)
    host = open_host(None, project)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    (tmp_path / "reqs.txt").write_text("--no-index\nnot-a-real-package-draftops-a\n")
    plan_a = mlenv.plan(host)
    script_a = mlenv.prepare_setup(host, plan_a)
    (tmp_path / "reqs.txt").write_text("--no-index\n")
    plan_b = mlenv.plan(host)
    mlenv.prepare_setup(host, plan_b)                       # B is prepared before A's job runs
    a = host.transport.run(script_a, check=False)
    assert a.exit_code != 0 and b"not-a-real-package-draftops-a" in a.stdout + a.stderr, a.text
    assert not (Path(venv) / mlenv.HASH_FILE).exists()
    b = host.transport.run(mlenv.setup_command(host, plan_b))
    assert b.text.strip().endswith("env ready") and mlenv.plan(host).up_to_date


@pytest.mark.parametrize("script", ["#!/bin/sh\nsleep 30\n", "not a program\n"])
def test_env_check_reports_an_nvidia_smi_that_hangs_or_cannot_run(tmp_path, monkeypatch, script):
    """A GPU in a bad state makes nvidia-smi hang: env.check failed as an internal error and lost the
    whole report (python, torch) with it."""
    from remote import envcheck
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(script)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setattr(envcheck, "NVIDIA_SMI_TIMEOUT_S", 0.5)
    rows = envcheck._nvidia_smi()
    assert rows is not None and len(rows) == 1 and "nvidia-smi" in rows[0]["error"]


def test_a_requirements_path_that_is_a_folder_or_missing_is_named_as_such(tmp_path, no_inventory_env):
    from draftops.errors import InventoryError
    project = _local_project(tmp_path, str(tmp_path / "venv"), sys.executable)
    (tmp_path / "reqs.txt").unlink()
    with pytest.raises(InventoryError, match=r"reqs.txt does not exist; fix the path"):
        mlenv.plan(open_host(None, project))
    (tmp_path / "reqs.txt").mkdir()
    with pytest.raises(InventoryError, match=r"reqs.txt is a folder, not a requirements file; fix the path"):
        mlenv.plan(open_host(None, project))
    (tmp_path / "reqs.txt").rmdir()
    (tmp_path / "reqs.txt").write_bytes(b"torch\n\xff\xfe\n")
    with pytest.raises(InventoryError, match=r"reqs.txt is not a requirements list .*not UTF-8 text"):
        mlenv.plan(open_host(None, project))
