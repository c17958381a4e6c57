"""The host agent as typed calls: ``host.agent.apply(...)``, ``host.agent.status(run_id)``, ...

One exec on the host per call (docs/protocol.md). The session's first call runs the agent's source
inline (``python3 -c``), which resolves ``root`` and installs the agent in the same exec; later calls
run the installed copy. Every answer is framed (draftops.link.framing); a missing or empty answer is an
``AgentError``, never an empty reply. Every non-zero exit maps to one error class (``ERRORS``), and
every error names the host and the command and carries the ``FailedCommand``.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import secrets
import shlex
import stat
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from draftops import onhost, timing
from draftops.errors import (
    AgentError,
    FailedCommand,
    HostFileError,
    LinkDropped,
    RemoteError,
    RootError,
    SchedulerError,
    SyncRefused,
    UnknownRun,
    host_prefix,
)
from draftops.link.connection import CommandResult, transport_failures
from draftops.link.framing import FramingError, Unframer, error_text, marker, split_replies
from draftops.onhost import wire
from draftops.onhost.wire import Exit
from draftops.terminal import clean, needs_cleaning
from remote.fileio import atomic_write_bytes

if TYPE_CHECKING:
    from draftops.inventory import HostSpec
    from draftops.link.connection import Transport

AGENT_SOURCE = onhost.source()
AGENT_NAME = f"agent-{hashlib.sha256(AGENT_SOURCE.encode()).hexdigest()[:12]}.py"
_BOOT = ("import sys, time\nT0 = time.time()\nSRC = {src!r}\ng = {{'__name__': 'draftops_agent', '_T0': T0}}\n"
         "exec(SRC, g)\ng['boot'](SRC, sys.argv[1:])")
RunRow = dict[str, Any]          # a run's job.json + status.json fields (docs/protocol.md § status)
Entry = tuple[str, str, int]     # a manifest entry: (kind "f"/"l"/"x", sha256 or link target, mode)

#: the error class of each exit code (one class per meaning; docs/protocol.md § Exit codes)
ERRORS: dict[Exit, type[RemoteError]] = {
    Exit.CRASHED: AgentError, Exit.USAGE: AgentError, Exit.PROTOCOL_MISMATCH: AgentError,
    Exit.NO_PYTHON: AgentError, Exit.UNSAFE_RUN: AgentError,
    Exit.ROOT_REFUSED: RootError, Exit.ROOT_UNWRITABLE: RootError,
    Exit.REFUSED_ENTRY: SyncRefused, Exit.INCOMPLETE: SyncRefused, Exit.REFUSED_CODE: SyncRefused,
    Exit.SCAN_FAILED: SyncRefused, Exit.APPLY_FAILED: SyncRefused, Exit.BUSY: SyncRefused,
    Exit.LOCK_TIMEOUT: SyncRefused,
    Exit.NO_RUN: UnknownRun,
    Exit.SCHEDULER: SchedulerError,
    Exit.NO_FILE: HostFileError, Exit.TOO_BIG: HostFileError,
}
T = TypeVar("T")
READ_CAP = 16 << 20      # a read's default byte cap (a config, a log's head): what the caller holds in memory


@dataclass(frozen=True)
class HostInfo:
    """The reply of the boot's ``prepare``: where root is and what runs the agent."""

    protocol: int
    root: str
    home: str
    python: str              # the agent's sys.executable
    python_version: str
    platform: str
    agent: str               # the installed copy
    installed: bool          # this call (re)wrote it
    run: str = ""            # what later calls run: its bytecode for that python, else the copy itself


@dataclass(frozen=True)
class Manifest:
    """The host's code tree: {relative path: entry} and its digest (wire.digest)."""

    entries: dict[str, Entry]
    digest: str


@dataclass(frozen=True)
class ApplyResult:
    """``apply``'s answer: "applied" (with counts) or "stale" (the tree changed; its manifest)."""

    status: str
    digest: str
    written: int = 0
    deleted: int = 0
    files: int = 0
    busy_runs: list[str] = field(default_factory=list)
    manifest: Manifest | None = None


@dataclass(frozen=True)
class TailHeader:
    offset: int              # where the shown part of the log starts
    size: int                # the log's size when the tail began


@dataclass(frozen=True)
class FileRead:
    """A bounded read of one host file (``read``): the bytes asked for and where they sit in it."""

    data: bytes
    size: int                # the file's size when it was read
    offset: int              # where ``data`` starts in the file
    executable: bool         # the file may be run (what ``[ -x FILE ]`` says)


