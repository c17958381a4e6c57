"""Incremental code sync over the host's one connection: a content manifest decides what changed,
changed files travel in one tar stream, and the host applies them atomically (see draftops/onhost/apply.py, cmd_apply).

What goes: ``remote/`` plus the host's ``sync_paths``, minus ``.git/``, ``__pycache__`` and whatever
the project's ``.gitignore`` files exclude. It lands in ``<root>/code`` with the same relative paths;
files deleted here are deleted there, never anything outside ``<root>/code``.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import posixpath
import stat
import tarfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from draftops import timing
from draftops.errors import RemoteError, RootError, SyncError
from draftops.link.agent import ApplyResult, Entry, Manifest
from draftops.link.host import Host, host_cache_file
from draftops.onhost.wire import OWNER_MARK, SYNC_META, cached_sha
from draftops.onhost.wire import digest as tree_digest
from remote.fileio import atomic_write_bytes

if TYPE_CHECKING:
    import pathspec

    from draftops.inventory import HostSpec

DEFAULT_PATHS = ("remote",)
ALWAYS_EXCLUDED = (".git/", "__pycache__/", "*.pyc", ".draftops/", "/" + OWNER_MARK)
MAX_ROUNDS = 8                   # applies that may find the host's tree changed under them
STATE_FILE = "state/code-manifest.json"   # the host's stat cache of <root>/code, relative to root
GZIP_BELOW = 16 << 20
T = TypeVar("T")


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
    busy_runs: list[str] = field(default_factory=list)   # live runs whose code changed (--force)

    @property
    def noop(self) -> bool:
        return not self.upload and not self.delete

    @property
    def said(self) -> str:
        """The one line a task shows for a sync that changed files before it ran synced code."""
        return f"synced {len(self.upload)} changed file(s) to {self.host}"


class _Ignore:
    """The project's .gitignore rules (root and nested), plus draftops' fixed exclusions.

    Paths are plain strings under the project root and each folder's chain of .gitignore files is
    worked out once: a no-op sync of thousands of files spent most of its scan in pathlib before."""

    def __init__(self, project_root: Path):
        import pathspec  # here, not at the top: only a sync needs it

        self.gitignore = pathspec.GitIgnoreSpec
        self.root = str(project_root)
        self.root_cut = len(os.path.join(self.root, ""))        # strips "<root>/" off a path
        self.specs: dict[str, pathspec.PathSpec | None] = {}
        self.chains: dict[str, list[tuple[int, pathspec.PathSpec]]] = {}
        self.fixed = self.gitignore.from_lines(ALWAYS_EXCLUDED)

    def _spec(self, folder: str) -> pathspec.PathSpec | None:
        if folder not in self.specs:
            path = Path(folder, ".gitignore")
            self.specs[folder] = self._read(path) if path.is_file() else None
        return self.specs[folder]

    def _read(self, path: Path) -> pathspec.PathSpec:
        """A .gitignore's patterns, read as git reads them: bytes (a name that is not UTF-8 decodes as
        os.walk decodes it). A pattern pathspec cannot read is an error naming its line: left out, it
        could send what it was written to keep home."""
        lines = path.read_bytes().decode("utf-8", "surrogateescape").splitlines()
        try:
            return self.gitignore.from_lines(lines)
        except ValueError:
            for number, line in enumerate(lines, 1):
                try:
                    self.gitignore.from_lines([line])
                except ValueError as exc:
                    raise SyncError(f"{path}:{number}: {line!r} is not a .gitignore pattern draftops can read "
                                    f"({exc}), so it cannot tell what the sync should leave out. Fix or remove "
                                    "that line, then sync again.") from None
            raise

    def _chain(self, folder: str) -> list[tuple[int, pathspec.PathSpec]]:
        """The .gitignore specs that apply in ``folder`` (its own and those of every folder up to the
        root), each with the length of its folder's prefix to cut off a path."""
        chain = self.chains.get(folder)
        if chain is None:
            spec = self._spec(folder)
            chain = [(len(os.path.join(folder, "")), spec)] if spec is not None else []
            if folder != self.root and folder.startswith(os.path.join(self.root, "")):
                chain = chain + self._chain(os.path.dirname(folder))
            self.chains[folder] = chain
        return chain

    def ignored(self, path: str, is_dir: bool) -> bool:
        """Whether ``path`` (absolute, under the root, as os.walk joins it) is left out."""
        tail = "/" if is_dir else ""
        if self.fixed.match_file(path[self.root_cut:] + tail):
            return True
        return any(spec.match_file(path[cut:] + tail) for cut, spec in self._chain(os.path.dirname(path)))


