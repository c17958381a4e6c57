"""Code sync on the host, its writing half: apply one checked change set atomically (deletions, then
every file to a temp name, flushed, renamed into place), drop stale bytecode, refuse under a live run.

One part of the host agent: draftops/onhost/__init__.py assembles the parts, in order, into the one
stdlib-only script the host runs (docs/protocol.md)."""
import errno
import hashlib
import io
import os
import signal
import stat
import sys

from draftops.onhost.runs import _live_runs_on_code  # noqa: F401
from draftops.onhost.sync import (  # noqa: F401
    _NOTHING_CHANGED,
    PYCACHE,
    Refusal,
    _in_code,
    _locked,
    _open_code,
    _Plan,
    _scan_and_store,
    _split,
    _why,
)
from draftops.onhost.wire import _CLOEXEC, _DIR_FLAGS, TMP_MARK, Exit, _fail, _out, _stamp, digest  # noqa: F401


class _Dirs:
    """Directory fds under code, reached component by component with O_NOFOLLOW (cached, bounded)."""

    def __init__(self, code_fd):
        self.code_fd, self.fds, self.created = code_fd, {}, []

    def open(self, rel_dir, create=False):
        if not rel_dir:
            return self.code_fd
        if rel_dir in self.fds:
            return self.fds[rel_dir]
        head, name = _split(rel_dir)
        parent = self.open(head, create)
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
            os.mkdir(name, 0o755, dir_fd=parent)
            self.created.append(rel_dir)
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refusal(Exit.REFUSED_ENTRY, f"refusing to write or delete under {_in_code(rel_dir)}: it "
                                  "is not a real folder on the host (a symbolic link or a file appeared "
                                  "there), and nothing is followed through it") from None
            raise
        if len(self.fds) >= 256:
            self.close()
        self.fds[rel_dir] = fd
        return fd

    def close(self):
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def remove_created(self):
        """Remove the folders this apply created, where they stayed empty (after a failure)."""
        self.close()
        for rel_dir in reversed(self.created):
            head, name = _split(rel_dir)
            try:
                os.rmdir(name, dir_fd=self.open(head))
            except (OSError, Refusal):
                pass
        self.close()


def _cached_module(name):
    """The module whose bytecode ``name`` in ``__pycache__`` holds: ``MODULE.<tag>[...].pyc``, the tag
    an implementation and version (``cpython-311``; pytest appends its own), so ``foo.bar.py``'s cache
    is not ``foo.py``'s; None for anything else."""
    if not name.endswith(".pyc"):
        return None
    parts = name.split(".")
    for i in range(1, len(parts)):
        impl, dash, version = parts[i].partition("-")
        if impl.isalpha() and dash and version[:1].isdigit():
            return ".".join(parts[:i])
    return None


def _drop_bytecode(parent, modules=None):
    """Remove the host python's cached bytecode in folder ``parent``: of ``modules`` (deleted or
    rewritten ``NAME.py`` files of that folder, one listing for all), or all of the cache (the folder
    is being pruned or replaced: then every plain file in it goes, a half-written ``.pyc.NNN`` of a
    killed python too). Only plain files in a real ``__pycache__`` folder are touched, never through
    a link; errors leave things as they were."""
    try:
        cache = os.open(PYCACHE, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return
    try:
        for name in os.listdir(cache):
            if modules is None or _cached_module(name) in modules:
                try:
                    if stat.S_ISREG(os.stat(name, dir_fd=cache, follow_symlinks=False).st_mode):
                        os.unlink(name, dir_fd=cache)
                except OSError:
                    pass
    except OSError:
        pass
    finally:
        os.close(cache)
    if modules is None:
        try:
            os.rmdir(PYCACHE, dir_fd=parent)
        except OSError:
            pass


def _drop_sources_bytecode(dirs, sources):
    """``_drop_bytecode`` for the modules an apply deleted or wrote, one folder at a time
    ({folder: {module, ...}})."""
    for head, modules in sources.items():
        try:
            _drop_bytecode(dirs.open(head), modules)
        except (OSError, Refusal):
            pass


def _drop_cache_folder(parent, name):
    """Empty folder ``name`` of ``parent`` of the host's bytecode cache when that is all it holds (a
    file or link is about to replace the folder, or it is being pruned)."""
    try:
        folder = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return
    try:
        if os.listdir(folder) == [PYCACHE]:
            _drop_bytecode(folder)
    except OSError:
        pass
    finally:
        os.close(folder)


def _delete(code_fd, rels):
    """Unlink the listed files and links (never a folder, never through a link), with the bytecode
    the host cached for a deleted module; prune emptied folders (a folder holding only its bytecode
    cache counts as empty: left behind, it would import as an empty namespace package)."""
    dirs, deleted, emptied = _Dirs(code_fd), 0, set()
    sources: dict = {}                    # folder -> modules deleted there (their bytecode goes too)
    try:
        for rel in rels:
            head, name = _split(rel)
            try:
                parent = dirs.open(head)
                if stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                    continue
                os.unlink(name, dir_fd=parent)
            except FileNotFoundError:
                continue
            if name.endswith(".py"):
                sources.setdefault(head, set()).add(name[:-3])
            deleted += 1
            emptied.add(head)
        _drop_sources_bytecode(dirs, sources)
        for head in sorted(emptied, key=lambda d: -d.count("/")):
            while head:
                dirs.close()
                head, name = _split(head)
                try:
                    parent = dirs.open(head)
                    _drop_cache_folder(parent, name)
                    os.rmdir(name, dir_fd=parent)
                except (OSError, Refusal):
                    break
    finally:
        dirs.close()
    return deleted


def _datasync(fds):
    """fdatasync written temp files in parallel, then close them: the journal batches the flushes, so
    2,000 small files cost a few commits instead of 2,000 (one by one that is seconds)."""
    try:
        if len(fds) < 4:
            for fd in fds:
                os.fdatasync(fd)
        else:
            # imported here: on a no-op sync its import would cost 40 ms
            from concurrent.futures import ThreadPoolExecutor
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(os.fdatasync, fds))
    finally:
        for fd in fds:
            os.close(fd)
        del fds[:]


