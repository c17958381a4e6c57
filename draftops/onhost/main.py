"""The agent's entry points: prepare and boot (inline, warm), the command table and its checks, and the
standby a kept connection starts ahead of a call.

One part of the host agent: draftops/onhost/__init__.py assembles the parts, in order, into the one
stdlib-only script the host runs (docs/protocol.md)."""
import errno
import hashlib
import json
import os
import stat
import sys
import time

from draftops.onhost.apply import cmd_apply  # noqa: F401
from draftops.onhost.logs import cmd_follow, cmd_pack, cmd_read, cmd_tail  # noqa: F401
from draftops.onhost.runs import cmd_kill, cmd_recent, cmd_runner, cmd_runs, cmd_start, cmd_status  # noqa: F401
from draftops.onhost.sync import _create_code, cmd_manifest  # noqa: F401
from draftops.onhost.wire import (  # noqa: F401
    _AGENT_PATH,
    FRAME_PREFIX,
    MAX_STANDBY_REQUEST,
    PROTOCOL_ENV,
    PROTOCOL_VERSION,
    STANDBY_EXPIRES,
    STANDBY_FLAG,
    STANDBY_READY,
    STANDBY_TOOK,
    WARM_FLAG,
    Exit,
    _atomic_write,
    _fail,
    _mkstemp,
    _out,
    _stamp,
)


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


#: ``python -S -c WARM_STUB --warm RUN ROOT AGENT_NAME [COMMAND ARGS...]``: how a session's first call runs
#: the installed copy it remembers (a note on the local side, which anyone who can write there could
#: point anywhere). Before anything of ``RUN`` is executed, it must be a regular file directly in
#: ``<ROOT>/state`` (real paths), and it and that folder owned by this user and not writable by group or
#: others; otherwise nothing runs: exit PROTOCOL_MISMATCH, and the caller boots with the source.


def warm_boot(argv):
    """``agent.pyc --warm ROOT AGENT_NAME COMMAND ARGS...``: the boot, run by the installed copy whose
    path the caller remembers from an earlier session, so the session's first call neither carries
    the 60 kB source nor compiles it (~15 ms). The same prepare runs, and proves that this copy is
    the installed ``AGENT_NAME`` before replying; if it is not, nothing is replied and the caller
    boots with the source (docs/protocol.md § Boot)."""
    if len(argv) < 2:
        _fail("usage: agent.pyc --warm ROOT AGENT_NAME [COMMAND ARGS...]", Exit.USAGE)
    boot(None, argv)


# what the local side may call (docs/protocol.md); "runner" is started by "start" only
COMMANDS = {"manifest": cmd_manifest, "apply": cmd_apply, "start": cmd_start, "runner": cmd_runner,
            "status": cmd_status, "runs": cmd_runs, "recent": cmd_recent, "kill": cmd_kill, "tail": cmd_tail,
            "follow": cmd_follow, "pack": cmd_pack, "read": cmd_read}  # type: dict


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


#: + the standby's clock (time.monotonic()) and a newline: the keeper gives each call an expiry in it
#: written as soon as a request is read, before anything runs: a keeper that sees the standby's channel
#: end without it knows nothing ran, and runs the call on a fresh channel instead
#: the request's field, in the standby's clock, after which the keeper no longer waits for the took
#: line (it told its caller that nothing ran, and the call runs elsewhere): the call is then not run
#: stdlib modules the quick tools (draftops.runs.tools.STDLIB_TOOLS) import, loaded by a standby before it
#: says ready: about 10 ms of each tool call (python -X importtime). Only the stdlib: the synced code
#: may change between calls, so it is imported by the call.
STANDBY_IMPORTS = ("argparse", "dataclasses", "pathlib", "runpy", "shutil", "typing", "urllib.parse")


def standby():
    """Wait, loaded, for one call (``agent.pyc --standby``, started ahead by a kept connection,
    draftops/link/keeper.py): say ready on stdout, read one JSON line ``{"argv", "env", "boot", "source"}``
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
    if isinstance(request, dict) and request.get("tool"):
        _run_tool(request["tool"])
        return
    argv = _call_argv(request)
    if request.get("boot"):
        boot(str(request["source"]), argv)
        return
    _stamp("agent-start")
    main(argv)


def _call_argv(request):
    """An agent call's argv from a standby's request, its env set; an unusable request exits USAGE."""
    try:
        if request is None:
            raise ValueError("not JSON")
        env, argv = request["env"], request["argv"]
        if not (isinstance(env, dict) and isinstance(argv, list) and all(isinstance(a, str) for a in argv)):
            raise TypeError("env must be an object and argv a list of strings")
    except (ValueError, KeyError, TypeError) as exc:
        _fail(f"standby agent: unusable request ({type(exc).__name__}: {exc})", Exit.USAGE)
    os.environ.update({str(k): str(v) for k, v in env.items()})
    return argv


def _expired(request):
    """Whether a standby's ``request`` came after its expiry (the keeper's time for the took line had
    passed): the caller was told nothing ran, so running it now would run it twice or out of turn."""
    expires = request.get(STANDBY_EXPIRES) if isinstance(request, dict) else None
    return isinstance(expires, (int, float)) and time.monotonic() > expires


def _run_tool(tool):
    """A quick stdlib tool of the synced code, run in this process as ``cd CWD && env ENV python -S -m
    MODULE ARGV`` would run it (draftops.runs.tools.module_command): the module as ``__main__`` with that
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
    frame = tool.get("frame")
    if isinstance(frame, str):       # the tool's answer follows this call's marker, as an exec's does
        sys.stdout.buffer.write(f"\n{FRAME_PREFIX}{frame}\n".encode())
        sys.stdout.buffer.flush()
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
