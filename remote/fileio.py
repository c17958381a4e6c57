"""File helpers shared by the remote tools: hashes, atomic replacement and JSON results.

Remote tools edit files that a running server may read at any moment (site-packages, checkpoint
configs), so every write goes to a temporary file in the same folder and is swapped in with
``os.replace``: a reader sees the old bytes or the new ones, never half a file.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

# hashlib and tempfile are imported where used: together ~5 ms of every quick host tool's start

#: how the temporary file of an atomic write ends (``.NAME.XXXXXXXX.draftops-tmp`` beside NAME)
TMP_SUFFIX = ".draftops-tmp"


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of ``data``."""
    import hashlib
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path``."""
    return sha256_bytes(Path(path).read_bytes())


def atomic_write_bytes(path: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` atomically, keeping the old file's mode (and owner as root).

    ``mode`` is used when the file does not exist yet; an existing file's permission bits win so
    that a patched site-packages file stays exactly as readable as before.
    """
    atomic_write_with(path, lambda handle: handle.write(data), mode=mode)


def atomic_write_text(path: Path, text: str, *, mode: int | None = None) -> None:
    """:func:`atomic_write_bytes` of ``text`` in UTF-8 (whatever the host's locale)."""
    atomic_write_bytes(path, text.encode("utf-8"), mode=mode)


def atomic_write_with(path: Path, write: Callable[[IO[bytes]], object], *, mode: int | None = None) -> None:
    """Replace ``path`` with what ``write`` writes into the binary file it is given (a writer that
    wants a file, such as matplotlib's ``savefig``), atomically, as :func:`atomic_write_bytes`.

    Whatever fails (``write`` itself, a full disk, a signal that unwinds) removes the temporary file
    and leaves the old ``path`` as it was.
    """
    path = Path(path)
    try:
        st: os.stat_result | None = path.stat()
    except FileNotFoundError:
        st = None
    import tempfile
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        if st is not None:
            os.chmod(tmp, st.st_mode & 0o7777)
            if os.geteuid() == 0:
                os.chown(tmp, st.st_uid, st.st_gid)
        else:
            os.chmod(tmp, 0o644 if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path.parent)


@contextmanager
def new_folder(dest: Path) -> Iterator[Path]:
    """A folder that appears at ``dest`` whole or not at all (a copy of a checkpoint): ``dest`` is claimed
    first as an empty folder (exclusive: a name already there raises FileExistsError and is never
    replaced), the block writes into the temporary folder it is given beside it, and that folder is
    renamed onto the claimed one when the block ends. Whatever fails (the block, a full disk, a signal
    that unwinds) removes both, leaving nothing.

    A SIGKILL cannot unwind: it leaves ``dest`` empty and the temporary folder beside it. Each live
    call holds a lock on its temporary folder (``flock``, released by the kernel when the process
    dies), and claims run one at a time (a lock on the parent folder), so the next call recognises
    what a dead one left, an empty ``dest`` and unlocked temporary folders of its name, and clears
    it; a copy still being written is never touched."""
    import shutil
    with _locked(dest.parent):
        tmp = Path(_tmp_beside(dest))
        lock = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _flock(lock, exclusive=True, wait=True):     # (no locks on this file system: nothing is cleared)
                _clear_leftovers(dest, tmp)
            dest.mkdir()
        except BaseException:
            os.close(lock)
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    try:
        os.chmod(tmp, dest.stat().st_mode & 0o7777)     # mkdtemp's 0700 -> what the umask gave dest
        yield tmp
        os.rename(tmp, dest)                             # onto the empty folder claimed above: atomic
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        dest.rmdir()
        raise
    finally:
        os.close(lock)
    _fsync_dir(dest.parent)


def _tmp_beside(dest: Path) -> str:
    """The temporary folder of a :func:`new_folder` at ``dest`` (``.NAME.XXXXXXXX.draftops-tmp``)."""
    import tempfile
    return tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=TMP_SUFFIX, dir=dest.parent)


def _flock(fd: int, *, exclusive: bool, wait: bool) -> bool | None:
    """``flock`` on ``fd``: True when held, False when ``wait`` is False and another process holds it,
    None where the file system has no such locks (some network file systems refuse them on a folder)."""
    import fcntl
    flags = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | (0 if wait else fcntl.LOCK_NB)
    try:
        fcntl.flock(fd, flags)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder`` itself for the block (claims of new folders one at a time)."""
    fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _flock(fd, exclusive=True, wait=True)
        yield
    finally:
        os.close(fd)


def _clear_leftovers(dest: Path, mine: Path) -> None:
    """Remove what a killed :func:`new_folder` left at ``dest``: the empty folder and its unlocked
    temporary folders. Anything else there (a file, a folder with content, no temporary folder, or
    one a live call holds) is left alone, and the claim then refuses the name."""
    import re
    import shutil
    if dest.is_symlink() or not dest.is_dir() or any(dest.iterdir()):
        return
    pattern = re.compile(rf"\.{re.escape(dest.name)}\.[a-z0-9_]{{8}}{re.escape(TMP_SUFFIX)}")
    stale = [p for p in dest.parent.iterdir()
             if p != mine and pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]
    fds = [os.open(p, os.O_RDONLY | os.O_CLOEXEC) for p in stale]
    try:
        if not stale or not all(_flock(fd, exclusive=True, wait=False) is True for fd in fds):
            return
        for folder in stale:
            shutil.rmtree(folder)
        dest.rmdir()
    finally:
        for fd in fds:
            os.close(fd)


def write_exclusive(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data``; raise FileExistsError rather than overwrite anything.

    A write that fails part way (a full disk) removes the file it created: a cut-off backup would
    later pass for the original, and its name would block the next attempt.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        raise


def write_json(path: Path, payload: Any) -> Path:
    """Write ``payload`` as indented JSON to ``path`` (atomically, creating folders)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, (json.dumps(payload, indent=2, default=str) + "\n").encode("utf-8"))
    return path


def writable(path: Path) -> bool:
    """True when this process may replace ``path``: the file and its folder are writable.

    ``os.replace`` needs write access to the folder; the file's own bit is checked too so that a
    deliberately read-only file is treated as a refusal, not silently replaced.
    """
    path = Path(path)
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