def _entries(raw: Mapping[str, Any]) -> dict[str, Entry]:
    return {str(rel): (str(v[0]), str(v[1]), int(v[2])) for rel, v in raw.items()}


#: a warm boot's exits with no reply that prove nothing ran: the copy refused (9), Python could not
#: load or find it (1, 2), the shell could not run it (126, 127). Others (a dropped link's -1, a
#: signal, root's 3 and 4) are the call's own error: booting again could run a command twice.
WARM_UNSTARTED = frozenset({Exit.CRASHED, Exit.USAGE, Exit.PROTOCOL_MISMATCH, 126, Exit.NO_PYTHON})


MAX_NOTE = 1 << 12        # a cache note is a line of JSON; anything bigger is not one
_PYTHON_NAME = re.compile(r"(python|pypy)[0-9.]*[a-z]?")


def _absolute(path: object) -> bool:
    """Whether a remembered ``path`` (from a cache file) is an absolute path a command line can carry."""
    return isinstance(path, str) and path.startswith("/") and "\0" not in path and not needs_cleaning(path)


def _agent_copy(run: object) -> bool:
    """Whether a remembered ``run`` names this agent's installed copy as prepare reports it:
    ``.../state/agent-<sha12>.py`` or its ``agent-<sha12>.<tag>.pyc`` (the host checks the rest, WARM_STUB)."""
    if not _absolute(run):
        return False
    parent, name = posixpath.split(str(run))
    stem = AGENT_NAME[:-len(".py")]
    return posixpath.basename(parent) == "state" and (
        name == AGENT_NAME or (name.startswith(stem + ".") and name.endswith(".pyc") and "/" not in name))


def _interpreter(python: object) -> bool:
    """Whether a remembered interpreter looks like one (``.../python3.12``): a note pointing at another
    program is not run on the host."""
    return _absolute(python) and bool(_PYTHON_NAME.fullmatch(posixpath.basename(str(python))))


def read_note(path: Path | None) -> dict[str, Any] | None:
    """A small cache note, read safely: a regular file (not a link, FIFO or device), at most MAX_NOTE
    bytes, one JSON object; anything else is None (the caller boots cold and writes it afresh)."""
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_NOTE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        note = json.loads(data) if len(data) <= MAX_NOTE else None
    except (ValueError, RecursionError):
        return None
    return note if isinstance(note, dict) else None


