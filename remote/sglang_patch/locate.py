"""Find the SGLang the host's python would import, and its version, without importing it.

``sglang/__init__.py`` pulls in torch and half the serving stack, so the package is located with
``importlib.util.find_spec`` (which does not execute a top-level package) and the version is read
from the distribution metadata next to it, or from the literal in ``_version.py``/``version.py``.
"""
from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from .errors import SglangNotFound


@dataclass(frozen=True)
class SglangInstall:
    """An SGLang package on disk: ``root`` is the ``sglang/`` folder."""

    root: Path
    version: str
    version_source: str

    def path(self, rel: str) -> Path:
        """Absolute path of ``rel`` (e.g. ``srt/models/llama.py``) inside the package."""
        return self.root / rel


def locate() -> SglangInstall:
    """Return the importable SGLang, or raise SglangNotFound with the fix."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError) as exc:
        raise SglangNotFound(f"Looking up the `sglang` package failed ({exc}).") from exc
    if spec is None or not spec.submodule_search_locations:
        raise SglangNotFound(
            "No `sglang` package is importable by this python "
            "(importlib.util.find_spec('sglang') is None). Run the patcher with the python of the "
            "environment that serves SGLang (the host's ml-env), or install sglang there."
        )
    root = Path(next(iter(spec.submodule_search_locations))).resolve()
    version, source = read_version(root)
    return SglangInstall(root=root, version=version, version_source=source)


def read_version(root: Path) -> tuple[str, str]:
    """Version of the package at ``root`` and where it came from.

    The metadata must sit in the same folder as the package: a global
    ``importlib.metadata.version("sglang")`` could describe another copy on sys.path.
    """
    import importlib.metadata  # here: `remote.serve inspect` of a vLLM host never needs it (14 ms)

    for dist in importlib.metadata.distributions(path=[str(root.parent)]):
        if (dist.metadata.get_all("Name") or [""])[0].lower().replace("_", "-") == "sglang":
            return dist.version, "metadata"
    for name in ("_version.py", "version.py"):
        literal = _version_literal(root / name)
        if literal:
            return literal, name
    try:
        found = importlib.metadata.distribution("sglang")
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found is not None:
        other = Path(str(found.locate_file("sglang")))
        if not other.is_dir() or other.resolve() == root.resolve():
            return found.version, "metadata (global)"  # an editable install's metadata
        raise SglangNotFound(
            f"The sglang imported from {root} carries no version of its own (no dist-info in "
            f"{root.parent}, no `__version__` literal in its version.py), and the sglang "
            f"{found.version} metadata on sys.path belongs to another copy, {other}. Two SGLang "
            "packages are on sys.path: remove the stray one (check PYTHONPATH and .pth files) or "
            "reinstall sglang with pip."
        )
    raise SglangNotFound(
        f"Cannot tell which SGLang version is installed at {root}: there is no sglang dist-info "
        f"in {root.parent} and neither {root / '_version.py'} nor {root / 'version.py'} holds a "
        "literal `__version__ = \"...\"`. Reinstall sglang with pip so its metadata is present."
    )


def _version_literal(path: Path) -> str | None:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            names = []
            for target in node.targets:
                names.extend(_target_names(target))
            if "__version__" in names and isinstance(node.value.value, str):
                return node.value.value
    return None


def _target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    return []
