"""The host side of draftops' plumbing: a stdlib-only script copied to ``<root>/state/`` on first use.

It runs under any python3 on the host (no ml-env needed) and does the work that must happen next to
the files: resolve and check ``root``, list and apply code syncs atomically, start detached jobs and
record their state, follow logs, pack run folders. The local side talks to it only through
``draftops.agent.AgentClient``.

The protocol (commands, arguments, payloads, reply framing, exit codes, version) is written down once,
in docs/protocol.md; the names it uses are defined here (``Exit``, ``PROTOCOL_VERSION``, the
markers) because this file must run alone on the host, and the local side imports them from here.
"""
import enum
import errno
import fcntl
import hashlib
import io
import json
import os
import signal
import stat
import sys
import time

# subprocess, tarfile and tempfile are imported where used: together they are ~20 ms of every agent
# start, and most commands (status, runs, manifest, a no-op apply) need none of them

SYNC_META = ".draftops-sync.json"
TMP_MARK = ".draftops-tmp-"
EVENT_PREFIX = "@@draftops "
FRAME_ENV = "DRAFTOPS_FRAME"          # the nonce of this call's reply marker (chosen by the local side)
FRAME_PREFIX = "@@draftops-reply "    # stdout: the reply follows this marker line
ERROR_PREFIX = "@@draftops-error "    # stderr: the error message follows this marker line
PROTOCOL_ENV = "DRAFTOPS_PROTOCOL"    # the protocol version the local side speaks
PROTOCOL_VERSION = 1                  # bump on any change a local side of another version would misread
_AGENT_PATH = None   # where this script is installed on the host (set by prepare or main)


class Exit(enum.IntEnum):
    """The agent's exit codes (docs/protocol.md § Exit codes); the local side maps each to one error."""

    OK = 0
    CRASHED = 1            # an uncaught exception: Python's traceback on stderr (a bug in the agent)
    USAGE = 2              # unknown command or wrong arguments (local side and agent disagree)
    ROOT_REFUSED = 3       # `root` resolves to / or $HOME
    ROOT_UNWRITABLE = 4    # `root` cannot be created or written
    REFUSED_ENTRY = 5      # a sync payload entry or deletion is refused; nothing was changed
    INCOMPLETE = 6         # the sync payload's length or sha256 is wrong; nothing was changed
    NO_RUN = 7             # no such run folder
    UNSAFE_RUN = 8         # the run folder cannot be opened without following a link
    PROTOCOL_MISMATCH = 9  # the caller speaks another PROTOCOL_VERSION; nothing was done
    REFUSED_CODE = 20      # <root>/code is a link, unreadable or holds files draftops did not put there
    SCAN_FAILED = 21       # something under <root>/code cannot be read
    APPLY_FAILED = 22      # writing the sync failed (a full disk); every file is old or new, none partial
    BUSY = 23              # a live run works in <root>/code and the sync was not forced
    LOCK_TIMEOUT = 24      # another sync held the lock too long
    NO_PYTHON = 127        # not the agent's: the shell found no interpreter to run it with


def _marker(prefix):
    return "\n{}{}\n".format(prefix, os.environ.get(FRAME_ENV, "-")).encode()


def _out(obj):
    """Print one framed JSON reply."""
    sys.stdout.flush()
    sys.stdout.buffer.write(_marker(FRAME_PREFIX) + json.dumps(obj).encode() + b"\n")
    sys.stdout.buffer.flush()


def _raw_start(header):
    """Start a framed raw stream: the marker, one JSON header line, then the caller writes bytes."""
    _out(header)


def _fail(message, code):
    sys.stderr.flush()
    sys.stderr.buffer.write(_marker(ERROR_PREFIX) + message.encode("utf-8", "replace") + b"\n")
    sys.stderr.buffer.flush()
    sys.exit(code)


def _mkstemp(folder, prefix):
    """``tempfile.mkstemp`` (a new 0600 file, never through a link) without importing tempfile."""
    while True:
        path = os.path.join(folder, prefix + os.urandom(6).hex())
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _CLOEXEC, 0o600), path
        except FileExistsError:
            continue