class AgentClient:
    """The agent on one host. ``info`` is None until the first call (or ``prepare``) has run.

    ``memory`` (a file, or None) remembers the interpreter the agent reported (``sys.executable``)
    between sessions: calling it directly skips the shell's PATH search and any shim (pyenv's costs
    0.17 s an exec). A remembered interpreter that fails the boot is forgotten and the default
    (``python3``) is used again."""

    def __init__(self, spec: HostSpec, transport: Transport, memory: Path | None = None,
                 installed: Path | None = None):
        self.spec, self.transport, self.memory, self.installed = spec, transport, memory, installed
        self.default_python = sys.executable if spec.transport == "local" else "python3"
        self.python = self._remembered() or self.default_python
        self.info: HostInfo | None = None
        self.warm = self._warm_run()

    # ------------------------------------------------------------------ the commands
    def prepare(self) -> HostInfo:
        """Resolve and check ``root`` and install the agent (once per session; later calls are free)."""
        if self.info is None:
            self._call(())
        assert self.info is not None
        return self.info

    def manifest(self, code_dir: str, state_file: str) -> Manifest:
        reply = self._call(("manifest", code_dir, state_file))
        return self._typed("manifest", lambda: Manifest(_entries(reply["manifest"]), str(reply["digest"])))

    def apply(self, code_dir: str, state_file: str, payload: bytes, *, expected_tree: str | None,
              force: bool) -> ApplyResult:
        """Send a sync payload (docs/protocol.md § apply); ``expected_tree`` None: apply whatever is there."""
        args = ("apply", code_dir, state_file, hashlib.sha256(payload).hexdigest(), str(len(payload)),
                expected_tree or "-", "1" if force else "0")
        reply = self._call(args, input=payload)

        def typed() -> ApplyResult:
            manifest = Manifest(_entries(reply["manifest"]), str(reply["digest"])) if "manifest" in reply else None
            status = str(reply["status"])
            if status not in ("applied", "stale"):
                raise ValueError(f"status {status!r}")
            return ApplyResult(status, str(reply["digest"]), int(reply.get("written", 0)),
                               int(reply.get("deleted", 0)), int(reply.get("files", 0)),
                               [str(r) for r in reply.get("busy_runs", [])], manifest)
        return self._typed("apply", typed)

    def start(self, run_id: str, spec: Mapping[str, Any]) -> int | None:
        """Create ``runs/<run_id>`` from the job ``spec`` and start its runner; returns the runner's pid
        (None for a Slurm job: its runner starts on a compute node when Slurm runs it)."""
        reply = self._call(("start", _run_dir(run_id)), input=json.dumps(spec).encode(), run_id=run_id)
        return self._typed("start", lambda: None if reply["pid"] is None and reply.get("job_id") else int(reply["pid"]))

    def status(self, run_id: str) -> RunRow:
        return self._row("status", self._call(("status", _run_dir(run_id)), run_id=run_id))

    def runs(self, ids: list[str] | None = None) -> list[RunRow]:
        """Every run's row, or only those of ``ids`` (that exist)."""
        if ids is not None and not ids:
            return []
        reply = self._call(("runs", "runs") if ids is None else ("runs", "runs", ",".join(ids)))
        rows = self._typed("runs", lambda: list(reply["runs"]))
        return [self._row("runs", row) for row in rows]

    def recent(self, count: int) -> tuple[list[RunRow], int]:
        """The last ``count`` runs by id, and how many runs the host has."""
        reply = self._call(("recent", "runs", str(int(count))))
        rows, total = self._typed("recent", lambda: (list(reply["runs"]), int(reply["total"])))
        return [self._row("recent", row) for row in rows], total

    def kill(self, run_id: str, grace_s: float) -> RunRow:
        """TERM the run's process group, KILL it after ``grace_s``; the final status."""
        return self._row("kill", self._call(("kill", _run_dir(run_id), str(float(grace_s))), run_id=run_id))

    def read(self, path: str, how: str = "whole", cap: int = READ_CAP, lines: int = 0) -> FileRead:
        """One host file, bounded, never through a shell (a banner cannot get into its bytes): ``whole``
        (at most ``cap`` bytes, else a HostFileError), ``head`` (its first ``cap`` bytes), ``tail`` (its
        last ``lines`` lines, within its last ``cap`` bytes) or ``size`` (no bytes). ``~/`` is the host's
        home. A missing file, a folder, FIFO or device (even behind a link) is a HostFileError."""
        received = bytearray()

        def keep(chunk: bytes) -> None:                  # never more than the cap (and a byte) is held
            received.extend(chunk[:max(0, cap + 1 - len(received))])

        args = ("read", path, how, str(int(cap)), str(int(lines)))
        header = self._stream(args, keep, None)
        length = self._typed("read", lambda: int(header["length"]))
        if len(received) < length:
            raise self._failure(AgentError, " ".join(args), 0, b"", b"",
                                f"the draftops agent's `read` of {path} ended after {len(received)} of its "
                                f"{length} bytes: the link dropped or the agent was stopped; try again")
        return self._typed("read", lambda: FileRead(bytes(received[:length]), int(header["size"]),
                                                    int(header["offset"]), bool(header["executable"])))

    def tail(self, run_id: str, lines: int | None, on_output: Callable[[bytes], object]) -> TailHeader:
        """The log's last ``lines`` lines (None: all of it) to ``on_output``."""
        header = self._stream(("tail", _run_dir(run_id), "all" if lines is None else str(lines)), on_output, run_id)
        return self._typed("tail", lambda: TailHeader(int(header["offset"]), int(header["size"])))

    def follow(self, run_id: str, on_output: Callable[[bytes], object], *, offset: int = 0,
               lines: int | None = None, bounded: bool = True,
               on_start: Callable[[int], object] | None = None) -> int:
        """The log as it grows, from byte ``offset`` (or its last ``lines`` lines), ending with a job-end
        event line; returns the byte offset the stream starts at. ``bounded``: stop at a Slurm job's
        pending bound (``max_pending``); else wait while it is queued. ``on_start`` gets that offset as
        soon as the header arrives, so a stream cut later can be re-attached where it stopped."""
        start = f"-{lines}" if lines is not None else str(offset)
        wait = "bounded" if bounded else "unbounded"

        def started(header: dict[str, Any]) -> None:
            if on_start is not None and isinstance(header.get("offset"), int):
                on_start(header["offset"])

        header = self._stream(("follow", _run_dir(run_id), start, wait), on_output, run_id, on_header=started)
        return self._typed("follow", lambda: int(header["offset"]))

    def pack(self, run_id: str, on_output: Callable[[bytes], object]) -> None:
        """A tar.gz of the run folder to ``on_output`` (links leading out and special files left out)."""
        self._stream(("pack", _run_dir(run_id)), on_output, run_id)

    # ------------------------------------------------------------------ calling
    def command_line(self, args: tuple[str, ...], nonce: str) -> str:
        """The shell command for one call: the installed agent, or the inline boot before the first.
        ``exec``: the shell becomes the agent, so a killed agent leaves no shell to write "Killed" into
        its stream (a follow counts that stream's bytes as log bytes to re-attach where it stopped)."""
        env = _env_prefix(nonce) + " exec"
        if self.info is None and self.warm is not None:   # checked on the host before it runs (WARM_STUB)
            quoted = " ".join(shlex.quote(a) for a in (self.warm, self.spec.root, AGENT_NAME, *args))
            return (f"{env} {shlex.quote(self.python)} -S -c {shlex.quote(wire.WARM_STUB)} "
                    f"{wire.WARM_FLAG} {quoted}")
        if self.info is None:
            boot = _BOOT.format(src=AGENT_SOURCE)
            return " ".join([env, shlex.quote(self.python), "-S", "-c", shlex.quote(boot), shlex.quote(self.spec.root),
                             AGENT_NAME, *(shlex.quote(a) for a in args)])
        quoted = " ".join(shlex.quote(a) for a in (self.info.root, *args))
        return f"{env} {shlex.quote(self.python)} -S {shlex.quote(self.info.run or self.info.agent)} {quoted}"

    def quick(self, command: str, tool: dict[str, Any] | None, input: bytes | None = None,
              timeout: float | None = None) -> CommandResult:
        """A quick tool's shell ``command`` (draftops.runs.tools.ask_tool): given to a standby agent as
        ``tool`` (a stdlib module the agent's python runs: docs/protocol.md § Kept connections) where
        the transport keeps them, else one exec. Framed as an agent reply is: its stdout is what follows
        a marker line with this call's nonce, so what the shell's start-up files print (a banner, even
        one without a newline) never reaches the tool's answer; no marker, no stdout."""
        nonce = secrets.token_hex(8)
        framed = f"printf '\\n%s%s\\n' {shlex.quote(wire.FRAME_PREFIX)} {nonce}; {command}"

        def one_call() -> CommandResult:
            done = None
            if tool is not None:
                done = self.transport.run_standby(self.standby_request({"tool": {**tool, "frame": nonce}}), framed,
                                                  input, timeout)
            if done is None:                 # not a stdlib tool, or no standbys on this transport: one exec
                done = self.transport.run(framed, input=input, timeout=timeout, check=False)
            return done
        done = self._linked(command, one_call)
        mark = marker(wire.FRAME_PREFIX, nonce)
        stdout = done.stdout.split(mark, 1)[1] if mark in done.stdout else b""
        return CommandResult(command, done.exit_code, stdout, done.stderr)

    def standby_request(self, header: dict[str, Any]) -> dict[str, Any]:
        """A request for a standby of this session's agent and python (draftops/link/keeper.py): ``header``
        is what the standby is told (docs/protocol.md § Kept connections)."""
        return {"python": self.python, "agent": AGENT_NAME, "header": header}

    def _standby(self, args: tuple[str, ...], nonce: str) -> dict[str, Any]:
        """The same call for a standby agent (draftops/link/keeper.py), where the transport keeps them: which
        agent it needs, and what it is told in place of a command line (the boot's source included)."""
        env = _env(nonce)
        if self.info is None:
            header = {"boot": True, "source": AGENT_SOURCE, "argv": [self.spec.root, AGENT_NAME, *args], "env": env}
        else:
            header = {"argv": [self.info.root, *args], "env": env}
        return self.standby_request(header)

    def _call(self, args: tuple[str, ...], *, input: bytes | None = None, run_id: str | None = None,
              retried: bool = False) -> dict[str, Any]:
        nonce = secrets.token_hex(8)
        booting = self.info is None
        warm = booting and self.warm is not None
        command = self.command_line(args, nonce)
        sent_at = time.time()
        what = " ".join(args) if args else "prepare"
        result = self._linked(what, lambda: self._exec(args, nonce, command, input))
        timing.host_stages(result.stderr, sent_at, time.time())
        try:
            replies, noise = split_replies(result.stdout, nonce)
        except FramingError as exc:
            raise self._failure(AgentError, what, result.exit_code, result.stdout, result.stderr,
                                f"the draftops agent's answer to `{what}` is unusable: {exc}") from None
        if warm and not replies and result.exit_code in WARM_UNSTARTED:
            self._drop_warm()              # the remembered copy refused or is gone: nothing ran; boot
            return self._call(args, input=input, run_id=run_id, retried=retried)
        if booting and replies:
            self.info = self._host_info(replies.pop(0), result)
            asked = self.python
            self._remember(self.info.python)
            self._note_warm(self.info.python, self.info.run or self.info.agent)
            # a kept connection starts the next agent ahead
            self.transport.standby_ready(self.python, AGENT_NAME, self.info.run or self.info.agent, asked)
        unprepared = booting and self.info is None       # the boot failed before prepare answered
        if unprepared and 0 < result.exit_code < 128 \
                and result.exit_code not in (Exit.ROOT_REFUSED, Exit.ROOT_UNWRITABLE) \
                and self.python != self.default_python:   # not a dropped link (-1) or a signal (WARM_UNSTARTED)
            self._forget()                            # the remembered interpreter stopped working
            return self._call(args, input=input, run_id=run_id, retried=retried)
        if result.exit_code == Exit.PROTOCOL_MISMATCH and not booting and not retried:
            self._reinstall()
            return self._call(args, input=input, run_id=run_id, retried=True)
        if result.exit_code != 0:
            raise self._error(what, result.exit_code, result.stdout, result.stderr, nonce, run_id, unprepared)
        if not args and self.info is not None:
            return {}
        if not replies:
            raise self._unframed(what, result.exit_code, noise or result.stderr)
        return replies[-1]

    def _stream(self, args: tuple[str, ...], on_output: Callable[[bytes], object], run_id: str | None,
                retried: bool = False,
                on_header: Callable[[dict[str, Any]], None] = lambda header: None) -> dict[str, Any]:
        """Run a streaming command; returns its header once the stream has ended with exit 0."""
        self.prepare()                               # a stream has one marker: never through the boot
        nonce = secrets.token_hex(8)
        unframer = Unframer(nonce, on_output, on_header)
        what = " ".join(args)
        command = self.command_line(args, nonce)
        fault: list[BaseException] = []        # what the caller's own callback raised (a full disk ...)
        feed = _recording(unframer.feed, fault)
        try:
            code = self._linked(what, lambda: self._exec_stream(args, nonce, command, feed), fault)
        except FramingError as exc:
            raise self._failure(AgentError, what, None, unframer.noise, b"",
                                f"the draftops agent's answer to `{what}` is unusable: {exc}") from None
        if not unframer.framed:
            if code == Exit.PROTOCOL_MISMATCH and not retried:
                self._reinstall()
                return self._stream(args, on_output, run_id, retried=True, on_header=on_header)
            if code != 0:
                raise self._error(what, code, b"", unframer.noise, nonce, run_id, False)
            raise self._unframed(what, code, unframer.noise)
        if unframer.header is None:
            raise self._failure(LinkDropped if code == -1 else AgentError, what, code, unframer.noise, b"",
                                f"the draftops agent's `{what}` stream ended before its header line (exit "
                                f"{code}): the link dropped or the agent was stopped; try again")
        if code != 0:
            raise self._failure(LinkDropped if code == -1 else AgentError, what, code, b"", b"",
                                f"the draftops agent's `{what}` stream ended with exit {code} before it was "
                                "complete: the link dropped or the agent was stopped; try again")
        return unframer.header

    def _exec(self, args: tuple[str, ...], nonce: str, command: str, input: bytes | None) -> CommandResult:
        """One call's exec: to a standby agent where the transport keeps them, else one exec."""
        result = self.transport.run_standby(self._standby(args, nonce), command, input)
        return result if result is not None else self.transport.run(command, input=input, check=False)

    def _exec_stream(self, args: tuple[str, ...], nonce: str, command: str, feed: Callable[[bytes], None]) -> int:
        """One streaming call's exec (as ``_exec``); its exit code."""
        code = self.transport.stream_standby(self._standby(args, nonce), command, feed)
        return code if code is not None else self.transport.stream(command, feed)

    def _linked(self, what: str, call: Callable[[], T], fault: list[BaseException] | None = None) -> T:
        """``call()``, one transport call, with the link's own failures (the SSH library's, a socket's)
        mapped here, where they happen, to ``LinkDropped``: nothing above draftops.link names them. What
        the caller's callback raised (``fault``: a full disk while a pull writes) passes as it is."""
        try:
            return call()
        except transport_failures() as exc:
            if fault and exc is fault[0]:
                raise
            raise self._failure(LinkDropped, what, None, b"", b"",
                                _dropped_text(what, f"{type(exc).__name__}: {exc}" if str(exc)
                                              else type(exc).__name__)) from exc

    def _reinstall(self) -> None:
        """The installed copy speaks another protocol: forget it and boot again, which rewrites it."""
        self.info = None
        self.prepare()

    # ------------------------------------------------------------------ the remembered interpreter
    def _remembered(self) -> str | None:
        python = (read_note(self.memory) or {}).get("python")
        return python if _interpreter(python) else None

    def _remember(self, python: str) -> None:
        """Use ``python`` for the rest of the session and remember it for the next (best effort)."""
        if self.memory is None or not python.startswith("/"):
            return
        self.python = python
        if self._remembered() != python:
            try:
                self.memory.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_bytes(self.memory, json.dumps({"python": python}).encode())
            except OSError:
                pass                                  # only a shortcut: the default still works

    # ------------------------------------------------------------------ the installed copy (warm boot)
    def _warm_run(self) -> str | None:
        """The installed agent a session's first call can run instead of the inline boot (onhost.main
        warm_boot), as ``installed`` (a file, or None) remembers it: only for this agent version and
        this session's python. A stale note costs one refused exec, then the boot runs."""
        note = read_note(self.installed)
        if note is None or note.get("agent") != AGENT_NAME or note.get("python") != self.python:
            return None
        run = note.get("run")
        return run if _agent_copy(run) else None

    def _note_warm(self, python: str, run: str) -> None:
        """Remember where the boot says this agent is installed (best effort; see _warm_run)."""
        if self.installed is None or (self.warm == run and python == self.python):
            return
        try:
            self.installed.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(self.installed, json.dumps({"agent": AGENT_NAME, "python": python,
                                                           "run": run}).encode())
        except OSError:
            pass
        self.warm = run

    def _drop_warm(self) -> None:
        self.warm = None
        if self.installed is not None:
            self.installed.unlink(missing_ok=True)

    def _forget(self) -> None:
        self._drop_warm()
        self.python = self.default_python
        if self.memory is not None:
            self.memory.unlink(missing_ok=True)

    # ------------------------------------------------------------------ errors
    @property
    def where(self) -> str:
        return host_prefix(self.spec.name, self.spec.describe())

    def _failure(self, cls: type[RemoteError], what: str, code: int | None, stdout: bytes | str,
                 stderr: bytes | str, text: str) -> RemoteError:
        return cls(f"{self.where}: {text}", FailedCommand.of(self.spec.name, what, code, stdout, stderr))

    def _error(self, what: str, code: int, stdout: bytes | str, stderr: bytes, nonce: str, run_id: str | None,
               unprepared: bool) -> RemoteError:
        """The error for a non-zero exit: one class per exit code, the agent's own message."""
        text = clean(error_text(stderr, nonce)).strip()
        known = Exit(code) if code in Exit._value2member_map_ else None
        cls = ERRORS.get(known, AgentError) if known is not None else AgentError
        if cls is RootError:    # the agent's text names the fix when it is not `root:` itself
            message = text.rstrip(".") + "." if "`root:`" in text else f"{text}. Fix `root:` in hosts.yaml."
        elif cls is UnknownRun and run_id is not None:
            return cls(f"{host_prefix(self.spec.name)} has no run {run_id!r}; `invoke runs` lists the runs there.",
                       FailedCommand.of(self.spec.name, what, code, stdout, stderr))
        elif cls is UnknownRun:
            message = text
        elif cls in (SyncRefused, HostFileError):
            message = text.rstrip(".") + "."
        elif code == -1:        # no exit status came back: the link dropped (the boot too: python was not at fault)
            cls, message = LinkDropped, _dropped_text(what, text)
        elif known is Exit.NO_PYTHON or (unprepared and known is not Exit.USAGE):
            message = (f"could not start {self.python} there (exit {code}): {text[-500:]}. draftops needs a "
                       "python3 on the host's PATH for its own bookkeeping.")
        elif known is Exit.PROTOCOL_MISMATCH:
            message = (f"{text}. Reinstalling the agent ({AGENT_NAME}) from this draftops did not help; remove "
                       f"{self.info.agent if self.info else '<root>/state/' + AGENT_NAME} on the host and try again.")
        elif known is Exit.USAGE:
            message = (f"the draftops agent refused `{what}`: {text}. The local side and its agent disagree, "
                       "which is a bug in draftops; please report it.")
        else:
            message = f"the draftops agent failed running `{what}` (exit {code}): {text[-1500:] or '(no message)'}"
        return self._failure(cls, what, code, stdout, stderr, message)

    def _unframed(self, what: str, exit_code: int, noise: bytes) -> AgentError:
        shown = clean(noise.decode("utf-8", "replace")).strip()[-300:] or "(nothing)"
        return AgentError(
            f"{self.where}: the draftops agent's answer to `{what}` has no reply marker (exit {exit_code}); the "
            f"output was: {shown!r}. Something on the host replaced or swallowed it: check the SSH user's shell "
            "start-up files (~/.bashrc, ~/.profile) for commands that exit or exec, and that python3 there runs "
            "plain Python.", FailedCommand.of(self.spec.name, what, exit_code, noise))

    def _typed(self, what: str, build: Callable[[], Any]) -> Any:
        """``build()`` from a reply; a reply without the fields the protocol promises is an AgentError."""
        try:
            return build()
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise self._failure(AgentError, what, 0, b"", b"", f"the draftops agent's reply to `{what}` does not "
                                f"match protocol {wire.PROTOCOL_VERSION} ({type(exc).__name__}: {exc})") from None

    def _row(self, what: str, row: Any) -> RunRow:
        if not isinstance(row, dict) or not isinstance(row.get("id"), str):
            raise self._failure(AgentError, what, 0, b"", b"", f"the draftops agent's reply to `{what}` is not a "
                                f"run row: {clean(str(row)[:200])!r}")
        return row

    def _host_info(self, reply: dict[str, Any], result: Any) -> HostInfo:
        if reply.get("protocol") != wire.PROTOCOL_VERSION:
            raise self._failure(AgentError, "prepare", result.exit_code, result.stdout, result.stderr,
                                f"the draftops agent run from this draftops answered with protocol "
                                f"{reply.get('protocol')!r}, not {wire.PROTOCOL_VERSION}: its source was "
                                "changed on the way (check the python3 there runs plain Python)")
        return self._typed("prepare", lambda: HostInfo(
            int(reply["protocol"]), str(reply["root"]), str(reply["home"]), str(reply["python"]),
            str(reply["python_version"]), str(reply["platform"]), str(reply["agent"]), bool(reply["installed"]),
            str(reply.get("run") or reply["agent"])))


