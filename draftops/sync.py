"""Incremental code sync over the host's one connection: a content manifest decides what changed,
changed files travel in one tar stream, and the host applies them atomically (see hostagent.cmd_apply).

What goes: ``remote/`` plus the host's ``sync_paths``, minus ``.git/``, ``__pycache__`` and whatever
the project's ``.gitignore`` files exclude. It lands in ``<root>/code`` with the same relative paths;
files deleted here are deleted there, never anything outside ``<root>/code``.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import paramiko
import pathspec

from draftops.errors import RemoteError, SyncError
from draftops.host import Host
from draftops.hostagent import SYNC_META
from draftops.hostagent import digest as tree_digest

DEFAULT_PATHS = ("remote",)
ALWAYS_EXCLUDED = (".git/", "__pycache__/", "*.pyc", ".draftops/")
Entry = tuple[str, str, int]     # (kind "f"/"l", sha256 or link target, mode)
STATE_FILE = "state/code-manifest.json"   # the host's stat cache of <root>/code, relative to root
GZIP_BELOW = 16 << 20


@dataclass
class SyncReport:
    """What a sync did (or, with dry_run, would do)."""

    host: str
    upload: list[str] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)
    unchanged: int = 0
    bytes_changed: int = 0
    bytes_sent: int = 0
    seconds: float = 0.0
    dry_run: bool = False

    @property
    def noop(self) -> bool:
        return not self.upload and not self.delete


class _Ignore:
    """The project's .gitignore rules (root and nested), plus draftops' fixed exclusions."""

    def __init__(self, project_root: Path):
        self.root = project_root
        self.specs: dict[Path, pathspec.PathSpec] = {}
        self.fixed = pathspec.GitIgnoreSpec.from_lines(ALWAYS_EXCLUDED)

    def _spec(self, folder: Path) -> pathspec.PathSpec | None:
        if folder not in self.specs:
            path = folder / ".gitignore"
            self.specs[folder] = (pathspec.GitIgnoreSpec.from_lines(path.read_text().splitlines())
                                  if path.is_file() else None)
        return self.specs[folder]

    def ignored(self, path: Path, is_dir: bool) -> bool:
        rel = path.relative_to(self.root).as_posix() + ("/" if is_dir else "")
        if self.fixed.match_file(rel):
            return True
        folder = path.parent
        while True:
            spec = self._spec(folder)
            if spec is not None:
                sub = path.relative_to(folder).as_posix() + ("/" if is_dir else "")
                if spec.match_file(sub):
                    return True
            if folder == self.root or self.root not in folder.parents:
                return False
            folder = folder.parent


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def local_manifest(project_root: Path, paths: list[str], cache_file: Path | None = None) -> dict[str, Entry]:
    """{relative path: entry} for everything that should be on the host; hashes cached by stat."""
    cache: dict[str, list] = {}
    if cache_file and cache_file.is_file():
        try:
            cache = json.loads(cache_file.read_text())
        except ValueError:
            cache = {}
    new_cache: dict[str, list] = {}
    ignore = _Ignore(project_root)
    manifest: dict[str, Entry] = {}
    for top in paths:
        start = (project_root / top)
        if project_root.resolve() not in start.resolve().parents and start.resolve() != project_root.resolve():
            raise SyncError(f"Sync path {top!r} points outside the project {project_root}; list only "
                            "folders inside it.")
        if not start.exists() and not start.is_symlink():
            raise SyncError(f"Sync path {top!r} does not exist under {project_root}; fix `sync_paths` in "
                            "hosts.yaml (paths are relative to the project root).")
        candidates = [start] if not start.is_dir() or start.is_symlink() else None
        walker = ([(str(start.parent), [], [start.name])] if candidates else os.walk(start))
        for dirpath, dirnames, filenames in walker:
            folder = Path(dirpath)
            for name in list(dirnames):
                child = folder / name
                if child.is_symlink():
                    dirnames.remove(name)
                    filenames.append(name)
                elif ignore.ignored(child, True):
                    dirnames.remove(name)
            for name in filenames:
                child = folder / name
                if ignore.ignored(child, False):
                    continue
                rel = child.relative_to(project_root).as_posix()
                if child.is_symlink():
                    manifest[rel] = ("l", os.readlink(child), 0)
                    continue
                st = child.stat()
                key = [st.st_size, st.st_mtime_ns, st.st_ino]
                old = cache.get(rel)
                sha = old[1] if old and old[0] == key else _hash_file(child)
                new_cache[rel] = [key, sha]
                manifest[rel] = ("f", sha, st.st_mode & 0o777)
    if cache_file and new_cache != cache:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(new_cache))
        os.replace(tmp, cache_file)
    return manifest


def _payload(project_root: Path, upload: list[str], manifest: dict[str, Entry], delete: list[str],
             sizes: dict[str, int]) -> bytes:
    """One tar stream: the changed files plus a metadata member listing deletions."""
    raw = sum(sizes.values())
    buf = io.BytesIO()
    # gzip level 1 makes tar headers and padding nearly free and shrinks code text; past a few MB
    # (weights, blobs) it only costs CPU, so big payloads go as plain tar.
    mode = "w:gz" if raw < GZIP_BELOW else "w:"
    kwargs = {"compresslevel": 1} if mode == "w:gz" else {}
    with tarfile.open(fileobj=buf, mode=mode, format=tarfile.PAX_FORMAT, **kwargs) as tar:
        meta = json.dumps({"delete": delete}).encode()
        info = tarfile.TarInfo(SYNC_META)
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))
        for rel in upload:
            kind, value, mode_bits = manifest[rel]
            info = tarfile.TarInfo(rel)
            if kind == "l":
                info.type = tarfile.SYMTYPE
                info.linkname = value
                tar.addfile(info)
            else:
                info.size = sizes[rel]
                info.mode = mode_bits
                with open(project_root / rel, "rb") as fh:
                    tar.addfile(info, fh)
    return buf.getvalue()


def _diff(local: dict[str, Entry], remote: dict[str, Entry]) -> tuple[list[str], list[str]]:
    upload = sorted(rel for rel, entry in local.items() if remote.get(rel) != entry)
    delete = sorted(rel for rel in remote if rel not in local)
    return upload, delete


def _memory_file(host: Host) -> Path:
    """Where we remember the host's tree after our last sync (keyed by where the tree lives)."""
    spec = host.spec
    key = hashlib.sha256(f"{spec.transport}|{spec.user}|{spec.address}|{spec.port}|{spec.root}".encode())
    return host.project_root / ".draftops" / "cache" / f"remote-{spec.name}-{key.hexdigest()[:12]}.json"