def _atomic_write(path, data, mode=0o644):
    fd, tmp = _mkstemp(os.path.dirname(path), os.path.basename(path) + TMP_MARK)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _write_status(path, data):
    """A run's status.json, atomically; on a full disk, where the temp copy has no room, rewritten in
    place instead (the running status already holds a block, and the new one fits in it), so a job that
    filled the disk is recorded with its exit and outcome, not left to look `dead`. False if neither
    worked (the caller goes on: a later write may find room)."""
    try:
        _atomic_write(path, data)
        return True
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
    try:
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, data)
        os.ftruncate(fd, len(data))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _stamp(name, when=None):
    """With ``DRAFTOPS_TIMING=1`` (set by the local side for benchmarks/sync.py), note on stderr when
    ``name`` happened; see draftops/timing.py."""
    if os.environ.get("DRAFTOPS_TIMING") == "1":
        sys.stderr.write(f"@@draftops-timing at {name} {time.time() if when is None else when:.6f}\n")
        sys.stderr.flush()


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------- root
def cmd_prepare(root, agent_name, source=None):
    """Expand ``root``, refuse / and $HOME, create code/runs/state, prove it is writable, and
    install this script's ``source`` as ``state/<agent_name>`` when it is not there yet.
    ``source`` None: this process is the installed copy itself (warm_boot), which must prove it."""
    home = os.path.realpath(os.path.expanduser("~"))
    resolved = os.path.realpath(os.path.expanduser(os.path.expandvars(root)))
    if resolved in ("/", home):
        what = "/" if resolved == "/" else "the home directory"
        _fail(f"root {root!r} resolves to {resolved}, which is {what}; draftops deletes inside <root>/code "
              "during sync, so it needs a folder of its own, e.g. ~/draftops", Exit.ROOT_REFUSED)
    try:
        for sub in ("runs", "state"):
            os.makedirs(os.path.join(resolved, sub), exist_ok=True)
        if not os.path.lexists(os.path.join(resolved, "code")):     # an existing one is judged by sync
            _create_code(os.path.join(resolved, "code"))
        _private_state(os.path.join(resolved, "state"))
        fd, probe = _mkstemp(os.path.join(resolved, "state"), ".probe")
        os.close(fd)
        os.unlink(probe)
        agent = os.path.join(resolved, "state", agent_name)
        global _AGENT_PATH
        _AGENT_PATH = agent
        data = source.encode() if source else None       # what the installed copy must hold
        installed = data is not None and not _same_file(agent, data)
        if installed:         # missing, or changed in place (an edit, a truncated copy): the name is ours
            _atomic_write(agent, data)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):        # the root is right; its disk is not
            _fail(f"root {root!r} ({resolved}) is on a full disk ({exc.strerror}): free space there, or point "
                  "`root:` in hosts.yaml at a folder on another disk", Exit.ROOT_UNWRITABLE)
        _fail(f"root {root!r} ({resolved}) is not writable: {exc.strerror or exc}", Exit.ROOT_UNWRITABLE)
    if source is None and not _holds_named_source(agent, agent_name):   # before anything compiles it
        _refuse_warm(agent, agent_name)
    run = _compiled(agent, installed, data) or agent
    if source is None and os.path.realpath(sys.argv[0]) != os.path.realpath(run):
        _refuse_warm(run, agent_name)                                     # a copy of it, run elsewhere
    _AGENT_PATH = run                 # the runners this call starts load the bytecode too
    _out({"protocol": PROTOCOL_VERSION, "root": resolved, "home": home, "python": sys.executable,
          "python_version": "{}.{}.{}".format(*sys.version_info[:3]), "platform": sys.platform,
          "agent": agent, "installed": installed, "run": run})
    return resolved


def _holds_named_source(agent, agent_name):
    """Whether ``agent`` still holds the source ``agent_name`` names (``agent-<sha256 prefix>.py``): an
    installed copy edited, replaced or removed since is never trusted to be this version."""
    expected = agent_name[len("agent-"):-len(".py")] if agent_name.startswith("agent-") else ""
    try:
        with open(agent, "rb") as fh:
            return bool(expected) and hashlib.sha256(fh.read()).hexdigest().startswith(expected)
    except OSError:
        return False


def _refuse_warm(path, agent_name):
    """Nothing replied, exit PROTOCOL_MISMATCH: the caller boots with the source instead."""
    _fail(f"warm boot refused: {path} is not the installed {agent_name}; boot with the source",
          Exit.PROTOCOL_MISMATCH)


def _compiled(agent, rewritten, source=None):
    """The installed agent byte-compiled for this python, ``agent-<sha>.<tag>.pyc`` beside it (the path,
    or None when it cannot be made): run as a script, a .py is compiled again by every call (~8 ms of
    each exec); the .pyc is loaded. Made again whenever the .py was (re)written or the .pyc is not a
    whole, loadable copy of it for this python; written atomically (py_compile), so concurrent boots
    cannot leave half a file (a crash may, without fsync: that copy fails the check below).
    ``source``: the .py's bytes when the caller has them (the boot has just compared them)."""
    tag = getattr(sys.implementation, "cache_tag", None)
    if not tag or not agent.endswith(".py"):
        return None
    pyc = f"{agent[:-3]}.{tag}.pyc"
    if rewritten or not _loadable(pyc, agent, source) or not _private(pyc):
        import py_compile
        try:
            py_compile.compile(agent, cfile=pyc, doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        except (OSError, py_compile.PyCompileError):
            return None
    return pyc


def _private(path):
    """Whether ``path`` is this user's and writable by nobody else (what WARM_STUB runs, it checks so)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


def _private_state(state):
    """Take group and other write from ``<root>/state`` (draftops' own folder; a umask of 002 gives it
    them), so that WARM_STUB accepts what is installed there."""
    st = os.stat(state)
    if st.st_uid == os.getuid() and st.st_mode & 0o022:
        os.chmod(state, stat.S_IMODE(st.st_mode) & ~0o022)


def _loadable(pyc, source_path, source=None):
    """Whether ``pyc`` is this python's bytecode of ``source_path`` as it is now (``source``: its
    bytes, read here when not given): the magic number, the source hash the unchecked-hash header
    records, and a code object that unmarshals (~0.5 ms for the agent; a cut or damaged copy would
    otherwise fail every later call of every session)."""
    import marshal
    from importlib.util import MAGIC_NUMBER, source_hash
    try:
        with open(pyc, "rb") as fh:
            data = fh.read()
        if source is None:
            with open(source_path, "rb") as fh:
                source = fh.read()
    except OSError:
        return False
    if data[:4] != MAGIC_NUMBER or data[8:16] != source_hash(source):
        return False
    try:
        return type(marshal.loads(data[16:])).__name__ == "code"
    except Exception:     # noqa: BLE001 - any damage: EOFError, ValueError, TypeError ...
        return False


def _same_file(path, data):
    """Whether ``path`` holds exactly ``data`` (size first: a missing or truncated copy costs no read)."""
    try:
        if os.path.getsize(path) != len(data):
            return False
        with open(path, "rb") as fh:
            return fh.read() == data
    except OSError:
        return False


def boot(source, argv):
    """First call of a session (run inline with ``python3 -c``): prepare, then run ``argv[2:]`` if given.

    Folding the root check and agent install into the first real command saves an SSH exec, which is
    most of the cost of a no-op sync. ``source`` None: see warm_boot."""
    _stamp("agent-start", globals().get("_T0"))
    root = cmd_prepare(argv[0], argv[1], source)
    if len(argv) > 2:
        main([root] + list(argv[2:]))


WARM_FLAG = "--warm"
#: ``python -S -c WARM_STUB --warm RUN ROOT AGENT_NAME [COMMAND ARGS...]``: how a session's first call runs
#: the installed copy it remembers (a note on the local side, which anyone who can write there could
#: point anywhere). Before anything of ``RUN`` is executed, it must be a regular file directly in
#: ``<ROOT>/state`` (real paths), and it and that folder owned by this user and not writable by group or
#: others; otherwise nothing runs: exit PROTOCOL_MISMATCH, and the caller boots with the source.
WARM_STUB = r"""import os, stat, sys
def no(why, code=9):
    sys.stderr.write("\n@@draftops-error %s\n%s\n" % (os.environ.get("DRAFTOPS_FRAME", "-"),
                     why if code != 9 else "warm boot refused: %s; boot with the source" % why))
    sys.exit(code)
