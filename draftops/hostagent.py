"""The host side of draftops' plumbing: a stdlib-only script copied to ``<root>/state/`` on first use.

It runs under any python3 on the host (no ml-env needed) and does the work that must happen next to
the files: resolve and check ``root``, list and apply code syncs atomically, start detached jobs and
record their state, follow logs, pack run folders. Every subcommand prints one JSON object (or a raw
stream for ``follow``/``pack``), so the local side parses nothing ad hoc.
"""
import errno
import fcntl
import hashlib
import io
import json
import os
import signal
import stat
import subprocess
import sys
import tarfile
import tempfile
import time

SYNC_META = ".draftops-sync.json"
TMP_MARK = ".draftops-tmp-"
EVENT_PREFIX = "@@draftops "
_AGENT_PATH = None   # where this script is installed on the host (set by prepare or main)


def _out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _fail(message, code=2):
    sys.stderr.write(message + "\n")
    sys.exit(code)


def _atomic_write(path, data, mode=0o644):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=os.path.basename(path) + TMP_MARK)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- root
def cmd_prepare(root, agent_name, source=None):
    """Expand ``root``, refuse / and $HOME, create code/runs/state, prove it is writable, and
    install this script's ``source`` as ``state/<agent_name>`` when it is not there yet."""
    home = os.path.realpath(os.path.expanduser("~"))
    resolved = os.path.realpath(os.path.expanduser(os.path.expandvars(root)))
    if resolved in ("/", home):
        _fail("root %r resolves to %s, which is %s; draftops deletes inside <root>/code during sync, so it "
              "needs a folder of its own, e.g. ~/draftops" % (root, resolved,
                                                               "/" if resolved == "/" else "the home directory"), 3)
    try:
        for sub in ("runs", "state"):
            os.makedirs(os.path.join(resolved, sub), exist_ok=True)
        if not os.path.lexists(os.path.join(resolved, "code")):     # an existing one is judged by sync
            _create_code(os.path.join(resolved, "code"))
        fd, probe = tempfile.mkstemp(dir=os.path.join(resolved, "state"), prefix=".probe")
        os.close(fd)
        os.unlink(probe)
        agent = os.path.join(resolved, "state", agent_name)
        global _AGENT_PATH
        _AGENT_PATH = agent
        if source and not os.path.exists(agent):
            _atomic_write(agent, source.encode())
    except OSError as exc:
        _fail("root %r (%s) is not writable: %s" % (root, resolved, exc.strerror or exc), 4)
    _out({"root": resolved, "home": home, "python": sys.executable,
          "python_version": "%d.%d.%d" % sys.version_info[:3], "platform": sys.platform})
    return resolved


def boot(source, argv):
    """First call of a session (run inline with ``python3 -c``): prepare, then run ``argv[2:]`` if given.

    Folding the root check and agent install into the first real command saves an SSH exec, which is
    most of the cost of a no-op sync."""
    root = cmd_prepare(argv[0], argv[1], source)
    if len(argv) > 2:
        main([root] + list(argv[2:]))


# ---------------------------------------------------------------- sync
# Everything a sync touches lives under the real <root>/code: the folder is opened with O_NOFOLLOW
# and every path below it is reached component by component through directory file descriptors
# (O_NOFOLLOW again), so a symlink anywhere on the way (made by a job, a user or an attacker, before
# or during the sync) is refused instead of followed. ``code`` must carry the OWNER_MARK file that
# draftops writes when it creates the folder: a folder of someone else's files is refused rather than
# mirrored (a mirror deletes whatever is not in the project).
OWNER_MARK = ".draftops-owned"
OWNER_TEXT = ("This folder is managed by draftops: `invoke sync` makes it mirror the project's synced "
              "paths, replacing and deleting files here. Keep your own files elsewhere.\n")