def _write_fd(fd, source, digest):
    for block in iter(lambda: source.read(1 << 20), b""):
        digest.update(block)
        view = memoryview(block)
        while view:
            view = view[os.write(fd, view):]


def _write(code_fd, plan):
    """Write every file and link to a temp name of this apply, flush them, then rename each into place.

    A failure (a full disk) removes this apply's temp files and the folders it created, so the tree
    holds only whole files. Nothing else is removed: other names with ``.draftops-tmp-`` in them
    belong to someone else (or to the project) and are synced like any other file."""
    dirs = _Dirs(code_fd)
    staged: list = []
    unsynced: list = []
    sources: dict = {}                    # folder -> modules written there (their bytecode goes)
    hashed: dict = {}                     # temp name -> (sha256, inode, size, mtime) as written
    token = f"{TMP_MARK}{os.getpid()}-{os.urandom(4).hex()}-"
    try:
        for i, member in enumerate(plan.members):
            _stage(dirs, plan, member, token + str(i), staged, unsynced, hashed)
        _datasync(unsynced)
        while staged:
            _put_in_place(dirs, plan, staged[0], hashed, sources)
            staged.pop(0)
        return len(plan.members)
    except BaseException:
        for fd in unsynced:
            os.close(fd)
        for head, tmp, _name in staged:
            try:
                os.unlink(tmp, dir_fd=dirs.open(head))
            except (OSError, Refusal):
                pass
        dirs.remove_created()
        raise
    finally:
        _drop_sources_bytecode(dirs, sources)   # of the files renamed into place, even when a later one failed
        dirs.close()


def _stage(dirs, plan, member, tmp, staged, unsynced, hashed):
    """Write one member to its temp name ``tmp`` beside its place (noted in ``staged``; a file's open fd
    in ``unsynced`` until flushed, its hash and stat in ``hashed``)."""
    head, name = _split(member.name)
    parent = dirs.open(head, create=True)
    if member.issym():
        os.symlink(member.linkname, tmp, dir_fd=parent)
        staged.append((head, tmp, name))
        return
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600, dir_fd=parent)
    unsynced.append(fd)
    staged.append((head, tmp, name))
    digest = hashlib.sha256()
    _write_fd(fd, plan.tar.extractfile(member), digest)
    os.fchmod(fd, member.mode & 0o777)
    st = os.fstat(fd)
    hashed[tmp] = (digest.hexdigest(), st.st_ino, st.st_size, st.st_mtime_ns)
    if len(unsynced) >= 128:
        _datasync(unsynced)


def _put_in_place(dirs, plan, entry, hashed, sources):
    """Rename one staged temp file or link over its name (an empty folder standing there goes)."""
    head, tmp, name = entry
    parent = dirs.open(head)
    try:
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except IsADirectoryError:   # an empty folder (but for the host's bytecode) stands there
        _drop_cache_folder(parent, name)
        os.rmdir(name, dir_fd=parent)
        os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
    if name.endswith(".py"):
        # python trusts a cached .pyc while the source's size and whole-second mtime match,
        # which a same-size edit synced within the second would; the next start compiles it
        sources.setdefault(head, set()).add(name[:-3])
    if tmp in hashed:
        _seed(plan.seeds, dirs.open(head), name, (head + "/" if head else "") + name, hashed[tmp])


