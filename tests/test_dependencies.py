"""Every third-party package the code uses is declared (item 1).

numpy went undeclared because nothing imports it by name: safetensors' torch save path does, at call
time. So two checks: (1) every ``import`` in the tree names a declared distribution; (2) a fresh
interpreter imports all of draftops and remote and runs the save/load paths, and every module it
ended up loading must come from the declared requirements or their own dependencies.

Declarations: pyproject.toml (the local package: its base install, what a laptop that drives SSH
hosts needs, and the ``local`` extra, the ML stack the built-in ``local`` host runs remote/ with),
remote/requirements.txt (the host's ml-env), requirements-test.txt and requirements-parity.txt (tests only).

And (3) the split itself: the laptop side (tasks.py, every draftops module and the remote/ modules they
import) never imports torch, safetensors or numpy, so the base install drives every SSH host; the tools
that need them are the ones ``draftops.runs.mlstack`` names, which the ``local`` host refuses in one line
without the extra. tests/test_laptop_install.py runs the base install itself.
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

from draftops.runs import mlstack
from tests.support.import_graph import import_closure, modules

tomllib = pytest.importorskip("tomllib")   # Python >= 3.11

REPO = Path(__file__).resolve().parent.parent
FIRST_PARTY = {"draftops", "remote", "tests"}
ML_STACK = set(mlstack.ML_STACK)
TRACKING = REPO / "draftops" / "tracking.py"     # the one module that imports mlflow (the `mlflow` extra)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements_file(path: Path) -> list[Requirement]:
    reqs = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            reqs.append(Requirement(line))
    return reqs


def project_requirements(*extras: str) -> list[Requirement]:
    """pyproject's base requirements, plus those of ``extras``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    optional = project.get("optional-dependencies", {})
    return [Requirement(r) for r in [*project["dependencies"], *(r for e in extras for r in optional[e])]]


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
    base = {norm(r.name) for r in project_requirements()}
    runtime = {norm(r.name) for r in project_requirements("local")}
    remote = {norm(r.name) for r in requirements_file(REPO / "remote/requirements.txt")}
    tests = runtime | {norm(r.name) for f in ("requirements-test.txt", "requirements-parity.txt")
                       for r in requirements_file(REPO / f)}
    laptop = {name for path in (REPO / "draftops").rglob("*.py") if path != TRACKING for name in imported_modules(path)}
    assert undeclared(laptop | imported_modules(REPO / "tasks.py"), base) == {}
    # the one module that talks to MLflow: the base plus the `mlflow` extra
    assert undeclared(imported_modules(TRACKING), base | {norm(r.name) for r in project_requirements("mlflow")}) == {}
    assert undeclared(imported_modules(REPO / "remote"), remote) == {}
    # the local package ships remote/: with the `local` extra, the built-in local host runs it here
    assert undeclared(imported_modules(REPO / "remote"), runtime) == {}
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
if "remote" not in packages:        # the laptop: what `invoke` loads, and no job
    import tasks
    print(json.dumps({"loaded": sorted({n.split(".")[0] for n in sys.modules}), "blocked": sorted(blocked)}))
    sys.exit(0)
import torch
from remote.drafter.demo import build as demo
from remote.drafter.data.dumps import DumpSet
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
    """The local package with its `local` extra (pyproject) and the host's ml-env
    (remote/requirements.txt) each suffice; the base install suffices for the laptop's side."""
    local = run_probe("draftops,remote", closure(project_requirements("local")))
    assert "numpy" in local["loaded"]   # the probe reaches the lazy import it exists for
    host = run_probe("remote", closure(requirements_file(REPO / "remote/requirements.txt")))
    assert {"torch", "safetensors", "numpy"} <= set(host["loaded"])
    laptop = run_probe("draftops", closure(project_requirements()))
    assert not {"torch", "safetensors"} & set(laptop["loaded"]) and "invoke" in laptop["loaded"]
    assert "matplotlib" in laptop["loaded"]     # its numpy is matplotlib's own: see the tests below


def test_the_base_install_leaves_the_ml_stack_to_the_extra():
    """`pip install .` brings no torch or safetensors; numpy only as matplotlib's own dependency (the
    compare chart); the `local` extra brings all three."""
    base = project_requirements()
    extra = {norm(r.name) for r in project_requirements("local")} - {norm(r.name) for r in base}
    assert not ML_STACK & {norm(r.name) for r in base} and ML_STACK <= extra
    assert not {"torch", "safetensors"} & closure(base)
    assert "numpy" not in closure([r for r in base if norm(r.name) != "matplotlib"])


