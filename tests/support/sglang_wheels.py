"""Real SGLang sources for the patcher tests: PyPI wheels downloaded at test time, never committed.

Wheels are cached in ``$DRAFTOPS_TEST_CACHE/sglang-wheels`` (default
``~/.cache/draftops/sglang-wheels``), so only the first run needs the network (about 90 MB for
all versions). A test tree holds just the files the patcher reads, laid out as an importable
``sglang`` package whose ``__init__`` raises: the patcher must find it without importing it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # plain `pytest` (not `python -m pytest`) lacks the repo root
    sys.path.insert(0, str(REPO))

from remote.sglang_patch.targets import TARGETS  # noqa: E402
from tests.support.cache_dir import cache_root  # noqa: E402

#: versions every patcher test runs against; extend here
SGLANG_VERSIONS = ("0.4.10.post2", "0.5.2", "0.5.5", "0.5.10", "0.5.13", "0.5.20", "0.5.23")
#: a version whose setter ignores configured ids (refusal tests)
UNSUPPORTED_VERSION = "0.4.6.post5"

STUB_INIT = "raise ImportError('test stub: the patcher must not import sglang')\n"
#: pure-python files are identical across the platform wheels; pin one so the cache is stable
_PLATFORM = ["--platform", "manylinux_2_34_x86_64", "--python-version", "3.11",
             "--implementation", "cp", "--abi", "cp311"]


def cache_dir() -> Path:
    return cache_root() / "sglang-wheels"


def wheel(version: str) -> Path:
    """The cached wheel of ``sglang==version``, downloaded from PyPI the first time."""
    folder = cache_dir()
    found = sorted(folder.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[0]
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", *_PLATFORM, f"sglang=={version}",
               "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"pip download sglang=={version} failed:\n{proc.stderr[-2000:]}")
        got = sorted(Path(tmp).glob("sglang-*.whl"))
        if not got:
            raise RuntimeError(f"pip download sglang=={version} produced no wheel in {tmp}")
        target = folder / got[0].name
        os.replace(got[0], target)
    return target


def member_names(version: str) -> list[str]:
    """Wheel members the patcher reads (the ones that exist in this version)."""
    wanted = {f"sglang/{t.rel}" for t in TARGETS} | {"sglang/version.py", "sglang/_version.py"}
    with zipfile.ZipFile(wheel(version)) as zf:
        return [n for n in zf.namelist()
                if n in wanted or (n.endswith(".dist-info/METADATA") and n.startswith("sglang-"))]


def extract(version: str, dest: Path, *, metadata: bool = True) -> Path:
    """Lay the patcher-relevant files of ``version`` out under ``dest``; returns ``dest``.

    ``dest`` goes on PYTHONPATH. ``metadata=False`` leaves the dist-info out so the version must
    come from ``version.py``/``_version.py``.
    """
    with zipfile.ZipFile(wheel(version)) as zf:
        for name in member_names(version):
            if metadata or "dist-info" not in name:
                zf.extract(name, dest)
    (dest / "sglang" / "__init__.py").write_text(STUB_INIT)
    return dest


def originals(version: str) -> dict[str, bytes]:
    """Wheel bytes of each target file present in ``version``, keyed by ``Target.rel``."""
    out = {}
    with zipfile.ZipFile(wheel(version)) as zf:
        names = set(zf.namelist())
        for target in TARGETS:
            if f"sglang/{target.rel}" in names:
                out[target.rel] = zf.read(f"sglang/{target.rel}")
    return out


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Current bytes of each target file under ``root/sglang``."""
    return {t.rel: (root / "sglang" / t.rel).read_bytes() for t in TARGETS
            if (root / "sglang" / t.rel).exists()}


def run_patcher(root: Path, *args: str, state_dir: Path, out: Path | None = None,
                env: dict[str, str] | None = None, cwd: Path = REPO,
                prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run ``python -m remote.sglang_patch`` with ``root`` (an extracted tree) on PYTHONPATH."""
    cmd = [*prefix, sys.executable, "-m", "remote.sglang_patch", *args,
           "--state-dir", str(state_dir)]
    if out is not None:
        cmd += ["--out", str(out)]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTOPS_")}
    full_env.update(PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1", **(env or {}))
    return subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=300)


def copy_code(dest: Path) -> Path:
    """Copy the ``remote`` package to ``dest`` (for runs as another user); returns ``dest``."""
    shutil.copytree(REPO / "remote", dest / "remote",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dest