def _seed(seeds, parent, name, rel, written):
    """Record the hash of a file just written under the stat key it has now (a rename changes its
    ctime), so the scan after the apply need not read it again. Only when the file in place is still
    the one written (same inode, size and mtime); anything else is hashed by the scan as usual. (A
    same-size rewrite of the temp file with its mtime put back, between its write and this stat, is
    not seen: it would take a writer inside the apply's private 0600 temp file under the sync lock.)"""
    sha, ino, size, mtime = written
    try:
        st = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except OSError:
        return
    if (st.st_ino, st.st_size, st.st_mtime_ns) == (ino, size, mtime) and stat.S_ISREG(st.st_mode):
        seeds[rel] = [[st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino], sha]


def cmd_apply(code_dir, state_file, expected_sha, expected_len, expected_tree="-", force="0"):
    """Apply a sync payload from stdin, under the root's sync lock.

    The payload is checked whole (length, sha256, every tar member) before anything changes. With
    ``expected_tree`` the tree must still have that manifest digest (what the local side compared
    against); otherwise the answer is "stale" with the manifest, and the local side compares again.
    Deletions go first (a file that became a folder; room on a full disk), then every file is written
    to a temp name and renamed into place. A live run working in code refuses the changes unless
    ``force`` is "1" (then they are made and the run ids reported)."""
    # Once the whole payload is here the apply must finish even if the SSH link drops.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    _stamp("agent-ready")
    payload = sys.stdin.buffer.read()
    _stamp("payload-read")
    if len(payload) != int(expected_len) or hashlib.sha256(payload).hexdigest() != expected_sha:
        _fail(f"sync payload incomplete ({len(payload)} of {expected_len} bytes){_NOTHING_CHANGED}", Exit.INCOMPLETE)

    def apply(tar):
        plan = _Plan(tar)
        code_fd = _open_code(code_dir)
        try:
            _apply_plan(code_fd, code_dir, state_file, plan, expected_tree, force == "1")
        finally:
            os.close(code_fd)

    if not payload:
        _locked(lambda: apply(None))
        return
    import tarfile
    try:
        tar = tarfile.open(fileobj=io.BytesIO(payload), mode="r:*")  # noqa: SIM115 (closed by `with` below)
    except tarfile.TarError as exc:
        _fail(f"refusing sync payload: unreadable tar ({exc}){_NOTHING_CHANGED}", Exit.REFUSED_ENTRY)
    with tar:
        _locked(lambda: apply(tar))


def _apply_plan(code_fd, code_dir, state_file, plan, expected_tree, force):
    manifest = _scan_and_store(code_fd, state_file)
    if expected_tree != "-" and digest(manifest) != expected_tree:
        _out({"status": "stale", "manifest": manifest, "digest": digest(manifest)})
        return
    plan.check_against(manifest)
    if not plan.members and not plan.delete:
        _out({"status": "applied", "written": 0, "deleted": 0, "files": len(manifest),
              "digest": digest(manifest)})
        return
    busy = _live_runs_on_code(code_dir)
    if busy and not force:
        raise Refusal(Exit.BUSY, f"not changing {len(plan.members) + len(plan.delete)} file(s) in {_in_code()}: "
                          f"run(s) {', '.join(busy)} are running there and would pick up new code mid-run "
                          "(a module imported later, a script read again). Wait for them to end (`invoke "
                          f"logs {busy[0]} --follow`), stop them (`invoke kill {busy[0]}`), or sync anyway "
                          "with `invoke sync --force` (before a task, in one call: `invoke sync --force test-drafter`)"
                          + _NOTHING_CHANGED)
    try:
        deleted = _delete(code_fd, plan.delete)
        written = _write(code_fd, plan)
    except OSError as exc:
        raise Refusal(Exit.APPLY_FAILED, f"applying the sync in {_in_code()} failed: {_why(exc)}. Every file "
                          "there is either its old or its new version (no partial files; the deletions were "
                          "done first, to make room); free space or fix the cause, then sync again") from None
    manifest = _scan_and_store(code_fd, state_file, plan.seeds)
    answer = {"status": "applied", "written": written, "deleted": deleted, "files": len(manifest),
              "digest": digest(manifest)}
    if busy:
        answer["busy_runs"] = busy
    _out(answer)
