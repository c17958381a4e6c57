"""Code sync on the host, its reading half: the owner-marked <root>/code opened without following
links, the sync lock, the manifest (scan with a stat cache) and the checked plan of one change set.

One part of the host agent: draftops/onhost/__init__.py assembles the parts, in order, into the one
stdlib-only script the host runs (docs/protocol.md)."""
import errno
import fcntl
import hashlib
import json
import os
import stat
import time

from draftops.onhost.wire import (  # noqa: F401
    _CLOEXEC,
    _DIR_FLAGS,
    OWNER_MARK,
    SYNC_META,
    Exit,
    _atomic_write,
    _fail,
    _out,
    _stamp,
    cached_sha,
    digest,
)

# ---------------------------------------------------------------- sync
# Everything a sync touches lives under the real <root>/code: the folder is opened with O_NOFOLLOW
# and every path below it is reached component by component through directory file descriptors
# (O_NOFOLLOW again), so a symlink anywhere on the way (made by a job, a user or an attacker, before
# or during the sync) is refused instead of followed. ``code`` must carry the OWNER_MARK file that
# draftops writes when it creates the folder: a folder of someone else's files is refused rather than
# mirrored (a mirror deletes whatever is not in the project).
OWNER_TEXT = ("This folder is managed by draftops: `invoke sync` makes it mirror the project's synced "
              "paths, replacing and deleting files here. Keep your own files elsewhere.\n")
SYNC_LOCK = os.path.join("state", "sync.lock")
LOCK_WAIT_S = 600
PYCACHE = "__pycache__"   # the host python's bytecode cache: not synced, not compared (see _scan)
_NOTHING_CHANGED = "; nothing was changed"
# tar member types (tarfile.LNKTYPE ... FIFOTYPE, POSIX ustar values)
_TAR_KINDS = {b"1": "hard link", b"2": "symbolic link without a target", b"3": "character device",
              b"4": "block device", b"5": "folder", b"6": "FIFO"}


class Refusal(Exception):
    """A sync command cannot go on; ``code`` is its exit code, the message says why and what to do."""

    def __init__(self, code, message):
        Exception.__init__(self, message)
        self.code = code


def _why(exc):
    return exc.strerror or str(exc)


def _split(rel):
    head, _, name = rel.rpartition("/")
    return head, name


def _in_code(rel=""):
    return os.path.join(os.path.abspath("code"), rel) if rel else os.path.abspath("code")


def _canonical(rel, what):
    """Refuse a path that is not plainly relative and normalised (``..``, ``/x``, ``a//b``, ``./a``)."""
    parts = rel.split("/") if isinstance(rel, str) else [""]
    if any(part in ("", ".", "..") for part in parts) or "\0" in rel or rel == OWNER_MARK:
        raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync {what} {rel!r}: only plain relative paths inside "
                          f"{_in_code()} are accepted (no '..', no absolute path, not the {OWNER_MARK} "
                          f"marker){_NOTHING_CHANGED}")
    return rel


def _lock(timeout=LOCK_WAIT_S):
    """Hold the root's sync lock (released when the fd closes or the process ends): syncs take turns."""
    fd = os.open(SYNC_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | _CLOEXEC, 0o644)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() > deadline:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                raise Refusal(Exit.LOCK_TIMEOUT, f"another sync into {_in_code()} (process {holder}) has "
                                  f"held the lock {os.path.abspath(SYNC_LOCK)} for over {timeout} s; wait "
                                  "for it to finish, or stop that process if it is stuck, then sync again") from None
            time.sleep(0.05)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _mark(code_fd):
    try:
        fd = os.open(OWNER_MARK, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=code_fd)
    except FileExistsError:
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(OWNER_TEXT)


def _create_code(path):
    """Create ``path`` as draftops' own code folder, with its marker; an existing one is left alone."""
    try:
        os.mkdir(path, 0o755)
    except FileExistsError:
        return
    fd = os.open(path, _DIR_FLAGS)
    try:
        _mark(fd)
    finally:
        os.close(fd)