def _file_sizes(project_root: Path, upload: list[str], local: dict[str, Entry]) -> dict[str, int]:
    return {rel: (project_root / rel).stat().st_size for rel in upload if local[rel][0] == "f"}


def _apply(host: Host, local: dict[str, Entry], upload: list[str], delete: list[str],
           expected_tree: str) -> tuple[dict, int, int]:
    """Send the changes; returns (host's answer, bytes sent, bytes of changed files)."""
    sizes = _file_sizes(host.project_root, upload, local)
    payload = _payload(host.project_root, upload, local, delete, sizes) if upload or delete else b""
    digest = hashlib.sha256(payload).hexdigest()
    try:
        answer = host.agent("apply", "code", STATE_FILE, digest, str(len(payload)), expected_tree,
                            input=payload)
    except (RemoteError, OSError, EOFError, paramiko.SSHException) as exc:
        raise SyncError(f"Sync to host {host.name!r} failed: {exc or type(exc).__name__}. The files on the host were left "
                        "as they were (or fully updated, if the failure came after the transfer); "
                        "run `invoke sync` again.") from None
    return answer, len(payload), sum(sizes.values())


def sync(host: Host, *, dry_run: bool = False, paths: list[str] | None = None) -> SyncReport:
    """Make ``<root>/code`` on ``host`` equal the local sync paths; return what was done.

    When we remember the host's tree from our last sync, the changes go out at once together with
    that tree's digest: one SSH exec for a no-op or a small edit. The host refuses ("stale") if its
    tree differs from what we remember, and we fall back to comparing full manifests.
    """
    started = time.monotonic()
    project_root = host.project_root
    wanted = list(paths or [*DEFAULT_PATHS, *host.spec.sync_paths])
    local = local_manifest(project_root, wanted, project_root / ".draftops" / "cache" / "sync-manifest.json")
    memory_file = _memory_file(host)
    known = _load_memory(memory_file)
    answer: dict = {"status": "stale"}
    sent = changed = 0
    if known is not None and not dry_run:
        upload, delete = _diff(local, known["manifest"])
        answer, sent, changed = _apply(host, local, upload, delete, known["digest"])
    if answer["status"] == "stale":
        remote_answer = answer if "manifest" in answer else host.agent("manifest", "code", STATE_FILE)
        remote = {k: tuple(v) for k, v in remote_answer["manifest"].items()}
        upload, delete = _diff(local, remote)
        answer, sent, changed = remote_answer, 0, 0
        if not dry_run and (upload or delete):
            answer, sent, changed = _apply(host, local, upload, delete, "-")
    if dry_run:
        changed = sum(_file_sizes(project_root, upload, local).values())
    report = SyncReport(host=host.name, upload=upload, delete=delete, unchanged=len(local) - len(upload),
                        dry_run=dry_run, bytes_sent=sent, bytes_changed=changed)
    if not dry_run:
        if answer.get("digest") == tree_digest(local):
            if not known or known["digest"] != answer["digest"]:
                _save_memory(memory_file, local, answer["digest"])
        else:
            memory_file.unlink(missing_ok=True)
    report.seconds = time.monotonic() - started
    return report


def _load_memory(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
        return {"digest": data["digest"], "manifest": {k: tuple(v) for k, v in data["manifest"].items()}}
    except (OSError, ValueError, KeyError):
        return None


def _save_memory(path: Path, manifest: dict[str, Entry], digest: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"digest": digest, "manifest": manifest}))
    os.replace(tmp, path)