run, root = sys.argv[2], sys.argv[3]
resolved = os.path.realpath(os.path.expanduser(os.path.expandvars(root)))
home = os.path.realpath(os.path.expanduser("~"))
if resolved in ("/", home):   # root's fault, as cmd_prepare says it: a boot would meet it the same way
    no("root %r resolves to %s, which is %s; draftops deletes inside <root>/code during sync, so it needs a "
       "folder of its own, e.g. ~/draftops" % (root, resolved, "/" if resolved == "/" else "the home directory"), 3)
state = os.path.join(resolved, "state")
path = os.path.realpath(run)
sys.path[0] = state
if os.path.dirname(path) != state:
    no("%s is not in %s" % (run, state))
try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    st, sd = os.fstat(fd), os.stat(state)
    data = os.read(fd, 1 << 22) if stat.S_ISREG(st.st_mode) else b""
except OSError as exc:
    no("%s: %s" % (run, exc))
for what, s in ((path, st), (state, sd)):
    if s.st_uid != os.getuid() or s.st_mode & 0o022:
        no("%s is not this user's alone (owner %d, mode %o)" % (what, s.st_uid, s.st_mode & 0o777))
if not stat.S_ISREG(st.st_mode) or not data or len(data) >= 1 << 22:
    no("%s is not a whole agent file" % run)
if path.endswith(".pyc"):
    import marshal
    from importlib.util import MAGIC_NUMBER
    if data[:4] != MAGIC_NUMBER:
        no("%s is not this python's bytecode" % run)
    code = marshal.loads(data[16:])
else:
    code = compile(data, path, "exec")
sys.argv = [path] + sys.argv[1:2] + sys.argv[3:]
exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
"""


def warm_boot(argv):
    """``agent.pyc --warm ROOT AGENT_NAME COMMAND ARGS...``: the boot, run by the installed copy whose
    path the caller remembers from an earlier session, so the session's first call neither carries
    the 60 kB source nor compiles it (~15 ms). The same prepare runs, and proves that this copy is
    the installed ``AGENT_NAME`` before replying; if it is not, nothing is replied and the caller
    boots with the source (docs/protocol.md § Boot)."""
    if len(argv) < 2:
        _fail("usage: agent.pyc --warm ROOT AGENT_NAME [COMMAND ARGS...]", Exit.USAGE)
    boot(None, argv)


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
PYCACHE = "__pycache__"   # the host python's bytecode cache: not synced, not compared (see _scan)
CODE_TMP = ".draftops-tmp-"   # + pid-random-index: the names of one apply's own temp files
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC
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


def cached_sha(old, key):
    """The stored hash if ``old`` is a well-formed cache entry for ``key`` ([key, sha256 hex]); None for
    any other shape (a disk error or an edit may leave anything in the file): the file is hashed."""
    if isinstance(old, list) and len(old) == 2 and old[0] == key and isinstance(old[1], str) and len(old[1]) == 64:
        return old[1]
    return None


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


def digest(manifest):
    """Canonical hash of a manifest; the local side computes the same one."""
    return hashlib.sha256(json.dumps(sorted(manifest.items()), separators=(",", ":")).encode()).hexdigest()


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
    token = f"{CODE_TMP}{os.getpid()}-{os.urandom(4).hex()}-"
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


# ---------------------------------------------------------------- jobs
LIVE_STATES = (None, "starting", "running")
ENV_FILE = ".env.json"                # the job's env values (0600): read, then deleted, by the runner
PULL_NOTES = ".draftops-pull-notes.json"
BLOCK = 1 << 16
MAX_LINE = 1 << 16                    # the local side shows longer lines in pieces of this size
OUTCOME_POLL_S = 2.0                  # how often the runner looks for new result events
FOLLOW_POLL_S = (0.01, 0.1)           # follow: first pause after output or start, doubling to the last
MAX_EVENT = 1 << 16
HAVE_PROC = os.path.exists("/proc/self/stat")


MAX_RECORD = 16 << 20                 # job.json, status.json, pid: far more than the agent ever writes


def _open_regular(path):
    """A descriptor of ``path`` if it is a regular file (no link followed), else None. A run folder is
    the job's to write in: its job.json, status.json, pid or log may have become a FIFO (an open would
    wait forever), a link to /dev/zero (a read would never end) or a folder."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _read_small(path, limit=MAX_RECORD):
    """The bytes of a regular file of at most ``limit`` bytes, else None."""
    fd = _open_regular(path)
    if fd is None:
        return None
    try:
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _read_json(path):
    """The JSON object in ``path``; None when there is none (missing, not a regular file, too big, not
    JSON, or JSON that is not an object: every caller reads fields from it)."""
    data = _read_small(path)
    try:
        value = json.loads(data) if data is not None else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _proc_info(pid):
    """(pgid, state letter, start time in clock ticks since boot) of ``pid``, or None if it is gone."""
    if not HAVE_PROC:
        return _proc_table().get(pid)
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return int(fields[2]), fields[0].decode(), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _proc_table():
    """{pid: (pgid, state, start_ticks)} of every process (start_ticks None where ``ps`` answers)."""
    if HAVE_PROC:
        table = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                info = _proc_info(int(name))
                if info is not None:
                    table[int(name)] = info
        return table
    import subprocess
    ps = subprocess.run(["ps", "-A", "-o", "pid=,pgid=,stat="], capture_output=True, text=True, check=False)
    table = {}
    for line in ps.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 3 and fields[0].isdigit() and fields[1].isdigit():
            table[int(fields[0])] = (int(fields[1]), fields[2][:1], None)
    return table


