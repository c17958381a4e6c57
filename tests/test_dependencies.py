"""Every third-party package the code uses is declared (item 1).

numpy went undeclared because nothing imports it by name: safetensors' torch save path does, at call
time. So two checks: (1) every ``import`` in the tree names a declared distribution; (2) a fresh
interpreter imports all of draftops and remote and runs the save/load paths, and every module it
ended up loading must come from the declared requirements or their own dependencies.

Declarations: pyproject.toml (the local package), remote/requirements.txt (the host's ml-env),
requirements-test.txt and requirements-parity.txt (tests only).
"""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")   # Python >= 3.11

REPO = Path(__file__).resolve().parent.parent
FIRST_PARTY = {"draftops", "remote", "tests"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_file(path: Path) -> list[Requirement]:
    reqs = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            reqs.append(Requirement(line))
    return reqs


def project_requirements() -> list[Requirement]:
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return [Requirement(r) for r in data["project"]["dependencies"]]


def closure(reqs: list[Requirement]) -> set[str]:
    """The declared distributions plus everything they require when installed (markers evaluated)."""
    seen: set[str] = set()
    todo = [r for r in reqs if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req = todo.pop()
        name = norm(req.name)
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(req.name) or []
        except metadata.PackageNotFoundError:
            continue   # declared but not installed: the import check below reports what is missing
        for text in requires:
            sub = Requirement(text)
            extras = sorted(req.extras) or [""]
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in extras):
                todo.append(sub)
    return seen


def distributions_of(modules: set[str]) -> dict[str, set[str]]:
    """{top-level module: distributions providing it} for third-party modules only."""
    by_module = metadata.packages_distributions()
    return {m: {norm(d) for d in by_module[m]} for m in modules
            if m in by_module and m not in FIRST_PARTY and m not in sys.stdlib_module_names}


def imported_modules(folder: Path) -> set[str]:
    """Top-level names of every import statement under ``folder`` (absolute imports only)."""
    names: set[str] = set()
    files = [folder] if folder.is_file() else sorted(folder.rglob("*.py"))
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def undeclared(modules: set[str], allowed: set[str]) -> dict[str, set[str]]:
    return {m: dists for m, dists in distributions_of(modules).items() if not dists & allowed}


def test_every_import_names_a_declared_distribution():
    runtime = {norm(r.name) for r in project_requirements()}
    remote = {norm(r.name) for r in requirements_file(REPO / "remote/requirements.txt")}
    tests = runtime | {norm(r.name) for f in ("requirements-test.txt", "requirements-parity.txt")
                       for r in requirements_file(REPO / f)}
    assert undeclared(imported_modules(REPO / "draftops") | imported_modules(REPO / "tasks.py"), runtime) == {}
    assert undeclared(imported_modules(REPO / "remote"), remote) == {}
    assert undeclared(imported_modules(REPO / "remote"), runtime) == {}   # the local package ships remote/
    assert undeclared(imported_modules(REPO / "benchmarks"), tests) == {}   # the speculators peer is optional
    assert undeclared(imported_modules(REPO / "tests"), tests) == {}


# What a job really loads, in an interpreter that behaves like a venv holding only the declared
# packages: importing any other installed third-party package raises ModuleNotFoundError (so optional
# imports fall back as they would there). Every module, plus the paths that import lazily
# (safetensors' save path imports numpy only when it writes).
PROBE = r"""
import importlib, json, pkgutil, re, sys, tempfile
from importlib import metadata
from pathlib import Path
packages, allowed = sys.argv[1].split(","), set(json.loads(sys.argv[2]))
owners = metadata.packages_distributions()
blocked = set()

class OnlyDeclared:
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        dists = {re.sub(r"[-_.]+", "-", d).lower() for d in owners.get(top, ())}
        if dists and top not in ("draftops", "remote") and not dists & allowed:
            blocked.add(top)
            raise ModuleNotFoundError(f"No module named {name!r} (not declared)", name=name)
        return None

sys.meta_path.insert(0, OnlyDeclared())
for pkg in packages:
    module = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(module.__path__, pkg + "."):
        # the capture check's connector runs inside the engine's own process (its venv has vllm)
        if not info.name.endswith("__main__") and info.name != "remote.capture.cpu_connector":
            importlib.import_module(info.name)
import torch
from remote.drafter import demo
from remote.drafter.data import DumpSet
with tempfile.TemporaryDirectory() as tmp:
    for fmt in ("safetensors", "pt"):
        folder = Path(tmp) / fmt
        demo.write_dumps(folder, torch.arange(8).reshape(2, 4), torch.randn(2, 4, 3, 8),
                         torch.ones(2, 4, dtype=torch.bool), {"layer_ids": [-1, 0, 1]}, fmt)
        DumpSet.open(folder).load(0)
print(json.dumps({"loaded": sorted({n.split(".")[0] for n in sys.modules}), "blocked": sorted(blocked)}))
"""


def run_probe(packages: str, allowed: set[str]) -> dict[str, list[str]]:
    proc = subprocess.run([sys.executable, "-c", PROBE, packages, json.dumps(sorted(allowed))], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"with only the declared packages importable:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_jobs_run_with_only_the_declared_packages():
    """The local package (pyproject) and the host's ml-env (remote/requirements.txt) each suffice."""
    local = run_probe("draftops,remote", closure(project_requirements()))
    assert "numpy" in local["loaded"]   # the probe reaches the lazy import it exists for
    host = run_probe("remote", closure(requirements_file(REPO / "remote/requirements.txt")))
    assert {"torch", "safetensors", "numpy"} <= set(host["loaded"])


def test_the_check_would_catch_an_undeclared_package():
    """The same check against declarations without numpy names numpy. (pyproject's own closure now
    holds numpy twice over, via matplotlib, so the declarations here are the ones the demo needs.)"""
    without_numpy = [r for r in project_requirements() if norm(r.name) in ("pyyaml", "torch", "safetensors")]
    assert "numpy" not in closure(without_numpy)
    assert "numpy" in undeclared({"numpy", "yaml", "torch"}, closure(without_numpy))
    assert undeclared({"yaml", "torch", "json"}, closure(without_numpy)) == {}
