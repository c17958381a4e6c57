"""The laptop's base install (``pip install .`` without the ``local`` extra; tests/support/laptop_venv.py builds it
once): no torch, every task loads, and the built-in ``local`` host, which runs remote/ with this very
interpreter, says in one line which extra its demo needs. The SSH task tests run from it too (the
``laptop`` fixture's ``base`` param: ``pytest -m laptop``)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, copy_remote_package
from tests.support import laptop_venv

pytestmark = [pytest.mark.laptop, pytest.mark.slow]

#: today's base install measured 259 MB (with pip and setuptools); the install with the `local` extra
#: (torch 2.13 CPU) 1.13 GB. The bound is loose: it catches torch coming back, not a new rich release.
MAX_MB = 400


def run(python: Path, *args: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    for name in ("DRAFTOPS_HOST", "DRAFTOPS_INVENTORY"):
        env.pop(name, None)
    return subprocess.run([str(python), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_the_base_install_has_no_ml_stack_and_stays_small(base_venv: Path) -> None:
    python = laptop_venv.python_of(base_venv)
    packages = {name.lower() for name in laptop_venv.installed(base_venv)}
    assert "draftops" in packages and {"fabric", "invoke", "matplotlib"} <= packages
    assert not {"torch", "safetensors"} & packages
    for module in ("torch", "safetensors"):
        assert run(python, "-c", f"import {module}").returncode != 0
    checked = run(python, "-m", "pip", "check", "--disable-pip-version-check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # the checkout, not pip's copy of it, is what the tests run (PYTHONPATH comes first)
    where = run(python, "-c", "import draftops, remote; print(draftops.__file__, remote.__file__)")
    assert where.stdout.split() == [str(REPO / "draftops/__init__.py"), str(REPO / "remote/__init__.py")]
    size = laptop_venv.size_mb(base_venv)
    assert size < MAX_MB, f"the base install takes {size:.0f} MB: {sorted(packages)}"


def test_every_task_loads_from_the_base_install(base_venv: Path) -> None:
    """`invoke --list` as a laptop user types it, and every draftops module imported: nothing reaches
    for torch or safetensors (numpy, if loaded, is matplotlib's)."""
    python = laptop_venv.python_of(base_venv)
    listed = run(python, "-m", "invoke", "--list")
    assert listed.returncode == 0, listed.stderr
    for name in ("sync", "test-drafter", "capture-check", "patch-sglang.apply", "draft-config", "serve.start",
                 "bench.run", "bench.compare", "nightly.run", "env.check"):
        assert f"  {name} " in listed.stdout, listed.stdout
    probe = ("import importlib, json, pkgutil, sys, draftops, tasks\n"
             "for info in pkgutil.walk_packages(draftops.__path__, 'draftops.'):\n"
             "    importlib.import_module(info.name)\n"
             "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))")
    done = run(python, "-c", probe)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout.splitlines()[-1]))
    assert {"draftops", "remote", "matplotlib", "invoke", "pydantic"} <= loaded
    assert not {"torch", "safetensors"} & loaded


def test_the_local_host_says_which_extra_its_demo_needs(base_venv: Path, make_project, no_inventory_env) -> None:
    """On a base install the built-in host has no torch to run the evaluator with: one paragraph naming
    the extra and its install line, before any job starts."""
    project = make_project()
    (project / "tasks.py").write_text((REPO / "tasks.py").read_text())
    copy_remote_package(project)
    python = laptop_venv.python_of(base_venv)
    for task in (["test-drafter"], ["serve", "--draft", "demo"], ["capture-check", "--draft", "demo"]):
        done = run(python, "-m", "invoke", *task, cwd=project)
        said = " ".join(done.stderr.split())
        assert done.returncode == 1, done.stdout + done.stderr
        assert said.startswith("error: Host 'local' runs `remote."), said
        assert "which has no torch and safetensors:" in said, said
        assert "-m pip install -e '.[local]'" in said and "--host NAME" in said and "Traceback" not in said
    assert not list((project / ".draftops" / "runs").glob("*-demo-*"))     # refused before starting a job