def _cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        import subprocess
        ps = subprocess.run(["ps", "-o", "args=", "-p", str(pid)], capture_output=True, check=False)
        return ps.stdout


def _is_ours(pid, info, start_ticks, run_id):
    """Whether process ``pid`` is the runner we recorded, not a later process that got its pid."""
    if start_ticks is not None and info[2] is not None:
        return info[2] == start_ticks
    return run_id.encode() in _cmdline(pid)     # status written without a start time, or no /proc


def _group_state(pgid, start_ticks, run_id, table=None):
    """How the job's process group is doing: "running" while the runner (the group leader, started
    with setsid) lives, "orphaned" while only other members do (someone killed the runner), None
    when the group is gone.

    Pid reuse: the kernel keeps a group id taken while any member lives, so a leader pid that now
    belongs to another process (other start time) means every process of ours is gone."""
    if table is None:
        leader = _proc_info(pgid)
        if leader is not None and leader[1] != "Z" and _is_ours(pgid, leader, start_ticks, run_id):
            return "running"                     # the common case, without scanning every process
        table = _proc_table()
    leader = table.get(pgid)
    if leader is not None:
        if not _is_ours(pgid, leader, start_ticks, run_id):
            return None
        if leader[1] != "Z":
            return "running"
    members = any(info[0] == pgid and info[1] != "Z" for pid, info in table.items() if pid != pgid)
    return "orphaned" if members else None


def _age(path):
    """Seconds since ``path`` last changed; infinite when it is gone."""
    try:
        return time.time() - os.path.getmtime(path)
    except OSError:
        return float("inf")


def _pid_in(value):
    """``value`` if it can be a pid (a status.json some job wrote over may hold anything), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _read_pid(run_dir):
    data = _read_small(os.path.join(run_dir, "pid"), 64)
    try:
        return _pid_in(int(data.strip())) if data is not None else None
    except ValueError:
        return None


def _status(run_dir, table=None):
    run_dir = os.path.abspath(run_dir)
    run_id = os.path.basename(run_dir.rstrip("/"))
    job = _read_json(os.path.join(run_dir, "job.json")) or {}
    status_path = os.path.join(run_dir, "status.json")
    status = _read_json(status_path) or {}
    row = {"id": run_id, "name": job.get("name"), "task": job.get("task") or job.get("name"),
           "args": job.get("args"), "command": job.get("command"), "created": job.get("created")}
    row.update(status)
    if status.get("state") not in LIVE_STATES:
        return row
    pid = _pid_in(status.get("pid")) or _read_pid(run_dir)
    group = _group_state(pid, status.get("start_ticks"), run_id, table) if pid else None
    if group == "running":
        row["state"] = "running"
    elif group == "orphaned":
        row.update(state="running", orphaned=True,
                   note="the runner process is gone (killed?) but the job's other processes still run in "
                        f"process group {int(pid)}; its exit code will not be recorded")
    else:
        again = _read_json(status_path) or {}
        if again.get("state") not in LIVE_STATES:            # it ended while we looked
            row.update(again)
        elif not pid and _age(run_dir) < 30:
            row["state"] = "starting"
        elif not os.path.isdir(run_dir):
            row.update(state="dead", note="its run folder is gone (removed or moved while draftops read it), "
                                          "so nothing tells how the job went")
        else:
            row.update(state="dead", note="every process of the job is gone and none recorded an exit code "
                                          "(the runner was killed, or the host restarted)")
    return row


class _EventScanner:
    """Reads a growing log from where it stopped, in blocks (bounded memory, C-speed search), and
    keeps the fields of the last ``result`` event and the last ``error`` event: the run's outcome,
    which `invoke runs` shows. Any job records its own headline by printing a result event."""

    MARK = b"\n" + EVENT_PREFIX.encode()
    READ = 1 << 20

    def __init__(self, path):
        self.path, self.pos, self.carry = path, 0, b"\n"
        self.result, self.error = {}, None

    @property
    def outcome(self):
        outcome = dict(self.result)
        if self.error:
            outcome["error"] = self.error
        return outcome

    def scan(self, final=False):
        """Read what was appended since the last call; True when the outcome changed."""
        before = self.outcome
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.pos)
                while block := fh.read(self.READ):
                    self.pos += len(block)
                    self._search(self.carry + block)
        except OSError:
            return False
        if final and self.carry.startswith(self.MARK):        # an event line without its newline
            self._take(self.carry[len(self.MARK):])
        return self.outcome != before

    def _search(self, buf):
        start = 0
        while True:
            i = buf.find(self.MARK, start)
            if i < 0:
                self.carry = buf[-(len(self.MARK) - 1):]
                return
            j = buf.find(b"\n", i + 1)
            if j < 0:                                          # the line goes on in the next block
                self.carry = buf[i:] if len(buf) - i <= MAX_EVENT else b""
                return
            self._take(buf[i + len(self.MARK):j])
            start = j

    def _take(self, raw):
        try:
            event = json.loads(raw.decode("utf-8", "replace"))
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if event.get("event") == "result":
            fields: dict = {}
            for key, value in event.items():
                if key in ("event", "t") or not isinstance(value, (str, int, float, bool)) or len(fields) >= 24:
                    continue
                fields[str(key)[:64]] = value[:300] if isinstance(value, str) else value
            self.result = fields
        elif event.get("event") == "error" and isinstance(event.get("message"), str):
            self.error = event["message"][:300]


def cmd_start(run_dir):
    """Create ``run_dir`` from the job spec on stdin, start its runner in its own session (the leader
    of a new process group) with stdio detached, and print the runner's pid.

    job.json says what the run is (task, arguments, env names); the env values go to a 0600 file the
    runner reads and deletes, so they never reach `runs`, a pulled folder or a log."""
    run_dir = os.path.abspath(run_dir)
    run_id = os.path.basename(run_dir.rstrip("/"))
    spec = json.loads(sys.stdin.read())
    env = spec.pop("env", None) or {}
    spec["env_keys"] = sorted(env)
    os.makedirs(run_dir, mode=0o700)
    if env:
        _atomic_write(os.path.join(run_dir, ENV_FILE), json.dumps(env).encode(), 0o600)
    _atomic_write(os.path.join(run_dir, "job.json"), json.dumps(spec).encode(), 0o600)
    _atomic_write(os.path.join(run_dir, "command"), (spec["command"] + "\n").encode())
    import subprocess
    with open(os.path.join(run_dir, "log"), "ab") as log:      # the runner keeps its own descriptor
        agent = _AGENT_PATH or os.path.abspath(__file__)
        # -S: the runner is this stdlib-only file; the job's own command gets its python's site as usual
        proc = subprocess.Popen([sys.executable, "-S", agent, os.getcwd(), "runner", run_dir, run_id],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    _atomic_write(os.path.join(run_dir, "pid"), f"{proc.pid}\n".encode())
    _out({"pid": proc.pid})


def cmd_runner(run_dir, run_id):
    """Run the job, keep its outcome (result events) and record its exit code; survives the SSH link
    (own session, no tty). The runner is its process group's leader: liveness and kill go by group."""
    import subprocess
    run_dir = os.path.abspath(run_dir)
    job = _read_json(os.path.join(run_dir, "job.json")) or {}
    env_path = os.path.join(run_dir, ENV_FILE)
    extra = _read_json(env_path) or {}
    if os.path.exists(env_path):
        os.unlink(env_path)
    status_path = os.path.join(run_dir, "status.json")
    me = _proc_info(os.getpid())
    base = {"pid": os.getpid(), "pgid": os.getpgid(0), "start_ticks": me[2] if me else None,
            "started": _now()}
    _atomic_write(status_path, json.dumps(dict(base, state="running")).encode())
    env = dict(os.environ, **extra, DRAFTOPS_RUN_ID=run_id, DRAFTOPS_RUN_DIR=run_dir, PYTHONUNBUFFERED="1")
    env.pop(FRAME_ENV, None)
    env.pop(PROTOCOL_ENV, None)
    cwd = os.path.abspath(job.get("cwd") or run_dir)     # relative cwd: relative to root
    began = time.monotonic()
    try:
        child = subprocess.Popen(["sh", "-c", job["command"]], cwd=cwd, env=env, stdin=subprocess.DEVNULL)
    except (OSError, KeyError) as exc:
        print(f"draftops: cannot start the job in {cwd}: {exc}", flush=True)
        final = dict(base, state="failed", exit_code=127, ended=_now(), outcome={"error": str(exc)[:300]})
        _write_status(status_path, json.dumps(final).encode())
        return
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
    scanner = _EventScanner(os.path.join(run_dir, "log"))
    code = _wait_for(child, scanner, status_path, base)
    sys.stdout.flush()
    scanner.scan(final=True)
    state = "killed" if got else ("succeeded" if code == 0 else "failed")
    # `started`/`ended` are whole seconds (for people); `seconds` is how long the command ran, to the ms
    final = dict(base, state=state, exit_code=code, ended=_now(), seconds=round(time.monotonic() - began, 3))
    if scanner.outcome:
        final["outcome"] = scanner.outcome
    if got:
        final["signal"] = got["signal"]
    _write_status(status_path, json.dumps(final).encode())