def _hash_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def sync_roots(project_root: Path, paths: list[str]) -> list[str]:
    """The sync paths as normalised project-relative POSIX paths, each once, nested ones dropped.

    ``remote/../remote`` or ``./remote/`` must not become a second name for the same files (the host
    stores them under one name, so they would differ, and be re-sent, on every sync)."""
    tops: list[str] = []
    for top in paths:
        raw = Path(top)
        if raw.is_absolute():
            try:
                raw = raw.relative_to(project_root)
            except ValueError:
                raw = Path(os.path.relpath(raw, project_root))
        norm = posixpath.normpath(raw.as_posix())
        real = (project_root / norm).resolve()
        if norm == ".." or norm.startswith("../") or (real != project_root.resolve()
                                                       and project_root.resolve() not in real.parents):
            raise SyncError(f"Sync path {top!r} points outside the project {project_root}; list only "
                            "folders inside it in `sync_paths` (hosts.yaml).")
        tops.append(norm)
    unique = list(dict.fromkeys(tops))
    return [top for top in unique
            if not any(other != top and (other == "." or top.startswith(other + "/")) for other in unique)]


def _local_entry(path: str, rel: str, cache: dict[str, list], new_cache: dict[str, list]) -> Entry:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return ("l", os.readlink(path), 0)
    if not stat.S_ISREG(st.st_mode):
        raise SyncError(f"Cannot sync {path}: it is not a regular file, folder or symbolic link (a FIFO, "
                        "socket or device), so it cannot be copied; remove it or list it in .gitignore.")
    key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
    sha = cached_sha(cache.get(rel), key) or _hash_file(path)
    new_cache[rel] = [key, sha]
    return ("f", sha, st.st_mode & 0o777)


def _raise(exc: OSError) -> None:
    raise exc


def local_manifest(project_root: Path, paths: list[str], cache_file: Path | None = None) -> dict[str, Entry]:
    """{relative path: entry} for everything that should be on the host; hashes cached by stat.

    Anything that cannot be read stops the sync: a file the scan did not see would otherwise be
    deleted on the host."""
    cache = _read_json(cache_file) if cache_file else {}
    new_cache: dict[str, list] = {}
    ignore = _Ignore(project_root)
    manifest: dict[str, Entry] = {}
    try:
        for top in sync_roots(project_root, paths):
            start = project_root / top
            if not start.exists() and not start.is_symlink():
                raise SyncError(f"Sync path {top!r} does not exist under {project_root}; fix `sync_paths` "
                                "in hosts.yaml (paths are relative to the project root).")
            for child in _walk_files(start, ignore):
                rel = child[ignore.root_cut:]
                manifest[rel] = _local_entry(child, rel, cache, new_cache)
    except OSError as exc:
        raise SyncError(f"Cannot read {exc.filename or project_root}: {exc.strerror or exc}. The sync "
                        "stopped before changing anything (a file it cannot see would otherwise be "
                        "deleted on the host); make it readable, or list it in .gitignore, then sync "
                        "again.") from None
    if cache_file and new_cache != cache:
        _write_json(cache_file, new_cache)
    return manifest


