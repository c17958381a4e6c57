"""The demo, built once per source version and kept between test runs (issue 8: every run of the
suite built it again).

An entry is ``<test cache>/demo/<key>/``: the demo folder plus ``MANIFEST.json`` (size and sha256 of
every file).  The key is a digest of everything that decides the demo's bytes: the source of every
project module the generator imports (found from the import statements, so a new helper module is
covered the day it is imported; the packages' ``__init__`` files only re-export and are left out, so
an edit of the evaluator does not cost a rebuild), the ``DemoSpec``, and the versions of python,
torch and safetensors (``data_pt/`` is a torch pickle) and the machine type (float results of
training).  A fresh build has the same bytes as the entry (tests/test_demo_cache.py checks it), so a
stale entry could only come from an input missing from the key.

Made safe for concurrent runs the way ``ensure_demo`` is on a host: one lock file per key; the
demo is built in a temporary folder next to the entry and renamed into place, so an entry either is
complete or does not exist.  Every use re-hashes the entry against its manifest first: a truncated,
edited or half-deleted entry is moved aside and rebuilt, never trusted.  Callers get a private copy,
so a test that writes into its demo cannot damage the cache.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict
from importlib.metadata import version
from pathlib import Path

from remote.drafter.demo.build import DemoSpec, build_demo
from tests.support.cache_dir import cache_root
from tests.support.import_graph import REPO, import_closure

GENERATOR = "remote.drafter.demo.build"
MANIFEST = "MANIFEST.json"
KEEP_UNUSED_DAYS = 14  # entries of other source versions unused this long are removed
DEFAULT = DemoSpec()


def demo_cache_dir() -> Path:
    return cache_root() / "demo"


def source_files(root: Path = REPO) -> list[Path]:
    """The project modules the generator runs: itself and what it imports, transitively."""
    return sorted(import_closure(GENERATOR, root).values())


def cache_key(spec: DemoSpec = DEFAULT, root: Path = REPO) -> str:
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    facts = {"spec": asdict(spec), "python": platform.python_version(), "machine": platform.machine(),
             "torch": version("torch"), "safetensors": version("safetensors")}
    digest.update(json.dumps(facts, sort_keys=True).encode())
    return digest.hexdigest()[:24]


def _file_digests(folder: Path) -> dict[str, list]:
    """{relative path: [size, sha256]} of every file under ``folder`` except the manifest."""
    found: dict[str, list] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if rel == MANIFEST or path.is_dir():
            continue
        found[rel] = [path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()]
    return found


def verify(entry: Path) -> str | None:
    """None when ``entry`` matches its manifest file for file; otherwise what is wrong."""
    try:
        expected = json.loads((entry / MANIFEST).read_text())
        found = _file_digests(entry)
    except (OSError, ValueError) as exc:
        return f"unreadable: {exc}"
    if found == expected:
        return None
    differ = sorted(set(found) ^ set(expected) | {k for k in found if found[k] != expected.get(k)})
    return f"differs from its manifest in {differ[:5]}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _build(folder: Path, key: str, spec: DemoSpec) -> Path:
    """Build into a fresh temporary folder beside the entry, manifest last, then rename into place."""
    tmp = Path(tempfile.mkdtemp(dir=folder, prefix=f".build-{key}-"))
    with contextlib.redirect_stdout(io.StringIO()):
        build_demo(tmp, spec)
    (tmp / MANIFEST).write_text(json.dumps(_file_digests(tmp), indent=1))
    tmp.chmod(0o755)                                     # mkdtemp's 0700 would travel into every copy
    entry = folder / key
    os.rename(tmp, entry)
    return entry


def _discard(folder: Path, path: Path) -> None:
    """Move ``path`` out of the way first (an atomic step), then delete it."""
    if path.exists():
        aside = Path(tempfile.mkdtemp(dir=folder, prefix=".trash-"))
        os.rename(path, aside / "entry")
        shutil.rmtree(aside, ignore_errors=True)


def _prune(folder: Path, keep: str) -> None:
    """Remove entries of other keys unused for KEEP_UNUSED_DAYS (each under its own lock, taken
    without waiting: an entry in use by another run is left alone), and what a killed run left in
    the trash.  Lock files stay: unlinking one while another run waits on it would let a third run
    lock a new file of the same name, and two runs would build at once."""
    limit = time.time() - KEEP_UNUSED_DAYS * 86400
    for entry in folder.iterdir():
        if entry.name.startswith(".trash-"):
            shutil.rmtree(entry, ignore_errors=True)
        if entry.name.startswith(".") or entry.name == keep or not entry.is_dir():
            continue
        manifest = entry / MANIFEST
        used = manifest.stat().st_mtime if manifest.exists() else 0.0
        if used >= limit:
            continue
        with open(folder / f".{entry.name}.lock", "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue
            _discard(folder, entry)


def cached_demo(dest: Path, spec: DemoSpec = DEFAULT) -> Path:
    """A verified copy of the cached demo of ``spec`` at ``dest`` (built first when missing or bad)."""
    folder = demo_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    key = cache_key(spec)
    entry = folder / key
    with _locked(folder / f".{key}.lock"):
        for stale in folder.glob(f".build-{key}-*"):   # left by a killed run: nobody builds it now
            shutil.rmtree(stale, ignore_errors=True)
        if entry.exists() and verify(entry) is not None:
            _discard(folder, entry)
        if not entry.exists():
            _build(folder, key, spec)
            _prune(folder, key)
        os.utime(entry / MANIFEST)                        # last use, for _prune
        shutil.copytree(entry, dest, ignore=shutil.ignore_patterns(MANIFEST))
    return dest

