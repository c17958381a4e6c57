"""What both sides of the wire agree on, and the agent's own small I/O: markers, exit codes, framing of
replies, atomic writes, bounded reads of small records.

One part of the host agent: draftops/onhost/__init__.py assembles the parts, in order, into the one
stdlib-only script the host runs (docs/protocol.md)."""
import enum
import errno
import hashlib
import json
import os
import stat
import sys
import time

# subprocess, tarfile and tempfile are imported where used: together they are ~20 ms of every agent
# start, and most commands (status, runs, manifest, a no-op apply) need none of them

SYNC_META = ".draftops-sync.json"
TMP_MARK = ".draftops-tmp-"
from remote.events import EVENT_PREFIX as EVENT_PREFIX  # noqa: E402 - one source; the script gets its value

FRAME_ENV = "DRAFTOPS_FRAME"          # the nonce of this call's reply marker (chosen by the local side)
FRAME_PREFIX = "@@draftops-reply "    # stdout: the reply follows this marker line
ERROR_PREFIX = "@@draftops-error "    # stderr: the error message follows this marker line
PROTOCOL_ENV = "DRAFTOPS_PROTOCOL"    # the protocol version the local side speaks
PROTOCOL_VERSION = 2                  # bump on any change a local side of another version would misread
#                                      (2: Slurm hosts, issue #28: a start spec's "slurm", its reply's "job_id", a row's
#                                      "slurm", exit SCHEDULER; an agent of 1 would run a Slurm job on the login node)
_AGENT_PATH = None  # type: str | None  # where this script is installed on the host (set by prepare or main)


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
    NO_FILE = 10           # read: no such file, not a regular file (a folder, FIFO, device), or unreadable
    TOO_BIG = 11           # read: a whole read of a file larger than the caller's byte cap
    REFUSED_CODE = 20      # <root>/code is a link, unreadable or holds files draftops did not put there
    SCAN_FAILED = 21       # something under <root>/code cannot be read
    APPLY_FAILED = 22      # writing the sync failed (a full disk); every file is old or new, none partial
    BUSY = 23              # a live run works in <root>/code and the sync was not forced
    LOCK_TIMEOUT = 24      # another sync held the lock too long
    SCHEDULER = 25         # Slurm refused or did not answer (sbatch, scancel): its words, nothing half-done
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


WARM_FLAG = "--warm"


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


OWNER_MARK = ".draftops-owned"


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _CLOEXEC


def cached_sha(old, key):
    """The stored hash if ``old`` is a well-formed cache entry for ``key`` ([key, sha256 hex]); None for
    any other shape (a disk error or an edit may leave anything in the file): the file is hashed."""
    if isinstance(old, list) and len(old) == 2 and old[0] == key and isinstance(old[1], str) and len(old[1]) == 64:
        return old[1]
    return None


def digest(manifest):
    """Canonical hash of a manifest; the local side computes the same one."""
    return hashlib.sha256(json.dumps(sorted(manifest.items()), separators=(",", ":")).encode()).hexdigest()


PULL_NOTES = ".draftops-pull-notes.json"
#: a sub-folder of a run folder holding a file of this name stays on the host: a pull brings the folder
#: and this file only (what it says: what the folder holds and why it stays; the engine states a
#: capture check keeps run to gigabytes on a real target, and only the host's tools read them)
HOST_ONLY = ".draftops-host-only"


MAX_LINE = 1 << 16                    # the local side shows longer lines in pieces of this size


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


STANDBY_FLAG = "--standby"


STANDBY_READY = b"@@draftops-standby ready "


STANDBY_TOOK = b"@@draftops-standby took\n"


STANDBY_EXPIRES = "expires"


MAX_STANDBY_REQUEST = 1 << 22