def _open_code(code_dir):
    """Directory fd of the real, draftops-owned ``code_dir`` (created when missing), or a refusal."""
    where = os.path.abspath(code_dir)
    try:
        fd = os.open(code_dir, _DIR_FLAGS)
    except FileNotFoundError:
        _create_code(code_dir)
        fd = os.open(code_dir, _DIR_FLAGS)
    except OSError as exc:
        if os.path.islink(code_dir):
            raise Refusal(Exit.REFUSED_CODE, f"refusing to sync into {where}: it is a symbolic link (to "
                              f"{os.readlink(code_dir)}), and draftops writes and deletes only inside a real "
                              f"folder it created itself. Remove the link (`rm {where}`; its target is not "
                              "touched) or set `root:` in hosts.yaml to another folder, then sync again") from None
        raise Refusal(Exit.REFUSED_CODE, f"refusing to sync into {where}: {_why(exc)}. draftops needs a folder "
                          "of its own there; move that away or set `root:` in hosts.yaml to another folder, "
                          "then sync again") from None
    try:
        if stat.S_ISREG(os.stat(OWNER_MARK, dir_fd=fd, follow_symlinks=False).st_mode):
            return fd
    except FileNotFoundError:
        pass
    if not os.listdir(fd):      # empty (e.g. made by an earlier draftops): nothing to lose, adopt it
        _mark(fd)
        return fd
    os.close(fd)
    raise Refusal(Exit.REFUSED_CODE, f"refusing to sync into {where}: the folder already holds files that "
                      f"draftops did not put there (it has no {OWNER_MARK} marker, which draftops writes "
                      "when it creates the folder), and a sync deletes whatever in it is not in your project. "
                      "Move those files elsewhere or remove the folder (also one left by a draftops version "
                      "older than this check), or set `root:` in hosts.yaml to a folder of draftops' own, "
                      "then sync again")


def _sha256_at(dir_fd, name):
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, dir_fd=dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "it stopped being a regular file while it was read")
        digest = hashlib.sha256()
        for block in iter(lambda: os.read(fd, 1 << 20), b""):
            digest.update(block)
        return digest.hexdigest()
    finally:
        os.close(fd)


def _listing(fd):
    """The sorted names in folder ``fd``, without the host python's bytecode cache folder."""
    with os.scandir(fd) as entries:
        return sorted(e.name for e in entries if e.name != PYCACHE or not e.is_dir(follow_symlinks=False))




def _scan(code_fd, cache):
    """Manifest of the tree under ``code_fd``: {rel: [kind, sha_or_target, mode]}, links not followed.

    Kinds: "f" file, "l" symlink, "x" anything else (FIFO, socket, device: never equal to a local
    entry, so the sync replaces or deletes it). Hashes are reused while (size, mtime, ctime, inode)
    stay the same. Nothing is deleted here, and an unreadable entry stops the sync: it must never
    read as "missing". ``__pycache__`` folders are left out: the host's python writes them whenever a
    tool runs from the code folder, and counting them made every next sync find the tree changed
    and delete them (a second round trip, and every tool compiled again on its next start)."""
    manifest: dict = {}
    new_cache: dict = {}
    stack: list = [(os.dup(code_fd), "", None)]   # (dir fd, path prefix, names iterator once listed)
    try:
        while stack:
            fd, prefix, names = stack[-1]
            if names is None:
                try:
                    names = iter(_listing(fd))
                except OSError as exc:
                    raise _unreadable(prefix.rstrip("/"), exc) from None
                stack[-1] = (fd, prefix, names)
            name = next(names, None)
            if name is None:
                os.close(stack.pop()[0])
                continue
            if not prefix and name == OWNER_MARK:
                continue
            rel = prefix + name
            try:
                below = _scan_entry(fd, name, rel, cache, manifest, new_cache)
            except FileNotFoundError:
                continue            # removed while we looked (by a job: syncs hold the lock)
            except OSError as exc:
                raise _unreadable(rel, exc) from None
            if below is not None:
                stack.append((below, rel + "/", None))
    finally:
        for fd, _prefix, _names in stack:
            os.close(fd)
    return manifest, new_cache


def _scan_entry(fd, name, rel, cache, manifest, new_cache):
    """Record one entry of a scanned folder; a folder is opened (no link followed) and its fd returned."""
    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    if stat.S_ISDIR(st.st_mode):
        return os.open(name, _DIR_FLAGS, dir_fd=fd)
    if stat.S_ISLNK(st.st_mode):
        manifest[rel] = ["l", os.readlink(name, dir_fd=fd), 0]
    elif stat.S_ISREG(st.st_mode):
        key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        sha = cached_sha(cache.get(rel), key) or _sha256_at(fd, name)
        new_cache[rel] = [key, sha]
        manifest[rel] = ["f", sha, st.st_mode & 0o777]
    else:
        manifest[rel] = ["x", oct(stat.S_IFMT(st.st_mode)), 0]
    return None


def _unreadable(rel, exc):
    return Refusal(Exit.SCAN_FAILED, f"cannot read {_in_code(rel)}: {_why(exc)}. draftops must see everything "
                       f"in {_in_code()} to mirror it safely, so nothing was changed; make it readable for "
                       f"this user (e.g. `chmod -R u+rwX {_in_code()}`) or remove it, then sync again")


def _load_cache(state_file):
    try:
        with open(state_file) as fh:
            cache = json.load(fh)
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}




def _scan_and_store(code_fd, state_file, seeds=None):
    """Manifest of the code tree, keeping the stat cache in ``state_file`` up to date. ``seeds``: hashes
    of files this apply has just written, under their stat keys (see _seed)."""
    old = _load_cache(state_file)
    manifest, cache = _scan(code_fd, {**old, **seeds} if seeds else old)
    if cache != old:
        try:
            _atomic_write(state_file, json.dumps(cache).encode())
        except OSError:
            pass        # only a cache (a full disk must not stop the sync that frees space)
    return manifest