def _wait_for(child, scanner, status_path, base):
    """Wait for the job's command to exit and return its code; meanwhile keep status.json's outcome
    up to date from the log's result events."""
    import subprocess
    exit_fd = _exit_fd(child.pid)
    try:
        while True:
            if exit_fd is not None:              # woken the moment the command exits
                if _pause_or_exit(exit_fd, OUTCOME_POLL_S):
                    return child.wait()
            else:                                # Popen.wait(timeout) looks every 50 ms at best
                try:
                    return child.wait(timeout=OUTCOME_POLL_S)
                except subprocess.TimeoutExpired:
                    pass
            if scanner.scan():
                _write_status(status_path, json.dumps(dict(base, state="running",
                                                           outcome=scanner.outcome)).encode())
    finally:
        if exit_fd is not None:
            os.close(exit_fd)


def _exit_fd(pid):
    """A descriptor that turns readable when process ``pid`` exits (a Linux pidfd), or None where
    there is none (older kernels and Pythons, other systems: callers then poll as before)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not pid:
        return None
    try:
        return opener(int(pid))
    except (OSError, ValueError):
        return None


def _pause_or_exit(fd, seconds):
    """Wait ``seconds``, or less if the process behind ``fd`` exits first (then True)."""
    if fd is None:
        time.sleep(seconds)
        return False
    import select
    return bool(select.select([fd], [], [], seconds)[0])


def _run_dir_or_fail(run_dir):
    if not os.path.isdir(run_dir):
        _fail(f"no run folder {run_dir}", Exit.NO_RUN)
    return os.path.abspath(run_dir)


def cmd_status(run_dir):
    _out(_status(_run_dir_or_fail(run_dir)))


def cmd_runs(runs_dir, ids=None):
    """Every run's status, or only those of ``ids`` (comma-separated run ids; unknown ones are left
    out): a caller that wants a few runs does not read a history of thousands."""
    rows = []
    if os.path.isdir(runs_dir):
        table = _proc_table()                  # one look at the process list for every run
        if ids is None:
            names = sorted(os.listdir(runs_dir))
        else:
            names = sorted({n for n in ids.split(",") if n and n not in (".", "..") and "/" not in n})
        for name in names:
            full = os.path.join(runs_dir, name)
            if os.path.isdir(full) and not os.path.islink(full):
                rows.append(_status(full, table))
    _out({"runs": rows})


def _named_by_time(name):
    """Whether ``name`` starts as draftops.jobs.new_run_id names runs: ``YYYYmmdd-HHMMSS-``."""
    return name[:8].isdigit() and name[8:9] == "-" and name[9:15].isdigit() and name[15:16] == "-"


def cmd_recent(runs_dir, count):
    """The last ``count`` runs by id (an id starts with its start time) and how many runs there are:
    `invoke runs` shows the end of a long history without reading every run's status."""
    count = int(count)
    names = []
    if os.path.isdir(runs_dir):
        # a folder not named as draftops names runs (by the time it started) is counted as the oldest:
        # it would otherwise sort after every run and always take a place among "the last N"
        for name in sorted(os.listdir(runs_dir), key=lambda n: (_named_by_time(n), n)):
            try:
                if stat.S_ISDIR(os.lstat(os.path.join(runs_dir, name)).st_mode):
                    names.append(name)
            except OSError:                    # removed while listed
                pass
    table = _proc_table() if names else None
    rows = [_status(os.path.join(runs_dir, name), table) for name in names[max(0, len(names) - count):]]
    _out({"runs": rows, "total": len(names)})