def _walk_files(start: Path, ignore: _Ignore) -> Iterator[str]:
    """Every path to sync under ``start`` (or ``start`` itself, a file or link): links are entries, never
    followed into; ignored folders are not entered."""
    single = not start.is_dir() or start.is_symlink()
    walker = [(str(start.parent), [], [start.name])] if single else os.walk(start, onerror=_raise)
    for dirpath, dirnames, filenames in walker:
        for name in list(dirnames):
            child = os.path.join(dirpath, name)
            if os.path.islink(child):
                dirnames.remove(name)
                filenames.append(name)
            elif ignore.ignored(child, True):
                dirnames.remove(name)
        for name in filenames:
            child = os.path.join(dirpath, name)
            if not ignore.ignored(child, False):
                yield child


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: object) -> None:
    """Atomic and safe when several syncs run at once: each writer has its own temp file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(data).encode())


def _tar_writer(buf: io.BytesIO, compress: bool) -> tarfile.TarFile:
    if compress:
        return tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT, compresslevel=1)
    return tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT)


def _payload(project_root: Path, upload: list[str], manifest: dict[str, Entry], delete: list[str],
             sizes: dict[str, int]) -> bytes:
    """One tar stream: the changed files plus a metadata member listing deletions."""
    raw = sum(sizes.values())
    buf = io.BytesIO()
    # gzip level 1 makes tar headers and padding nearly free and shrinks code text; past a few MB
    # (weights, blobs) it only costs CPU, so big payloads go as plain tar.
    with _tar_writer(buf, compress=raw < GZIP_BELOW) as tar:
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
                continue
            info.mode = mode_bits
            try:
                with open(project_root / rel, "rb") as fh:
                    info.size = os.fstat(fh.fileno()).st_size
                    tar.addfile(info, fh)
            except OSError as exc:
                raise SyncError(f"Cannot read {project_root / rel}: {exc.strerror or exc} (did it change "
                                "while syncing?). Nothing was sent; sync again.") from None
    return buf.getvalue()


def _diff(local: dict[str, Entry], remote: dict[str, Entry]) -> tuple[list[str], list[str]]:
    upload = sorted(rel for rel, entry in local.items() if remote.get(rel) != entry)
    delete = sorted(rel for rel in remote if rel not in local)
    return upload, delete


def _memory_file(host: Host) -> Path:
    """Where we remember the host's tree after our last sync (keyed by where the tree lives)."""
    return host_cache_file(host.spec, host.project_root, "remote")


def _file_sizes(project_root: Path, upload: list[str], local: dict[str, Entry]) -> dict[str, int]:
    try:
        return {rel: (project_root / rel).stat().st_size for rel in upload if local[rel][0] == "f"}
    except OSError as exc:
        raise SyncError(f"Cannot read {exc.filename}: {exc.strerror or exc} (did it change while "
                        "syncing?). Nothing was sent; sync again.") from None


def _agent(host: Host, call: Callable[[], T]) -> T:
    """One sync command on the host. Its refusals (SyncRefused: the host's reason and fix) pass as they
    are; any other failure (a dropped link is a RemoteError too: draftops.link maps it, LinkDropped)
    becomes a SyncError that says what state the host's files are in."""
    try:
        return call()
    except (SyncError, RootError):      # a refusal, or the root itself: the host's own one paragraph
        raise
    except RemoteError as exc:
        raise SyncError(f"Host {host.name!r}: sync failed: {str(exc) or type(exc).__name__}. The files on the host "
                        "were left as they were (or fully updated, if the failure came after the transfer); "
                        "run `invoke sync` again.") from exc


def _apply(host: Host, local: dict[str, Entry], upload: list[str], delete: list[str],
           expected_tree: str, force: bool) -> tuple[ApplyResult, int, int]:
    """Send the changes; returns (host's answer, bytes sent, bytes of changed files)."""
    sizes = _file_sizes(host.project_root, upload, local)
    try:
        payload = _payload(host.project_root, upload, local, delete, sizes) if upload or delete else b""
    except MemoryError:
        raise SyncError(_too_big(host, sizes)) from None
    answer = _agent(host, lambda: host.agent.apply("code", STATE_FILE, payload, expected_tree=expected_tree,
                                                   force=force))
    return answer, len(payload), sum(sizes.values())


def _too_big(host: Host, sizes: dict[str, int]) -> str:
    """Why changes that do not fit in memory were not sent (they travel as one tar held in memory)."""
    biggest = sorted(sizes, key=lambda rel: -sizes[rel])[:3]
    named = ", ".join(f"{rel} ({sizes[rel] / 2**30:.1f} GiB)" for rel in biggest)
    return (f"Host {host.name!r}: the changed files ({sum(sizes.values()) / 2**30:.1f} GiB) do not fit in memory "
            f"here, and a sync sends them as one tar held in memory; the biggest: {named}. Nothing was sent. "
            "Sync is for code: list big files (weights, data) in .gitignore and copy them to the host with "
            "scp or rsync.")