def _locked(step):
    """Run a sync step under the root's sync lock, on the opened code folder; a refusal becomes its
    message and exit code."""
    try:
        lock = _lock()
        try:
            step()
        finally:
            os.close(lock)
    except Refusal as exc:
        _fail(str(exc), exc.code)
    except OSError as exc:
        _fail(f"sync into {_in_code()} failed: {exc}. Fix the cause (permissions or space in "
              f"{os.getcwd()}), then sync again", Exit.APPLY_FAILED)


def cmd_manifest(code_dir, state_file):
    _stamp("agent-ready")

    def scan():
        code_fd = _open_code(code_dir)
        try:
            manifest = _scan_and_store(code_fd, state_file)
        finally:
            os.close(code_fd)
        _out({"manifest": manifest, "digest": digest(manifest)})
    _locked(scan)


class _Plan:
    """A checked sync payload: the deletions, then the files and links to put in place.

    Every member is checked before anything changes: plain relative names only, plain files and
    symlinks only (no hard links, devices, FIFOs, folders), each once, none written through another
    (a link, then "link/file"), none both sent and deleted."""

    def __init__(self, tar):
        self.tar, self.delete, self.members = tar, [], []
        self.seeds: dict = {}                # rel -> [stat key, sha256] of the files written (see _seed)
        if tar is None:
            return
        members, meta = self._read_meta(tar)
        deletes = meta.get("delete") if isinstance(meta, dict) else None
        if not isinstance(deletes, list):
            raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync payload: {SYNC_META} holds no delete list"
                              + _NOTHING_CHANGED)
        self.delete = sorted({_canonical(rel, "deletion") for rel in deletes})
        sent: set = set()
        for member in members[1:]:
            rel = self._checked_member(member, sent)
            sent.add(rel)
            self.members.append(member)
        for rel in sent:
            parent = _first_parent_in(rel, sent)
            if parent:
                raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync entry {rel!r}: {parent!r} is sent as a file "
                                  f"or link too, and nothing is written through one{_NOTHING_CHANGED}")
        both = sent.intersection(self.delete)
        if both:
            raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync entry {min(both)!r}: it is both sent and "
                              f"deleted{_NOTHING_CHANGED}")

    @staticmethod
    def _read_meta(tar):
        """The payload's members and its leading SYNC_META document."""
        import tarfile
        try:
            members = tar.getmembers()
            if not members or members[0].name != SYNC_META or not members[0].isfile():
                raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync payload: it does not start with {SYNC_META}"
                                  + _NOTHING_CHANGED)
            return members, json.load(tar.extractfile(members[0]))
        except (tarfile.TarError, ValueError, OSError) as exc:
            raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync payload: unreadable tar ({exc})"
                              + _NOTHING_CHANGED) from None

    @staticmethod
    def _checked_member(member, sent):
        """The member's checked relative name: a plain file or symlink, not sent before."""
        import tarfile
        rel = _canonical(member.name, "entry")
        plain_file = member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not member.issparse()
        if not (plain_file or (member.issym() and member.linkname and "\0" not in member.linkname)):
            kind = _TAR_KINDS.get(member.type, f"tar type {member.type!r}")
            raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync entry {rel!r}: it is a {kind}; only plain "
                              "files and symbolic links are synced (no hard links, devices, FIFOs or "
                              f"folders){_NOTHING_CHANGED}")
        if rel in sent:
            raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync entry {rel!r}: it appears twice"
                              + _NOTHING_CHANGED)
        return rel

    def check_against(self, manifest):
        """Refuse before changing anything if a path would go through a host file or link that stays
        (through any at all, for a deletion), or a file would replace a folder holding files that stay."""
        doomed = set(self.delete)
        sent = {member.name for member in self.members}
        staying = set(manifest) - doomed
        for rel in sorted(sent) + self.delete:
            parent = _first_parent_in(rel, manifest if rel in doomed else staying)
            if parent:
                what = {"l": "a symbolic link", "f": "a file"}.get(manifest[parent][0], "not a folder")
                raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync entry {rel!r}: {_in_code(parent)} on the "
                                  f"host is {what}, and nothing is written or deleted through it"
                                  + _NOTHING_CHANGED)
        for rel in manifest:
            folder = _first_parent_in(rel, sent) if rel not in doomed else None
            if folder:
                raise Refusal(Exit.REFUSED_ENTRY, f"refusing sync entry {folder!r}: on the host it is a folder "
                                  f"holding {rel!r}, which this sync does not delete{_NOTHING_CHANGED}")


def _first_parent_in(rel, names):
    """The shortest proper parent path of ``rel`` that is in ``names`` (or None)."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent in names:
            return parent
    return None






