def cmd_kill(run_dir, grace):
    """TERM the job's whole process group, KILL what is left after ``grace`` seconds; works when the
    runner itself is gone too (then this records the kill)."""
    run_dir = _run_dir_or_fail(run_dir)
    row = _status(run_dir)
    if row["state"] != "running":
        _out(row)
        return
    pgid = _pid_in(row.get("pgid")) or _pid_in(row.get("pid")) or _read_pid(run_dir)

    def live():
        return _group_state(pgid, row.get("start_ticks"), row["id"]) is not None

    sent, first, gone = None, None, None
    for sig, wait in ((signal.SIGTERM, float(grace)), (signal.SIGKILL, 5.0)):
        if gone is not None or not live():
            break
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        sent, first = sig, first or time.monotonic()
        deadline = time.time() + wait
        while gone is None and time.time() < deadline:
            if live():
                time.sleep(0.05)
            else:
                gone = time.monotonic()
    status_path = os.path.join(run_dir, "status.json")
    final = _read_json(status_path) or {}
    if final.get("state") in LIVE_STATES:      # the runner was gone, or SIGKILLed before it could record
        final.update(state="killed", ended=_now(), signal=sent)
        _atomic_write(status_path, json.dumps(final).encode())
    row = _status(run_dir)
    if first is not None and gone is not None:   # how long its processes took to exit once told (theirs)
        row["exit_s"] = round(gone - first, 3)
    _out(row)


def _tail_offset(path, lines):
    """Where the last ``lines`` text lines of the log start (event lines not counted), reading
    backwards in blocks and never more than ``lines`` × MAX_LINE bytes: memory and time stay bounded
    whatever the size of the log."""
    fd = _open_regular(path)
    if fd is None:
        return 0
    try:
        size = os.fstat(fd).st_size
        if lines <= 0:
            return size
        floor = max(0, size - lines * MAX_LINE)
        mark = EVENT_PREFIX.encode()
        count, pos, later = 0, size, b""
        while pos > floor:
            step = min(BLOCK, pos - floor)
            pos -= step
            block = os.pread(fd, step, pos)
            ext = block + later                  # a line start's prefix may reach into the next block
            i = len(block)
            while True:
                i = block.rfind(b"\n", 0, i)
                if i < 0:
                    break
                start = pos + i + 1
                if start < size and not ext.startswith(mark, i + 1):
                    count += 1
                    if count == lines:
                        return start
            later = ext[:len(mark)]
        return floor
    finally:
        os.close(fd)


def _read_at(path, pos, size=BLOCK):
    """Up to ``size`` bytes of ``path`` from ``pos`` (nothing when it cannot be read, or is no regular file)."""
    fd = _open_regular(path)
    if fd is None:
        return b""
    try:
        return os.pread(fd, size, pos)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _copy_range(path, start, end, out):
    """Copy bytes [start, end) of ``path`` to ``out`` in blocks."""
    pos = start
    while pos < end:
        chunk = _read_at(path, pos, min(BLOCK, end - pos))
        if not chunk:
            break
        out.write(chunk)
        pos += len(chunk)
    out.flush()