def ml_imports(path: Path, *, guarded: bool) -> set[str]:
    """The ML-stack packages ``path`` imports anywhere (in a function too); ``guarded=False`` leaves out
    those inside a ``try`` that catches their absence (remote.envcheck reports a missing torch)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    shielded = set() if guarded else {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try) and _catches_absence(t)
                                      for s in t.body for n in ast.walk(s)}
    for node in ast.walk(tree):
        if id(node) in shielded:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names} & ML_STACK
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module.split(".")[0]} & ML_STACK
    return found


def _catches_absence(node: ast.Try) -> bool:
    """Whether one of the handlers catches a failed import (a bare except, or ImportError or a base of it)."""
    caught: set[str] = set()
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        caught |= {ast.unparse(t) for t in types}
    return bool(caught & {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})


def laptop_modules() -> dict[str, Path]:
    """What the laptop side can load: every draftops module and the project modules they import."""
    found: dict[str, Path] = {}
    for name in modules():
        if name.split(".")[0] == "draftops":
            found.update(import_closure(name))
    return found


def test_the_laptop_side_never_imports_the_ml_stack():
    """No module the laptop loads imports torch, safetensors or numpy, in a function either: they run on
    hosts, from the host's ml-env (the local host's: the `local` extra)."""
    laptop = laptop_modules()
    assert {"draftops.cli.drafter", "remote.events", "remote.bench.digest"} <= set(laptop)   # it sees them
    assert {name: found for name, path in sorted(laptop.items())
            if (found := ml_imports(path, guarded=True))} == {}
    assert "torch" in ml_imports(REPO / "remote/drafter/model/draft.py", guarded=True)    # and would see one


STARTERS = ("run_tool", "call_tool", "ask_tool", "python_module_command")


def module_constants(tree: ast.Module, known: dict[str, Path]) -> dict[str, str]:
    """{name: string} for a module's top-level ``NAME = "text"`` and ``NAME = module.CONSTANT`` (the
    latter read from that project module), so a tool named once in a constant is still found."""
    aliases = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            aliases.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            aliases.update({a.asname or a.name: a.name for a in node.names})
    found = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[node.targets[0].id] = value.value
        elif (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
              and aliases.get(value.value.id) in known):
            other = ast.parse(known[aliases[value.value.id]].read_text())
            if value.attr in (theirs := module_constants(other, {})):
                found[node.targets[0].id] = theirs[value.attr]
    return found


def started_tools() -> set[str]:
    """Every remote module draftops starts: the first argument after the host of a run_tool / call_tool
    / ask_tool / python_module_command call anywhere under draftops/, a string or a module constant
    holding one."""
    known = modules()
    found = set()
    for path in (REPO / "draftops").rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        constants = module_constants(tree, known)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and len(node.args) >= 2
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) in STARTERS):
                continue
            arg = node.args[1]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.add(arg.value)
            elif isinstance(arg, ast.Name) and arg.id in constants:
                found.add(constants[arg.id])
    return found


def test_the_tools_the_local_host_refuses_without_the_extra_are_those_that_need_it():
    """mlstack.ML_TOOLS is exactly the set of started tools whose imports reach the ML stack outside a
    guard: a tool added without it would die on `import torch` on a base install's local host."""
    known = modules()
    tools = started_tools()
    assert {"remote.drafter", "remote.serve", "remote.envcheck", "remote.drafter.demo_spec",
            "remote.drafter.launch"} <= tools
    needing = set()
    for tool in tools:
        entry = f"{tool}.__main__" if f"{tool}.__main__" in known else tool
        if any(ml_imports(path, guarded=False) for path in import_closure(entry).values()):
            needing.add(tool)
    assert needing == set(mlstack.ML_TOOLS)


def test_the_check_would_catch_an_undeclared_package():
    """The same check against declarations without numpy names numpy. (pyproject's own closure now
    holds numpy twice over, via matplotlib, so the declarations here are the ones the demo needs.)"""
    without_numpy = [r for r in project_requirements("local") if norm(r.name) in ("pyyaml", "torch", "safetensors")]
    assert "numpy" not in closure(without_numpy)
    assert "numpy" in undeclared({"numpy", "yaml", "torch"}, closure(without_numpy))
    assert undeclared({"yaml", "torch", "json"}, closure(without_numpy)) == {}


def test_mlflow_is_the_extras_and_one_modules_and_imported_only_when_asked():
    """The `mlflow` extra alone brings the client; only draftops/tracking.py imports it, inside
    functions (a laptop without the extra loads every module: the probe above)."""
    assert "mlflow-skinny" not in closure(project_requirements())
    assert "mlflow-skinny" in {norm(r.name) for r in project_requirements("mlflow")}
    importing = sorted(str(path.relative_to(REPO)) for path in [*(REPO / "draftops").rglob("*.py"), REPO / "tasks.py"]
                       if "mlflow" in imported_modules(path))
    assert importing == ["draftops/tracking.py"]
    top = ast.parse(TRACKING.read_text())
    assert not {alias.name.split(".")[0] for node in top.body if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in node.names} & {"mlflow"}
    assert all(node.module is None or not node.module.startswith("mlflow") for node in top.body
               if isinstance(node, ast.ImportFrom))