def scan(project_root: Path, spec: HostSpec, paths: list[str] | None = None) -> dict[str, Entry]:
    """The local side of a sync of ``spec``: what should be on the host (hashes cached by stat).

    Needs no connection, so `invoke sync` runs it while the SSH handshake is under way."""
    started = time.monotonic()
    wanted = list(paths or [*DEFAULT_PATHS, *spec.sync_paths])
    local = local_manifest(project_root, wanted, project_root / ".draftops" / "cache" / "sync-manifest.json")
    timing.took("scan", time.monotonic() - started)
    return local


def sync(host: Host, *, dry_run: bool = False, paths: list[str] | None = None,
         force: bool = False, local: dict[str, Entry] | None = None) -> SyncReport:
    """Make ``<root>/code`` on ``host`` equal the local sync paths; return what was done.

    When we remember the host's tree from our last sync, the changes go out at once together with
    that tree's digest: one SSH exec for a no-op or a small edit. The host refuses ("stale") if its
    tree differs from what we remember, and we compare against the manifest it sends back; every
    apply names the tree it was computed against, so a concurrent change is never overwritten
    blindly. A live run working in ``<root>/code`` makes the host refuse changes unless ``force``.
    ``local`` is ``scan(host.project_root, host.spec, paths)`` when the caller has made it already.
    """
    started = time.monotonic()
    project_root = host.project_root
    if local is None:
        local = scan(project_root, host.spec, paths)
    memory_file = _memory_file(host)
    known = _load_memory(memory_file)
    answer: ApplyResult | None = None           # None: not sent yet, compare with the host's manifest
    upload: list[str] = []
    delete: list[str] = []
    sent = changed = 0
    if known is not None and not dry_run:
        upload, delete = _diff(local, known["manifest"])
        answer, sent, changed = _apply(host, local, upload, delete, known["digest"], force)
    rounds = 0
    tree: Manifest | None = None
    while answer is None or answer.status == "stale":
        tree = answer.manifest if answer else None
        if tree is None:
            tree = _agent(host, lambda: host.agent.manifest("code", STATE_FILE))
        upload, delete = _diff(local, tree.entries)
        changed = 0
        if dry_run or not (upload or delete):
            break
        rounds += 1
        if rounds > MAX_ROUNDS:
            raise SyncError(f"Host {host.name!r}: the code tree kept changing while we synced "
                            f"({MAX_ROUNDS} tries): other syncs of different checkouts, or a job writing "
                            f"into {host.code_dir}, got there first each time. Stop them, then sync again.")
        answer, more, changed = _apply(host, local, upload, delete, tree.digest, force)
        sent += more
    if dry_run:
        changed = sum(_file_sizes(project_root, upload, local).values())
    report = SyncReport(host=host.name, upload=upload, delete=delete, unchanged=len(local) - len(upload),
                        dry_run=dry_run, bytes_sent=sent, bytes_changed=changed,
                        busy_runs=list(answer.busy_runs if answer else []))
    if not dry_run:
        _remember(memory_file, local, known, answer.digest if answer else (tree.digest if tree else ""))
    report.seconds = time.monotonic() - started
    return report


def sync_once(host: Host) -> SyncReport | None:
    """Sync before synced code runs, once per invoke call (a no-op sync costs one round trip); None when
    this call has synced ``host`` already."""
    if host.synced:
        return None
    report = sync(host)
    host.synced = True
    return report


def _remember(memory_file: Path, local: dict[str, Entry], known: dict | None, digest: str) -> None:
    """Keep the host's tree for the next sync when it is now the local one; forget it otherwise."""
    if digest == tree_digest(local):
        if not known or known["digest"] != digest:
            _save_memory(memory_file, local, digest)
    else:
        memory_file.unlink(missing_ok=True)


def _load_memory(path: Path) -> dict | None:
    data = _read_json(path)
    try:
        return {"digest": data["digest"], "manifest": {k: tuple(v) for k, v in data["manifest"].items()}}
    except (KeyError, TypeError, AttributeError):
        return None


def _save_memory(path: Path, manifest: dict[str, Entry], digest: str) -> None:
    _write_json(path, {"digest": digest, "manifest": manifest})
