"""The local side of a kept SSH connection (``persist:`` in hosts.yaml), as OpenSSH's ControlPersist:
the first `invoke` call connects directly and, as it exits, leaves a keeper process (draftops/link/keeper.py)
holding the connection; later calls reach the host through the keeper's Unix socket and skip the SSH
library's import and the handshake. The keeper also keeps a host agent started ahead (``--standby``),
so an agent call does not wait for the host's shell and python either.

Anything wrong with a keeper (none, dead, not ours, the link dropped before the command started) falls
back to a direct connection, so a keeper can only make a call faster, never make it fail. The socket
lives in a 0700 folder of this user, and the keeper serves only this user's processes (SO_PEERCRED).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftops import timing
from draftops.errors import InventoryError
from draftops.link.connection import CommandResult, Transport, _checked, _timed_out, connect
from draftops.terminal import clean

if TYPE_CHECKING:
    from draftops.inventory import HostSpec, Inventory

DIR_ENV = "DRAFTOPS_KEEPER_DIR"      # where keepers' sockets live (default: $XDG_RUNTIME_DIR or ~/.cache)
PERSIST_ENV = "DRAFTOPS_PERSIST"     # seconds; overrides every host's `persist:` (0: never keep)
FAILED_BACKOFF_S = 60                # after a keeper could not connect, calls go direct for this long
CONNECT_S = 2.0                      # a live keeper answers its socket at once
HAND_OVER_S = 6.0                    # a call not handed to the host by then is not started (the keeper's rule)
TAKE_S = 5.0                         # then the host has this long to accept it (an exec's reply, a standby's took)
ANSWER_S = HAND_OVER_S + TAKE_S + 2.0  # a keeper that has not said started or refused by then is bypassed
MAX_SOCKET_PATH = 100                # sun_path holds 108 bytes
HEADER = struct.Struct(">cI")        # a frame: kind, length
#: frames: started, stdout, stderr, exit code, refused (nothing ran), late (nothing ran: something did not
#: answer in time, so the caller goes direct and says so)
STARTED, OUT, ERR, EXIT, REFUSED, LATE = b"S", b"O", b"E", b"X", b"R", b"L"
WIRE_VERSION = 3                     # in every keeper's key: a draftops speaking another wire never meets it
MAX_LOG = 1 << 20                    # a keeper's log is started afresh past this size
CONNECTION_FIELDS = ("transport", "address", "user", "port", "key", "jump", "host_key", "known_hosts",
                     "connect_timeout")


# ---------------------------------------------------------------- where and which
def persist_seconds(spec: HostSpec) -> float:
    """How long an idle kept connection to ``spec`` stays (0: none); $DRAFTOPS_PERSIST wins."""
    if spec.transport != "ssh":
        return 0.0
    raw = os.environ.get(PERSIST_ENV)
    if raw is None or raw == "":
        return float(spec.persist)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:
        raise InventoryError(f"${PERSIST_ENV}={raw!r} is not a number of seconds from 0 to 86400; set it to 0 "
                             "to connect afresh on every call, or unset it to use each host's `persist:`.")
    return value


def keeper_dir() -> Path | None:
    """This user's keeper folder, created 0700; None when it is not safely ours (then nothing is kept)."""
    base = os.environ.get(DIR_ENV)
    try:
        if base:
            folder = Path(base)
        elif os.environ.get("XDG_RUNTIME_DIR"):
            folder = Path(os.environ["XDG_RUNTIME_DIR"]) / "draftops-keepers"
        else:
            folder = Path.home() / ".cache" / "draftops" / "keepers"
    except RuntimeError:                           # no home directory to be found
        return None
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = os.lstat(folder)
    except OSError:
        return None
    if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return folder


