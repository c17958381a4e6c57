"""A laptop's install for the tests: a venv holding what ``pip install .`` of the base gives (no
``local`` extra, so no torch, no safetensors), built once and kept under the test cache.

The SSH task tests marked ``laptop`` (``tests/conftest.py``'s ``laptop`` fixture, param ``base``) run
``invoke`` with this venv's python while the host's python stays the full ``.venv``: the laptop drives,
the host computes. The venv is keyed by the digest of what decides its contents (pyproject's base
requirements and build system, and the interpreter), so it is rebuilt only when those change; the
draftops copy pip installed into it is shadowed by ``PYTHONPATH`` (the checkout), which the invoke
helpers set, so the code under test is always this checkout's.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.cache_dir import cache_root

REPO = Path(__file__).resolve().parents[2]
#: set while a test runs `invoke` as the laptop's base install (the ``laptop`` fixture)
LAPTOP_PYTHON = "DRAFTOPS_TEST_LAPTOP_PYTHON"
COMPLETE = "draftops-base-venv.json"


def laptop_python() -> str:
    """The python a test runs `invoke` with: the base venv's under the ``laptop`` fixture, else ours."""
    return os.environ.get(LAPTOP_PYTHON) or sys.executable


def digest() -> str:
    """What decides the base venv's contents: the base requirements, the build system, the interpreter."""
    import tomllib  # Python >= 3.11, as the suite's other readers of pyproject.toml
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    key = {"dependencies": project["project"]["dependencies"],
           "requires-python": project["project"].get("requires-python"),
           "build-system": project["build-system"], "python": sys.version, "base": sys.base_prefix}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def base_venv() -> Path:
    """The base venv's folder, built on first use (one builder at a time across xdist workers)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    folder = root / f"laptop-venv-{digest()}"
    with open(root / "laptop-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / COMPLETE).is_file():
            _build(folder)
    return folder


def python_of(folder: Path) -> Path:
    return folder / "bin" / "python"


def _build(folder: Path) -> None:
    """``python -m venv`` then ``pip install <a copy of the package's sources>``: the base install from the
    registry, dependencies resolved by pip as a user's ``pip install .`` resolves them."""
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, timeout=300)
    with tempfile.TemporaryDirectory(prefix="draftops-src-") as tmp:
        src = Path(tmp)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(REPO / name, src / name)
        for package in ("draftops", "remote"):   # a copy: building in the checkout would leave build/ there
            shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
        done = subprocess.run([str(python_of(folder)), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                               str(src)], capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"pip install of the base into {folder} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    listed = subprocess.run([str(python_of(folder)), "-m", "pip", "list", "--format=json",
                             "--disable-pip-version-check"], capture_output=True, text=True, check=True, timeout=120)
    record = {"digest": digest(), "packages": {p["name"]: p["version"] for p in json.loads(listed.stdout)}}
    (folder / COMPLETE).write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


def installed(folder: Path) -> dict[str, str]:
    """{distribution: version} the base install holds (recorded when it was built)."""
    packages: dict[str, str] = json.loads((folder / COMPLETE).read_text())["packages"]
    return packages


def size_mb(folder: Path) -> float:
    """The venv's size on disk (what the laptop pays for draftops), in MB."""
    total = sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
    return total / 1e6