SYNC_LOCK = os.path.join("state", "sync.lock")
LOCK_WAIT_S = 600
CODE_TMP = ".draftops-tmp-"   # + pid-random-index: the names of one apply's own temp files
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
# exit codes of the sync commands (the local side turns them into one-paragraph SyncErrors)
REFUSED_ENTRY, INCOMPLETE, REFUSED_CODE, SCAN_FAILED, APPLY_FAILED, BUSY, LOCK_TIMEOUT = 5, 6, 20, 21, 22, 23, 24
_NOTHING_CHANGED = "; nothing was changed"
_TAR_KINDS = {tarfile.LNKTYPE: "hard link", tarfile.SYMTYPE: "symbolic link without a target",
              tarfile.CHRTYPE: "character device", tarfile.BLKTYPE: "block device", tarfile.DIRTYPE: "folder",
              tarfile.FIFOTYPE: "FIFO"}


class SyncRefused(Exception):
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
        raise SyncRefused(REFUSED_ENTRY, f"refusing sync {what} {rel!r}: only plain relative paths inside "
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
                raise SyncRefused(LOCK_TIMEOUT, f"another sync into {_in_code()} (process {holder}) has "
                                  f"held the lock {os.path.abspath(SYNC_LOCK)} for over {timeout} s; wait "
                                  "for it to finish, or stop that process if it is stuck, then sync again")
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
            raise SyncRefused(REFUSED_CODE, f"refusing to sync into {where}: it is a symbolic link (to "
                              f"{os.readlink(code_dir)}), and draftops writes and deletes only inside a real "
                              f"folder it created itself. Remove the link (`rm {where}`; its target is not "
                              "touched) or set `root:` in hosts.yaml to another folder, then sync again")
        raise SyncRefused(REFUSED_CODE, f"refusing to sync into {where}: {_why(exc)}. draftops needs a folder "
                          "of its own there; move that away or set `root:` in hosts.yaml to another folder, "
                          "then sync again")
    try:
        if stat.S_ISREG(os.stat(OWNER_MARK, dir_fd=fd, follow_symlinks=False).st_mode):
            return fd
    except FileNotFoundError:
        pass
    if not os.listdir(fd):      # empty (e.g. made by an earlier draftops): nothing to lose, adopt it
        _mark(fd)
        return fd
    os.close(fd)
    raise SyncRefused(REFUSED_CODE, f"refusing to sync into {where}: the folder already holds files that "
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


def _scan(code_fd, cache):
    """Manifest of the tree under ``code_fd``: {rel: [kind, sha_or_target, mode]}, links not followed.

    Kinds: "f" file, "l" symlink, "x" anything else (FIFO, socket, device: never equal to a local
    entry, so the sync replaces or deletes it). Hashes are reused while (size, mtime, ctime, inode)
    stay the same. Nothing is deleted here, and an unreadable entry stops the sync: it must never
    read as "missing"."""
    manifest, new_cache = {}, {}
    stack = [(os.dup(code_fd), "", None)]
    try:
        while stack:
            fd, prefix, names = stack[-1]
            if names is None:
                try:
                    names = iter(sorted(os.listdir(fd)))
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
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    stack.append((os.open(name, _DIR_FLAGS, dir_fd=fd), rel + "/", None))
                elif stat.S_ISLNK(st.st_mode):
                    manifest[rel] = ["l", os.readlink(name, dir_fd=fd), 0]
                elif stat.S_ISREG(st.st_mode):
                    key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
                    old = cache.get(rel)
                    sha = old[1] if old and old[0] == key else _sha256_at(fd, name)
                    new_cache[rel] = [key, sha]
                    manifest[rel] = ["f", sha, st.st_mode & 0o777]
                else:
                    manifest[rel] = ["x", oct(stat.S_IFMT(st.st_mode)), 0]
            except FileNotFoundError:
                continue            # removed while we looked (by a job: syncs hold the lock)
            except OSError as exc:
                raise _unreadable(rel, exc) from None
    finally:
        for fd, _prefix, _names in stack:
            os.close(fd)
    return manifest, new_cache


def _unreadable(rel, exc):
    return SyncRefused(SCAN_FAILED, f"cannot read {_in_code(rel)}: {_why(exc)}. draftops must see everything "
                       f"in {_in_code()} to mirror it safely, so nothing was changed; make it readable for "
                       f"this user (e.g. `chmod -R u+rwX {_in_code()}`) or remove it, then sync again")


def _load_cache(state_file):
    try:
        with open(state_file) as fh:
            cache = json.load(fh)
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def digest(manifest):
    """Canonical hash of a manifest; the local side computes the same one."""
    return hashlib.sha256(json.dumps(sorted(manifest.items()), separators=(",", ":")).encode()).hexdigest()


def _scan_and_store(code_fd, state_file):
    """Manifest of the code tree, keeping the stat cache in ``state_file`` up to date."""
    old = _load_cache(state_file)
    manifest, cache = _scan(code_fd, old)
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
    except SyncRefused as exc:
        _fail(str(exc), exc.code)
    except OSError as exc:
        _fail(f"sync into {_in_code()} failed: {exc}. Fix the cause (permissions or space in "
              f"{os.getcwd()}), then sync again", APPLY_FAILED)


def cmd_manifest(code_dir, state_file):
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
        if tar is None:
            return
        try:
            members = tar.getmembers()
            if not members or members[0].name != SYNC_META or not members[0].isfile():
                raise SyncRefused(REFUSED_ENTRY, f"refusing sync payload: it does not start with {SYNC_META}"
                                  + _NOTHING_CHANGED)
            meta = json.load(tar.extractfile(members[0]))
        except (tarfile.TarError, ValueError, OSError) as exc:
            raise SyncRefused(REFUSED_ENTRY, f"refusing sync payload: unreadable tar ({exc})"
                              + _NOTHING_CHANGED) from None
        deletes = meta.get("delete") if isinstance(meta, dict) else None
        if not isinstance(deletes, list):
            raise SyncRefused(REFUSED_ENTRY, f"refusing sync payload: {SYNC_META} holds no delete list"
                              + _NOTHING_CHANGED)
        self.delete = sorted({_canonical(rel, "deletion") for rel in deletes})
        sent = set()
        for member in members[1:]:
            rel = _canonical(member.name, "entry")
            plain_file = member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not member.issparse()
            if not (plain_file or (member.issym() and member.linkname and "\0" not in member.linkname)):
                kind = _TAR_KINDS.get(member.type, f"tar type {member.type!r}")
                raise SyncRefused(REFUSED_ENTRY, f"refusing sync entry {rel!r}: it is a {kind}; only plain "
                                  "files and symbolic links are synced (no hard links, devices, FIFOs or "
                                  f"folders){_NOTHING_CHANGED}")
            if rel in sent:
                raise SyncRefused(REFUSED_ENTRY, f"refusing sync entry {rel!r}: it appears twice"
                                  + _NOTHING_CHANGED)
            sent.add(rel)
            self.members.append(member)
        for rel in sent:
            parent = _first_parent_in(rel, sent)
            if parent:
                raise SyncRefused(REFUSED_ENTRY, f"refusing sync entry {rel!r}: {parent!r} is sent as a file "
                                  f"or link too, and nothing is written through one{_NOTHING_CHANGED}")
        both = sent.intersection(self.delete)
        if both:
            raise SyncRefused(REFUSED_ENTRY, f"refusing sync entry {min(both)!r}: it is both sent and "
                              f"deleted{_NOTHING_CHANGED}")

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
                raise SyncRefused(REFUSED_ENTRY, f"refusing sync entry {rel!r}: {_in_code(parent)} on the "
                                  f"host is {what}, and nothing is written or deleted through it"
                                  + _NOTHING_CHANGED)
        for rel in manifest:
            folder = _first_parent_in(rel, sent) if rel not in doomed else None
            if folder:
                raise SyncRefused(REFUSED_ENTRY, f"refusing sync entry {folder!r}: on the host it is a folder "
                                  f"holding {rel!r}, which this sync does not delete{_NOTHING_CHANGED}")


def _first_parent_in(rel, names):
    """The shortest proper parent path of ``rel`` that is in ``names`` (or None)."""
    parts = rel.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if parent in names:
            return parent
    return None


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
                raise SyncRefused(REFUSED_ENTRY, f"refusing to write or delete under {_in_code(rel_dir)}: it "
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
            except (OSError, SyncRefused):
                pass
        self.close()


def _delete(code_fd, rels):
    """Unlink the listed files and links (never a folder, never through a link); prune emptied folders."""
    dirs, deleted, emptied = _Dirs(code_fd), 0, set()
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
            deleted += 1
            emptied.add(head)
        for head in sorted(emptied, key=lambda d: -d.count("/")):
            while head:
                dirs.close()
                head, name = _split(head)
                try:
                    os.rmdir(name, dir_fd=dirs.open(head))
                except (OSError, SyncRefused):
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


def _write_fd(fd, source):
    for block in iter(lambda: source.read(1 << 20), b""):
        view = memoryview(block)
        while view:
            view = view[os.write(fd, view):]


def _write(code_fd, plan):
    """Write every file and link to a temp name of this apply, flush them, then rename each into place.

    A failure (a full disk) removes this apply's temp files and the folders it created, so the tree
    holds only whole files. Nothing else is removed: other names with ``.draftops-tmp-`` in them
    belong to someone else (or to the project) and are synced like any other file."""
    dirs, staged, unsynced = _Dirs(code_fd), [], []
    token = f"{CODE_TMP}{os.getpid()}-{os.urandom(4).hex()}-"
    try:
        for i, member in enumerate(plan.members):
            head, name = _split(member.name)
            parent = dirs.open(head, create=True)
            tmp = token + str(i)
            if member.issym():
                os.symlink(member.linkname, tmp, dir_fd=parent)
                staged.append((head, tmp, name))
                continue
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600,
                         dir_fd=parent)
            unsynced.append(fd)
            staged.append((head, tmp, name))
            _write_fd(fd, plan.tar.extractfile(member))
            os.fchmod(fd, member.mode & 0o777)
            if len(unsynced) >= 128:
                _datasync(unsynced)
        _datasync(unsynced)
        while staged:
            head, tmp, name = staged[0]
            parent = dirs.open(head)
            try:
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            except IsADirectoryError:   # an empty folder stands where the file goes
                os.rmdir(name, dir_fd=parent)
                os.replace(tmp, name, src_dir_fd=parent, dst_dir_fd=parent)
            staged.pop(0)
        return len(plan.members)
    except BaseException:
        for fd in unsynced:
            os.close(fd)
        for head, tmp, _name in staged:
            try:
                os.unlink(tmp, dir_fd=dirs.open(head))
            except (OSError, SyncRefused):
                pass
        dirs.remove_created()
        raise
    finally:
        dirs.close()


def _live_runs_on_code(code_dir):
    """Ids of live runs whose working folder is in ``code_dir``: a sync would change code under them
    (a module imported later, a script read again) mid-run."""
    code_real = os.path.realpath(code_dir)
    try:
        names = sorted(os.listdir("runs"))
    except OSError:
        return []
    busy = []
    for name in names:
        run_dir = os.path.join("runs", name)
        job = _read_json(os.path.join(run_dir, "job.json"))
        cwd = job.get("cwd") if isinstance(job, dict) else None
        if not isinstance(cwd, str) or not cwd:
            continue
        cwd = os.path.realpath(cwd)
        if cwd != code_real and not cwd.startswith(code_real + "/"):
            continue
        try:
            if _status(run_dir).get("state") in ("running", "starting"):
                busy.append(name)
        except OSError:
            continue            # the run folder went away while we looked
    return busy


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
    payload = sys.stdin.buffer.read()
    if len(payload) != int(expected_len) or hashlib.sha256(payload).hexdigest() != expected_sha:
        _fail(f"sync payload incomplete ({len(payload)} of {expected_len} bytes){_NOTHING_CHANGED}", INCOMPLETE)

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
    try:
        tar = tarfile.open(fileobj=io.BytesIO(payload), mode="r:*")  # noqa: SIM115 (closed by `with` below)
    except tarfile.TarError as exc:
        _fail(f"refusing sync payload: unreadable tar ({exc}){_NOTHING_CHANGED}", REFUSED_ENTRY)
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
        raise SyncRefused(BUSY, f"not changing {len(plan.members) + len(plan.delete)} file(s) in {_in_code()}: "
                          f"run(s) {', '.join(busy)} are running there and would pick up new code mid-run "
                          "(a module imported later, a script read again). Wait for them to end (`invoke "
                          f"logs {busy[0]} --follow`), stop them (`invoke kill {busy[0]}`), or sync anyway "
                          f"with `invoke sync --force`{_NOTHING_CHANGED}")
    try:
        deleted = _delete(code_fd, plan.delete)
        written = _write(code_fd, plan)
    except OSError as exc:
        raise SyncRefused(APPLY_FAILED, f"applying the sync in {_in_code()} failed: {_why(exc)}. Every file "
                          "there is either its old or its new version (no partial files; the deletions were "
                          "done first, to make room); free space or fix the cause, then sync again") from None
    manifest = _scan_and_store(code_fd, state_file)
    answer = {"status": "applied", "written": written, "deleted": deleted, "files": len(manifest),
              "digest": digest(manifest)}
    if busy:
        answer["busy_runs"] = busy
    _out(answer)


# ---------------------------------------------------------------- jobs
def _read_json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _alive(pid, run_id):
    """True when ``pid`` is a live (non-zombie) process of this run; guards against pid reuse."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open("/proc/%d/stat" % pid) as fh:
            if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                return False
        with open("/proc/%d/cmdline" % pid, "rb") as fh:
            return run_id.encode() in fh.read()
    except OSError:
        ps = subprocess.run(["ps", "-o", "stat=,args=", "-p", str(pid)], capture_output=True, text=True)
        line = ps.stdout.strip()
        return bool(line) and not line.startswith("Z") and run_id in line


def _status(run_dir):
    run_id = os.path.basename(run_dir.rstrip("/"))
    run_dir = os.path.abspath(run_dir)
    job = _read_json(os.path.join(run_dir, "job.json")) or {}
    status = _read_json(os.path.join(run_dir, "status.json")) or {}
    row = {"id": run_id, "name": job.get("name"), "command": job.get("command"),
           "created": job.get("created"), **status}
    if status.get("state") in (None, "starting", "running"):
        pid = status.get("pid")
        if pid and _alive(int(pid), run_id):
            row["state"] = "running"
        elif not pid and time.time() - os.path.getmtime(run_dir) < 30:
            row["state"] = "starting"
        else:
            row["state"] = "dead"
    return row


def cmd_start(run_dir):
    """Create ``run_dir`` from the job spec on stdin, start its runner in its own session with stdio
    detached, and print the runner's pid. job.json may hold secrets (env): it is 0600."""
    run_dir = os.path.abspath(run_dir)
    run_id = os.path.basename(run_dir.rstrip("/"))
    spec = json.loads(sys.stdin.read())
    os.makedirs(run_dir, mode=0o700)
    _atomic_write(os.path.join(run_dir, "job.json"), json.dumps(spec).encode(), 0o600)
    _atomic_write(os.path.join(run_dir, "command"), (spec["command"] + "\n").encode())
    log = open(os.path.join(run_dir, "log"), "ab")
    proc = subprocess.Popen([sys.executable, _AGENT_PATH, os.getcwd(), "runner", run_dir, run_id],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True, close_fds=True)
    _out({"pid": proc.pid})


def cmd_runner(run_dir, run_id):
    """Run the job, then record its exit code; survives the SSH link (own session, no tty)."""
    run_dir = os.path.abspath(run_dir)
    job = _read_json(os.path.join(run_dir, "job.json"))
    status_path = os.path.join(run_dir, "status.json")
    started = _now()
    base = {"pid": os.getpid(), "started": started}
    _atomic_write(os.path.join(run_dir, "pid"), ("%d\n" % os.getpid()).encode())
    _atomic_write(status_path, json.dumps(dict(base, state="running")).encode())
    env = dict(os.environ, **job.get("env", {}), DRAFTOPS_RUN_ID=run_id, DRAFTOPS_RUN_DIR=run_dir,
               PYTHONUNBUFFERED="1")
    cwd = os.path.abspath(job.get("cwd") or run_dir)     # relative cwd: relative to root
    child = subprocess.Popen(["sh", "-c", job["command"]], cwd=cwd, env=env,
                             stdin=subprocess.DEVNULL)
    got = {}

    def forward(signum, _frame):
        got["signal"] = signum
        try:
            child.send_signal(signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    code = child.wait()
    state = "killed" if got else ("succeeded" if code == 0 else "failed")
    final = dict(base, state=state, exit_code=code, ended=_now())
    if got:
        final["signal"] = got["signal"]
    sys.stdout.flush()
    _atomic_write(status_path, json.dumps(final).encode())


def cmd_status(run_dir):
    if not os.path.isdir(run_dir):
        _fail("no run folder %s" % run_dir, 7)
    _out(_status(run_dir))


def cmd_runs(runs_dir):
    rows = []
    if os.path.isdir(runs_dir):
        for name in sorted(os.listdir(runs_dir)):
            full = os.path.join(runs_dir, name)
            if os.path.isdir(full):
                rows.append(_status(full))
    _out({"runs": rows})


def cmd_kill(run_dir, grace):
    row = _status(run_dir)
    if row["state"] != "running":
        _out(row)
        return
    pgid = int(row["pid"])
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.time() + float(grace)
    while time.time() < deadline and _alive(pgid, row["id"]):
        time.sleep(0.1)
    if _alive(pgid, row["id"]):
        os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.2)
    row = _status(run_dir)
    if row["state"] == "dead":      # runner was SIGKILLed before it could write its status
        final = dict(_read_json(os.path.join(run_dir, "status.json")) or {}, state="killed", ended=_now())
        _atomic_write(os.path.join(run_dir, "status.json"), json.dumps(final).encode())
        row = _status(run_dir)
    _out(row)


def cmd_follow(run_dir, offset):
    """Copy the log from ``offset`` to stdout as it grows; end with a job-end event."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    path = os.path.join(run_dir, "log")
    pos = int(offset)
    out = sys.stdout.buffer
    while True:
        row = _status(run_dir)
        try:
            with open(path, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
        except OSError:
            chunk = b""
        if chunk:
            out.write(chunk)
            out.flush()
            pos += len(chunk)
        if row["state"] not in ("running", "starting") and not chunk:
            out.write((EVENT_PREFIX + json.dumps(dict(row, event="job-end", offset=pos)) + "\n").encode())
            out.flush()
            return
        if not chunk:
            time.sleep(0.2)


def cmd_pack(path):
    """Write a tar of ``path`` (a run folder) to stdout, for `invoke pull`."""
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|gz") as tar:
        tar.add(path, arcname=".")


COMMANDS = {"prepare": cmd_prepare, "manifest": cmd_manifest, "apply": cmd_apply, "start": cmd_start,
            "runner": cmd_runner, "status": cmd_status, "runs": cmd_runs, "kill": cmd_kill,
            "follow": cmd_follow, "pack": cmd_pack}

def main(argv):
    """``agent.py ROOT COMMAND ARGS...``: paths in ARGS are relative to ROOT."""
    global _AGENT_PATH
    if _AGENT_PATH is None:
        _AGENT_PATH = os.path.abspath(__file__)
    os.chdir(argv[0])
    COMMANDS[argv[1]](*argv[2:])


if __name__ == "__main__":
    main(sys.argv[1:])