def keeper_key(chain: list[HostSpec]) -> str:
    """One keeper per way of reaching a host: every hop's connection fields, and this user. (Not the idle
    time: a keeper keeps the one it was started with, and `invoke disconnect` finds it either way.)"""
    hops = [{name: getattr(spec, name) for name in CONNECTION_FIELDS} for spec in chain]
    text = json.dumps({"uid": os.getuid(), "wire": WIRE_VERSION, "chain": hops}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def socket_path(folder: Path, key: str) -> Path:
    return folder / f"{key}.sock"


# ---------------------------------------------------------------- wire
def send_frame(sock: socket.socket, kind: bytes, data: bytes = b"") -> None:
    sock.sendall(HEADER.pack(kind, len(data)) + data)


def read_exact(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    """The next (kind, data), or None at the end of the stream."""
    head = read_exact(sock, HEADER.size)
    if head is None:
        return None
    kind, size = HEADER.unpack(head)
    data = read_exact(sock, size) if size else b""
    return None if data is None else (kind, data)


# ---------------------------------------------------------------- the client transport
class KeptTransport:
    """Commands through a keeper (the Transport interface, plus agent calls to a standby agent)."""

    def __init__(self, spec: HostSpec, path: Path, inventory: Inventory | None,
                 respawn: tuple[list[HostSpec], float, Path, str] | None = None):
        self.spec, self.path, self.inventory, self.respawn = spec, path, inventory, respawn
        self.direct: Transport | None = None
        self.bypassed = False       # the keeper did not answer in time once: the rest goes direct

    # -- the Transport interface
    def run(self, command: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        return self._run({"op": "exec", "command": command}, command, input, timeout, check)

    def stream(self, command: str, on_output: Callable[[bytes], None]) -> int:
        code = self._call({"op": "exec", "command": command, "combine": True}, None, on_output, on_output, None)
        return self._fallback().stream(command, on_output) if code is None else code

    def put(self, local: Path, remote: str) -> None:
        self._fallback().put(local, remote)

    def get(self, remote: str, local: Path) -> None:
        self._fallback().get(remote, local)

    def close(self) -> None:
        if self.direct is not None:
            self.direct.close()
            self.direct = None

    # -- agent calls (draftops/link/agent.py): a standby agent where the keeper has one, else ``command``
    def run_standby(self, standby: dict[str, Any], command: str, input: bytes | None,
                    timeout: float | None = None) -> CommandResult:
        return self._run({"op": "agent", "command": command, **standby}, command, input, timeout, False)

    def stream_standby(self, standby: dict[str, Any], command: str, on_output: Callable[[bytes], None]) -> int:
        request = {"op": "agent", "command": command, "combine": True, **standby}
        code = self._call(request, None, on_output, on_output, None)
        return self._fallback().stream(command, on_output) if code is None else code

    def standby_ready(self, python: str, agent: str, run: str, asked: str | None = None) -> None:
        """Tell the keeper which agent to keep a standby of: ``run`` started by ``python``, for calls that
        name ``python`` or ``asked`` (the interpreter the boot was started with, e.g. ``python3``, which
        resolved to ``python``). Best effort: it is only a shortcut."""
        request = {"op": "standby", "python": python, "agent": agent, "run": run, "asked": asked or python}
        try:
            self._call(request, None,
                       lambda _: None, lambda _: None, CONNECT_S)
        except (OSError, ValueError):
            pass

    # -- plumbing
    def _run(self, request: dict[str, Any], command: str, input: bytes | None, timeout: float | None,
             check: bool) -> CommandResult:
        started = time.monotonic()
        out, err = bytearray(), bytearray()
        try:
            code = self._call(request, input, out.extend, err.extend, timeout)
        except TimeoutError:
            raise _timed_out(self.spec, command, timeout, bytes(out), bytes(err)) from None
        finally:
            timing.ran(command, time.monotonic() - started)
        if code is None:      # the keeper could not start it: nothing ran, so run it directly
            return self._fallback().run(command, input=input, timeout=timeout, check=check)
        return _checked(CommandResult(command, code, bytes(out), bytes(err)), self.spec, check)

    def _call(self, request: dict[str, Any], input: bytes | None, on_out: Callable[[bytes], object],
              on_err: Callable[[bytes], object], timeout: float | None) -> int | None:
        """One request; its exit code, or None when the keeper refused, was gone or did not answer in
        time before starting it (nothing ran: the keeper starts nothing past the request's ``start_by``)."""
        if self.bypassed:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(CONNECT_S)
            try:
                sock.connect(str(self.path))
                sock.sendall(json.dumps({**request, "start_by": time.monotonic() + HAND_OVER_S}).encode() + b"\n")
            except OSError:
                return None
            sender = threading.Thread(target=_send_input, args=(sock, input or b""), daemon=True)
            sender.start()
            sock.settimeout(ANSWER_S if timeout is None else min(timeout, ANSWER_S))
            try:
                if not self._started(sock):
                    return None
            except TimeoutError:
                if timeout is not None and timeout < ANSWER_S:
                    raise                      # the command's own timeout
                self._bypass(f"the keeper did not start the call within {ANSWER_S:g}s")
                return None
            sock.settimeout(timeout)
            return _relayed(sock, on_out, on_err)
        finally:
            sock.close()

    def _started(self, sock: socket.socket) -> bool:
        """Whether the keeper started the call (its first frame); refused, late or gone: nothing ran."""
        try:
            frame = read_frame(sock)
        except ConnectionError:
            return False
        if frame is not None and frame[0] == LATE:
            self._bypass(clean(frame[1].decode("utf-8", "replace")))
        return frame is not None and frame[0] == STARTED

    def _bypass(self, why: str) -> None:
        """Go direct for the rest of this process (nothing of the call ran), saying so in one line."""
        self.bypassed = True
        sys.stderr.write(f"draftops: {self.spec.name}: the kept connection did not answer ({why}); connecting "
                         "directly (`invoke disconnect` ends it)\n")
        sys.stderr.flush()

    def _fallback(self) -> Transport:
        """A direct connection, for what the keeper could not start (it stopped or lost its link): made
        once, and a new keeper is left behind at exit, as by any direct connection."""
        if self.direct is None:
            self.direct = connect(self.spec, self.inventory)
            if self.respawn is not None:
                _spawn_at_exit(*self.respawn)
                self.respawn = None
        return self.direct


def _relayed(sock: socket.socket, on_out: Callable[[bytes], object], on_err: Callable[[bytes], object]) -> int:
    """A started call's output and exit code (-1, said on stderr, when the keeper went away meanwhile)."""
    try:
        while (frame := read_frame(sock)) is not None:
            kind, data = frame
            if kind == OUT:
                on_out(data)
            elif kind == ERR:
                on_err(data)
            elif kind == EXIT:
                return int(data)
    except ConnectionError:
        pass
    on_err(b"\ndraftops: the kept connection to the host was lost during the command\n")
    return -1


def _send_input(sock: socket.socket, data: bytes) -> None:
    """The command's stdin, then end-of-input (on its own thread: a command may answer while reading)."""
    try:
        view = memoryview(data)
        for start in range(0, len(view), 1 << 20):
            sock.sendall(view[start:start + (1 << 20)])
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass                                   # the keeper ended the request; the reader says why


# ---------------------------------------------------------------- attach, spawn, stop
def _ask(path: Path, op: str) -> bool:
    """Send a bodiless request (ping, stop); whether a keeper answered it."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(CONNECT_S)
    try:
        probe.connect(str(path))
        probe.sendall(json.dumps({"op": op}).encode() + b"\n")
        probe.shutdown(socket.SHUT_WR)
        frame = read_frame(probe)
        return frame is not None and frame[0] == EXIT
    except OSError:
        return False
    finally:
        probe.close()


def _alive(path: Path) -> bool:
    return _ask(path, "ping")


def _starting(folder: Path, key: str) -> bool:
    """Whether a keeper of ``key`` holds its lock (it is starting, or stopping) without answering yet."""
    try:
        lock = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(lock)


def _stop(folder: Path, key: str) -> bool:
    """Stop the keeper of ``key``, waiting for one that is still connecting (a call that just exited
    may have left it); whether one was stopped."""
    deadline = time.monotonic() + 30
    while True:
        if _ask(socket_path(folder, key), "stop"):
            return True
        if not _starting(folder, key) or time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def disconnect(spec: HostSpec, inventory: Inventory | None = None) -> bool:
    """Stop the keeper of ``spec``'s connection (as ``ssh -O exit``); whether one was running."""
    folder = keeper_dir()
    if folder is None or spec.transport != "ssh":
        return False
    chain = [*(inventory.jump_chain(spec) if inventory else []), spec]
    return _stop(folder, keeper_key(chain))


def disconnect_all() -> int:
    """Stop every keeper of this user, starting ones too; how many were running."""
    folder = keeper_dir()
    return sum(_stop(folder, lock.stem) for lock in sorted(folder.glob("*.lock"))) if folder else 0


def open_transport(spec: HostSpec, inventory: Inventory | None = None) -> Transport:
    """The transport for ``spec``: through its live keeper when there is one; otherwise a direct
    connection, which leaves a keeper behind as this process exits (when ``persist`` allows)."""
    persist = persist_seconds(spec)
    if persist <= 0:
        return connect(spec, inventory)
    chain = [*(inventory.jump_chain(spec) if inventory else []), spec]
    folder = keeper_dir()
    if folder is None:
        return connect(spec, inventory)
    key = keeper_key(chain)
    path = socket_path(folder, key)
    if len(str(path)) <= MAX_SOCKET_PATH and path.exists() and _alive(path):
        timing.took("keeper", 0.0)
        return KeptTransport(spec, path, inventory, (chain, persist, folder, key))
    transport = connect(spec, inventory)
    _spawn_at_exit(chain, persist, folder, key)
    return transport


#: keepers to start as this process exits (after its own work: they would compete for the CPU)
PENDING: list[tuple[list[HostSpec], float, Path, str]] = []


def _spawn_at_exit(chain: list[HostSpec], persist: float, folder: Path, key: str) -> None:
    if not PENDING:
        import atexit
        atexit.register(spawn_pending)
    PENDING.append((chain, persist, folder, key))


def spawn_pending() -> None:
    """Start the keepers this process asked for (best effort: a keeper is only a shortcut)."""
    while PENDING:
        try:
            spawn(*PENDING.pop())
        except OSError:
            pass


def spawn(chain: list[HostSpec], persist: float, folder: Path, key: str) -> bool:
    """Start a keeper for ``chain`` in the background unless one runs, is starting, or failed lately."""
    path = socket_path(folder, key)
    if len(str(path)) > MAX_SOCKET_PATH:
        return False
    failed = folder / f"{key}.failed"
    try:
        if time.time() - failed.stat().st_mtime < FAILED_BACKOFF_S:
            return False
    except OSError:
        pass
    lock = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)    # held by a live or starting keeper
    except OSError:
        os.close(lock)
        return False
    try:
        return _start(chain, persist, folder, key, lock)
    finally:
        os.close(lock)        # the keeper holds the lock from here: it inherited the locked file


def _start(chain: list[HostSpec], persist: float, folder: Path, key: str, lock: int) -> bool:
    package_parent = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_parent, os.environ.get("PYTHONPATH")]))}
    env.pop("DRAFTOPS_TIMING", None)
    config = {"chain": [spec.model_dump(mode="json") for spec in chain], "persist": persist}
    log_path = folder / f"{key}.log"
    try:
        fresh = log_path.stat().st_size > MAX_LOG
    except OSError:
        fresh = False
    with open(log_path, "wb" if fresh else "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "draftops.link.keeper", str(folder), key, str(lock)],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, cwd=folder,
                                env=env, start_new_session=True, close_fds=True, pass_fds=(lock,))
    assert proc.stdin is not None
    try:
        proc.stdin.write(json.dumps(config).encode())
        proc.stdin.close()
    except OSError:
        return False
    return True