def cmd_tail(run_dir, lines):
    """The log's last ``lines`` lines (or "all") as a framed raw stream, copied in blocks."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    path = os.path.join(_run_dir_or_fail(run_dir), "log")
    fd = _open_regular(path)
    size = 0
    if fd is not None:
        size = os.fstat(fd).st_size
        os.close(fd)
    start = 0 if lines == "all" else _tail_offset(path, int(lines))
    _raw_start({"offset": start, "size": size})
    _copy_range(path, start, size, sys.stdout.buffer)


def cmd_follow(run_dir, start):
    """Copy the log to stdout as it grows, from byte ``start`` (or "-N": the last N lines), in blocks;
    end with a job-end event on a line of its own."""
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    run_dir = _run_dir_or_fail(run_dir)
    path = os.path.join(run_dir, "log")
    pos = _tail_offset(path, int(start[1:])) if start.startswith("-") else int(start)
    _raw_start({"offset": pos})
    out = sys.stdout.buffer
    last = b"\n"
    pause = FOLLOW_POLL_S[0]
    runner, woken = None, False  # the runner's exit descriptor: its end is seen at once, not a pause later
    try:
        while True:
            chunk = _read_at(path, pos)
            if chunk:
                out.write(chunk)
                out.flush()
                pos += len(chunk)
                last = chunk[-1:]
                pause = FOLLOW_POLL_S[0]
                continue
            row = _status(run_dir)
            if row["state"] not in ("running", "starting"):
                break
            if runner is None and not woken and row.get("pid") and not row.get("orphaned"):
                runner = _exit_fd(row["pid"])
            # quick jobs (a config rewrite) end within the first few looks
            if _pause_or_exit(runner, pause) and runner is not None:
                os.close(runner)         # it exited: look again now; later waits (an orphaned group) sleep
                runner, woken = None, True
            pause = min(pause * 2, FOLLOW_POLL_S[1])
    finally:
        if runner is not None:
            os.close(runner)
    while chunk := _read_at(path, pos):      # what the job wrote before it ended
        out.write(chunk)
        pos += len(chunk)
        last = chunk[-1:]
    if last != b"\n":
        out.write(b"\n")
    # without the command: it can pass MAX_LINE (a bench plan), and a line that long reaches home in pieces
    end = {k: v for k, v in row.items() if k != "command"}
    out.write((EVENT_PREFIX + json.dumps(dict(end, event="job-end", offset=pos)) + "\n").encode())
    out.flush()


def _link_problem(rel, target):
    """Why a symlink may not travel with a pulled run folder (None: it stays inside, keep it)."""
    if os.path.isabs(target):
        return f"symlink to the absolute path {target} (outside the run folder)"
    if ".." in target.split("/"):
        return f"symlink to {target}: links with '..' are not pulled (they may lead out of the run folder)"
    return None


class _Exactly:
    """Reads exactly ``size`` bytes of a file that may change while it is packed: stops at ``size`` if
    it grew, pads with NULs (and says so) if it shrank."""

    def __init__(self, fh, size):
        self.fh, self.left, self.short = fh, size, False

    def read(self, n=-1):
        if self.left <= 0:
            return b""
        n = self.left if n is None or n < 0 else min(n, self.left)
        data = self.fh.read(n)
        if not data:
            self.short, data = True, b"\0" * n
        self.left -= len(data)
        return data


def _tarinfo(rel, st, kind):
    import tarfile
    info = tarfile.TarInfo(rel)
    info.type, info.mode, info.mtime = kind, stat.S_IMODE(st.st_mode), int(st.st_mtime)
    return info


def _pack_dir(tar, dir_fd, rel, skipped):
    """Add the entries of the open folder ``dir_fd`` (named ``rel`` in the tar) without following any
    link: folders and files are opened relative to their parent's fd with O_NOFOLLOW."""
    import tarfile
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as exc:
        skipped.append({"path": rel or ".", "reason": f"cannot list the folder: {exc.strerror}"})
        return
    for name in names:
        path = rel + "/" + name if rel else name
        if (not rel and name == ENV_FILE) or TMP_MARK in name:
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
                try:
                    tar.addfile(_tarinfo(path, st, tarfile.DIRTYPE))
                    _pack_dir(tar, fd, path, skipped)
                finally:
                    os.close(fd)
            elif stat.S_ISREG(st.st_mode):
                _pack_file(tar, dir_fd, name, path, skipped)
            elif stat.S_ISLNK(st.st_mode):
                _pack_link(tar, dir_fd, name, path, st, skipped)
            else:
                kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                        else "a device node")
                skipped.append({"path": path, "reason": f"{kind}, not a file"})
        except OSError as exc:
            skipped.append({"path": path, "reason": f"cannot read: {exc.strerror or exc}"})


def _pack_file(tar, dir_fd, name, path, skipped):
    """Add one regular file, opened without following a link; exactly the size it had when opened."""
    import tarfile
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            skipped.append({"path": path, "reason": "changed from a file to something else"})
            return
        info = _tarinfo(path, st, tarfile.REGTYPE)
        info.size = st.st_size
        body = _Exactly(fh, st.st_size)
        tar.addfile(info, body)
        if body.short:
            skipped.append({"path": path, "reason": "shrank while it was copied; padded with NULs"})


def _pack_link(tar, dir_fd, name, path, st, skipped):
    """Add one symbolic link as a link (never its target), unless it leads out of the run folder."""
    import tarfile
    target = os.readlink(name, dir_fd=dir_fd)
    problem = _link_problem(path, target)
    if problem:
        skipped.append({"path": path, "reason": problem})
        return
    info = _tarinfo(path, st, tarfile.SYMTYPE)
    info.linkname, info.mode = target, 0o777
    tar.addfile(info)


def cmd_pack(run_dir):
    """A tar.gz of the run folder on stdout (framed), for `invoke pull`: files, folders and links that
    stay inside; everything else is left out and listed in a notes member at the end."""
    import tarfile
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    run_dir = _run_dir_or_fail(run_dir)
    try:
        top = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        _fail(f"cannot open run folder {run_dir} without following links: {exc.strerror}", Exit.UNSAFE_RUN)
    _raw_start({"format": "tar.gz"})
    skipped: list = []
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|gz") as tar:
        try:
            _pack_dir(tar, top, "", skipped)
        finally:
            os.close(top)
        notes = json.dumps({"skipped": skipped}).encode()
        info = tarfile.TarInfo(PULL_NOTES)
        info.size, info.mtime, info.mode = len(notes), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(notes))
    sys.stdout.buffer.flush()


# what the local side may call (docs/protocol.md); "runner" is started by "start" only
COMMANDS = {"manifest": cmd_manifest, "apply": cmd_apply, "start": cmd_start, "runner": cmd_runner,
            "status": cmd_status, "runs": cmd_runs, "recent": cmd_recent, "kill": cmd_kill, "tail": cmd_tail,
            "follow": cmd_follow, "pack": cmd_pack}  # type: dict