def _recording(feed: Callable[[bytes], None], fault: list[BaseException]) -> Callable[[bytes], None]:
    """``feed``, noting in ``fault`` what it raised, so that ``_linked`` lets the caller's own error pass."""
    def recorded(chunk: bytes) -> None:
        try:
            feed(chunk)
        except BaseException as exc:
            fault.append(exc)
            raise
    return recorded


def _dropped_text(what: str, reason: str) -> str:
    """The paragraph of a call whose link dropped before its answer came back (``LinkDropped``)."""
    return (f"the connection dropped during `{what}`, before its answer came back"
            f"{': ' + reason if reason else ''}. Run the command again; a call that changes the host "
            "(a sync, a job start) may have been done: `invoke runs` shows the jobs there.")


def _run_dir(run_id: str) -> str:
    return f"runs/{run_id}"


def _env(nonce: str) -> dict[str, str]:
    """The agent's environment: the reply nonce, the protocol version (and the benchmark's timing flag)."""
    env = {timing.ENV: "1"} if timing.ENABLED else {}
    return {**env, wire.FRAME_ENV: nonce, wire.PROTOCOL_ENV: str(wire.PROTOCOL_VERSION)}


def _env_prefix(nonce: str) -> str:
    """``_env`` as the start of a command line."""
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in _env(nonce).items())