def _check_call(argv):
    """Refuse, before doing anything, a caller of another protocol version or an unknown command."""
    spoken = os.environ.get(PROTOCOL_ENV)
    if spoken is not None and spoken != str(PROTOCOL_VERSION):
        _fail(f"this draftops host agent ({_AGENT_PATH}) speaks protocol {PROTOCOL_VERSION}, the caller "
              f"speaks {spoken}; nothing was done", Exit.PROTOCOL_MISMATCH)
    if len(argv) < 2 or argv[1] not in COMMANDS:
        _fail(f"usage: agent.py ROOT COMMAND ARGS... with COMMAND one of {', '.join(sorted(COMMANDS))}; got "
              f"{argv[1:2]}", Exit.USAGE)
    code = COMMANDS[argv[1]].__code__          # (not inspect: its import costs 7 ms a call)
    most = code.co_argcount
    least = most - len(COMMANDS[argv[1]].__defaults__ or ())
    if not least <= len(argv) - 2 <= most:
        _fail(f"usage: agent command {argv[1]!r} takes {least}..{most} argument(s), not {len(argv) - 2}",
              Exit.USAGE)


def main(argv):
    """``agent.py ROOT COMMAND ARGS...``: paths in ARGS are relative to ROOT."""
    global _AGENT_PATH
    if _AGENT_PATH is None:
        _AGENT_PATH = os.path.abspath(__file__)
    _check_call(argv)
    os.chdir(argv[0])
    COMMANDS[argv[1]](*argv[2:])
    _stamp("agent-done")


STANDBY_FLAG = "--standby"
#: + the standby's clock (time.monotonic()) and a newline: the keeper gives each call an expiry in it
STANDBY_READY = b"@@draftops-standby ready "
#: written as soon as a request is read, before anything runs: a keeper that sees the standby's channel
#: end without it knows nothing ran, and runs the call on a fresh channel instead
STANDBY_TOOK = b"@@draftops-standby took\n"
#: the request's field, in the standby's clock, after which the keeper no longer waits for the took
#: line (it told its caller that nothing ran, and the call runs elsewhere): the call is then not run
STANDBY_EXPIRES = "expires"
MAX_STANDBY_REQUEST = 1 << 22
#: stdlib modules the quick tools (draftops.tools.STDLIB_TOOLS) import, loaded by a standby before it
#: says ready: about 10 ms of each tool call (python -X importtime). Only the stdlib: the synced code
#: may change between calls, so it is imported by the call.
STANDBY_IMPORTS = ("argparse", "dataclasses", "pathlib", "runpy", "shutil", "typing", "urllib.parse")


def standby():
    """Wait, loaded, for one call (``agent.pyc --standby``, started ahead by a kept connection,
    draftops/keeper.py): say ready on stdout, read one JSON line ``{"argv", "env", "boot", "source"}``
    (or ``{"tool": ...}``: a quick stdlib tool, see _run_tool) from stdin, say it took it, then run it
    exactly as a fresh exec would (the boot when ``boot`` is set). The call's
    input follows that line on stdin. The host's shell and this python's start-up were paid before
    the call was made; EOF before a request (the connection closed) ends it quietly."""
    for name in STANDBY_IMPORTS:     # what the quick tools import, loaded while nobody waits
        try:
            __import__(name)
        except ImportError:
            pass
    out = sys.stdout.buffer
    out.write(STANDBY_READY + repr(time.monotonic()).encode() + b"\n")
    out.flush()
    line = sys.stdin.buffer.readline(MAX_STANDBY_REQUEST)
    if not line.endswith(b"\n"):
        return
    try:
        request = json.loads(line)
    except ValueError:
        request = None
    if _expired(request):    # read too late (this process was stopped, the link stalled): abandoned
        os._exit(0)
    try:
        out.write(STANDBY_TOOK)
        out.flush()
    except OSError:          # the keeper gave up on this standby and may run the call elsewhere
        os._exit(0)
    try:
        if request is None:
            raise ValueError("not JSON")
        if isinstance(request, dict) and request.get("tool"):
            _run_tool(request["tool"])
            return
        env, argv = request["env"], request["argv"]
        if not (isinstance(env, dict) and isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            raise TypeError("env must be an object and argv a list of strings")
        os.environ.update({str(k): str(v) for k, v in env.items()})
    except (ValueError, KeyError, TypeError) as exc:
        _fail(f"standby agent: unusable request ({type(exc).__name__}: {exc})", Exit.USAGE)
    if request.get("boot"):
        boot(str(request["source"]), argv)
        return
    _stamp("agent-start")
    main(argv)


def _expired(request):
    """Whether a standby's ``request`` came after its expiry (the keeper's time for the took line had
    passed): the caller was told nothing ran, so running it now would run it twice or out of turn."""
    expires = request.get(STANDBY_EXPIRES) if isinstance(request, dict) else None
    return isinstance(expires, (int, float)) and time.monotonic() > expires


def _run_tool(tool):
    """A quick stdlib tool of the synced code, run in this process as ``cd CWD && env ENV python -S -m
    MODULE ARGV`` would run it (draftops.tools.module_command): the module as ``__main__`` with that
    argv, working folder, environment and import path; its exit code is this process's."""
    import runpy
    try:
        module, argv, cwd, env = tool["module"], tool["argv"], tool["cwd"], tool["env"]
        if not (isinstance(module, str) and isinstance(cwd, str) and isinstance(env, dict)
                and isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            raise TypeError("module and cwd must be strings, argv a list of strings, env an object")
        os.chdir(cwd)
    except (KeyError, TypeError, OSError) as exc:
        _fail(f"standby agent: unusable tool request ({type(exc).__name__}: {exc})", Exit.USAGE)
    os.environ.update({str(k): str(v) for k, v in env.items()})
    extra = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *extra, *sys.path[1:]]       # [0] was this agent's own folder
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    if sys.argv[1:] == [STANDBY_FLAG]:
        standby()
    elif sys.argv[1:2] == [WARM_FLAG]:
        warm_boot(sys.argv[2:])
    else:
        _stamp("agent-start")  # the installed copy: its imports are already counted as shell start-up
        main(sys.argv[1:])
