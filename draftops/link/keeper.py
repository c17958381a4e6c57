"""The keeper: a background process holding one SSH connection open for later `invoke` calls (started by
draftops/link/keeper_link.py as a call exits; ``python -m draftops.link.keeper FOLDER KEY``, the host chain as JSON
on stdin). It serves this user's processes on ``FOLDER/KEY.sock``:

- ``exec``: run a command on a new channel, relaying stdin, stdout, stderr and the exit code;
- ``agent``: the same for a host agent call, given to a standby agent (``agent.pyc --standby``, already
  past the host's shell and python start-up) when one of that python and agent is ready;
- ``standby``: which agent to keep a standby of; ``ping``: whether it is alive; ``stop``: end now.

It exits after ``persist`` idle seconds, when the connection drops (it never reconnects: the next call
connects directly, with every host-key check, and leaves a new keeper), or when its socket is taken.
"""
from __future__ import annotations

import fcntl
import json
import os
import shlex
import signal
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

from draftops.inventory import HostSpec
from draftops.link.connection import ExecUnanswered, SSHTransport
from draftops.link.keeper_link import (
    ERR,
    EXIT,
    HAND_OVER_S,
    LATE,
    OUT,
    REFUSED,
    STARTED,
    TAKE_S,
    read_exact,
    send_frame,
    socket_path,
)
from draftops.onhost.wire import STANDBY_EXPIRES, STANDBY_FLAG, STANDBY_READY, STANDBY_TOOK

MAX_REQUEST = 1 << 22
REQUEST_S = 5.0                      # a client sends its whole request line at once; half a line is dropped
STANDBY_START_S = 30.0
STANDBY_WAIT_S = 3.0                 # how long a call waits for a standby still starting (then: an exec)
TAKE_MARGIN_S = 2.0                  # a standby's expiry comes this much before the keeper stops waiting
OPEN_S = 5.0                         # the host opens a channel within a round trip; a silent link does not
PROBE_S = 5.0                        # how often the keeper asks the host for an answer (a keepalive with a reply)
LINK_S = 10.0                        # no answer within this: the link is silent (a stopped sshd); stop
MAX_BANNER = 1 << 16                 # what shell start-up files may print before a standby's ready line
ACCEPT_S = 0.25                      # how often an idle keeper looks at the clock and the connection
PEERCRED = struct.Struct("3i")


class Late(Exception):
    """Something did not answer in time and nothing ran: the client runs the call directly, and says so."""


def log(message: str) -> None:
    sys.stderr.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} keeper {os.getpid()}: {message}\n")
    sys.stderr.flush()


class Standby:
    """One agent started ahead on its own channel, usable once it has said ready."""

    def __init__(self, keeper: Keeper, python: str, run: str):
        self.channel = keeper.channel(f"exec {shlex.quote(python)} -S {shlex.quote(run)} {STANDBY_FLAG}")
        self.ready = threading.Event()      # said ready
        self.settled = threading.Event()    # said ready, or failed
        self.failed = False
        self.clock = 0.0                    # the standby's clock in its ready line ...
        self.seen_at = 0.0                  # ... and this keeper's when it came

    def expiry(self) -> float:
        """The standby's clock at which a call handed over now is abandoned (docs/protocol.md): before
        the keeper stops waiting for its took line, by more than the line's trip back can take."""
        return self.clock + (time.monotonic() - self.seen_at) + TAKE_S - TAKE_MARGIN_S

    def wait_ready(self) -> None:
        """Read up to the ready line. What the host's shell start-up files print before it (a banner
        from ~/.bashrc) is skipped, as the agent's framing skips it; the standby itself prints
        nothing after it until it has a request, so nothing of the call's output is read here."""
        seen = b""
        self.channel.settimeout(STANDBY_START_S)
        try:
            while (at := seen.find(STANDBY_READY)) < 0 or b"\n" not in seen[at:]:
                chunk = self.channel.recv(4096) if len(seen) <= MAX_BANNER else b""
                if not chunk:
                    raise OSError(f"no ready line from the standby; it said {seen[-200:]!r}")
                seen += chunk
            self.seen_at = time.monotonic()
            self.clock = float(seen[at + len(STANDBY_READY):].split(b"\n", 1)[0])
            self.channel.settimeout(None)
            self.ready.set()
        except (OSError, TimeoutError, ValueError) as exc:
            self.failed = True
            reason = str(exc) or f"{type(exc).__name__}: no ready line within {STANDBY_START_S:.0f} s"
            log(f"a standby agent did not start: {reason}")
            self.channel.close()
        finally:
            self.settled.set()

    @property
    def usable(self) -> bool:
        return self.ready.is_set() and not self.channel.closed and not self.channel.exit_status_ready()


class Keeper:
    def __init__(self, transport: SSHTransport, listener: socket.socket, persist: float):
        self.transport, self.listener, self.persist = transport, listener, persist
        self.lock = threading.Lock()
        self.active = 0
        self.last = time.monotonic()
        self.standbys: dict[tuple[str, str], list[Standby]] = {}
        self.known: dict[tuple[str, str], tuple[str, str]] = {}  # (python asked for, agent) -> (python, run)
        self.stopping = False

    # ---------------------------------------------------------------- the connection
    def alive(self) -> bool:
        link = self.transport.connection.transport
        return link is not None and link.is_active()

    def channel(self, command: str, start_by: float | None = None) -> Any:
        """A channel running ``command``, every wait bounded. Past ``start_by`` (the time its client gave
        for the call to be handed over; it stops waiting soon after) nothing is started any more."""
        left = (time.monotonic() + OPEN_S if start_by is None else start_by) - time.monotonic()
        if left <= 0:
            raise Late(f"the call was not handed over to the host within {HAND_OVER_S:g}s")
        try:
            return self.transport._channel(command, reconnect=False, bound=(min(left, OPEN_S), TAKE_S))
        except ExecUnanswered:
            raise
        except OSError as exc:
            if "did not open" in str(exc):
                raise Late(str(exc)) from None
            raise

    def watch_link(self) -> None:
        """Ask the host for an answer every PROBE_S; one not answered within LINK_S means the link is
        silent (a stopped sshd or a cut cable, which TCP shows no sign of for hours): stop, closing the
        connection, so every call on it ends now and the next call connects directly."""
        link = self.transport.connection.transport
        while not self.stopping and link is not None and link.is_active():
            time.sleep(PROBE_S)
            if not self.stopping and not _answers(link, LINK_S):
                log(f"the SSH connection did not answer a keepalive within {LINK_S:g}s; stopping")
                self.stopping = True
                link.close()

    # ---------------------------------------------------------------- standbys
    def refill(self, key: tuple[str, str]) -> None:
        """Start a standby of ``key`` (on a thread) unless one is ready or starting."""
        with self.lock:
            known = self.known.get(key)
            pool = [s for s in self.standbys.get(key, []) if not s.failed and not s.channel.closed]
            self.standbys[key] = pool
            if known is None or pool or self.stopping:
                return
            try:
                standby = Standby(self, *known)
            except Exception as exc:   # noqa: BLE001 - a standby is only a shortcut
                log(f"could not start a standby agent: {exc}")
                return
            pool.append(standby)
        threading.Thread(target=self._watch, args=(key, standby), daemon=True).start()

    def _watch(self, key: tuple[str, str], standby: Standby) -> None:
        standby.wait_ready()
        if standby.failed:
            with self.lock:
                self.known.pop(key, None)     # told again by the next call that boots the agent

    def take(self, key: tuple[str, str]) -> Standby | None:
        """A standby of ``key`` for one call. One still starting is waited for (a while): it was started
        before this call came, so it is ready no later than a fresh exec would be."""
        with self.lock:
            pool = self.standbys.get(key, [])
            starting = [s for s in pool if not s.failed and not s.channel.closed]
            if not starting:
                return None
            standby = next((s for s in starting if s.ready.is_set()), starting[0])
            pool.remove(standby)
        standby.settled.wait(STANDBY_WAIT_S)
        if standby.usable:
            return standby
        standby.channel.close()          # died while waiting, or too slow to start: not used again
        return None

    # ---------------------------------------------------------------- requests
    def serve(self) -> None:
        self.listener.settimeout(ACCEPT_S)
        threading.Thread(target=self.watch_link, daemon=True).start()
        while not self.stopping:
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                self._maybe_stop()
                continue
            except OSError:
                break
            try:
                uid = PEERCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEERCRED.size))[1]
            except OSError:                # gone before it was looked at
                conn.close()
                continue
            if uid != os.getuid():
                log(f"refused a client of uid {uid}")
                conn.close()
                continue
            with self.lock:
                self.active += 1
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _maybe_stop(self) -> None:
        if not self.alive():
            log("the SSH connection dropped; stopping")
            self.stopping = True
        with self.lock:
            idle = self.active == 0 and time.monotonic() - self.last > self.persist
        if idle:
            log(f"idle for {self.persist:g}s; stopping")
            self.stopping = True

    def _handle(self, conn: socket.socket) -> None:
        try:
            request = _read_request(conn)
            op = request.get("op")
            if op == "ping":
                send_frame(conn, EXIT, b"0")
            elif op == "stop":
                log("asked to stop")
                self.stopping = True
                send_frame(conn, EXIT, b"0")
            elif op == "standby":
                python, agent = str(request["python"]), str(request["agent"])
                keys = {(python, agent), (str(request.get("asked") or python), agent)}
                with self.lock:
                    for key in keys:
                        self.known[key] = (python, str(request["run"]))
                send_frame(conn, EXIT, b"0")
                for key in keys:
                    self.refill(key)
            elif op in ("exec", "agent"):
                self._command(conn, request)
            else:
                send_frame(conn, REFUSED, f"unknown request {op!r}".encode())
        except Exception as exc:   # noqa: BLE001 - one bad request must not stop the keeper
            log(f"request failed: {type(exc).__name__}: {exc}")
        finally:
            conn.close()
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()

    def _command(self, conn: socket.socket, request: dict[str, Any]) -> None:
        standby, key = None, None
        if request["op"] == "agent":
            key = (str(request["python"]), str(request["agent"]))
            standby = self.take(key)
        relay = _Relay(conn)
        try:
            started = self._start(conn, request, standby, relay)
        finally:
            if key is not None:
                self.refill(key)       # the next call finds the next standby starting or ready
        if started:
            send_frame(conn, STARTED)
            relay.run(bool(request.get("combine")))

    def _start(self, conn: socket.socket, request: dict[str, Any], standby: Standby | None, relay: _Relay) -> bool:
        """Hand the call to ``standby`` or an exec; whether it started. What did not start is answered here."""
        start_by = _start_by(request)
        try:
            if standby is not None:
                self._hand_over(standby, request, relay, start_by)
            else:
                relay.start_input(self.channel(str(request["command"]), start_by))
            return True
        except _Gone:
            pass
        except ExecUnanswered:     # sent, never confirmed: it may run; the client reports the call lost
            send_frame(conn, STARTED)
        except Late as exc:        # nothing ran, and nothing will: the client goes direct and says why
            log(f"a call was not started: {exc}")
            send_frame(conn, LATE, str(exc).encode())
        except Exception as exc:   # noqa: BLE001 - nothing ran: the client runs it directly
            send_frame(conn, REFUSED, str(exc).encode())
            if not self.alive():
                self.stopping = True
        return False

    def _hand_over(self, standby: Standby, request: dict[str, Any], relay: _Relay, start_by: float) -> None:
        """Give the call to ``standby`` with its expiry; if the standby ended before taking it, to an exec."""
        if time.monotonic() > start_by:
            standby.channel.close()
            raise Late(f"the call was not handed over to the host within {HAND_OVER_S:g}s")
        header = {**request["header"], STANDBY_EXPIRES: standby.expiry()}
        deadline = time.monotonic() + TAKE_S
        try:
            standby.channel.settimeout(TAKE_S)
            standby.channel.sendall(json.dumps(header).encode() + b"\n")
        except OSError:           # not all of the line went: it cannot run (and expires if it ever does)
            standby.channel.close()
            raise Late(f"a standby agent did not take the call within {TAKE_S:g}s") from None
        relay.start_input(standby.channel, replay=True)     # the input travels while it answers
        taken = _taken(standby.channel, deadline)
        if taken is None:          # other bytes: it may have run; the client reports the call lost
            standby.channel.close()
            raise ExecUnanswered("a standby agent answered something else than its took line")
        if taken == "late":        # past its expiry it never runs the call: nothing ran
            standby.channel.close()
            raise Late(f"a standby agent did not take the call within {TAKE_S:g}s (stopped, or a silent link)")
        if taken == "took":
            relay.took()
            return
        standby.channel.close()    # it ended before reading the call: nothing ran
        if relay.gone:             # (closed because the client went away): nobody waits
            raise _Gone()
        log("a standby agent ended before taking its call; running the call by exec")
        relay.switch(self.channel(str(request["command"]), start_by))


class _Gone(Exception):
    """The client went away before its call started: nobody waits for an answer."""


def _start_by(request: dict[str, Any]) -> float:
    """The client's time (this machine's monotonic clock) by which its call must be handed to the host."""
    value = request.get("start_by")
    return float(value) if isinstance(value, (int, float)) else time.monotonic() + HAND_OVER_S


def _answers(link: Any, seconds: float) -> bool:
    """Whether the host answers a keepalive (OpenSSH replies to any global request) within ``seconds``."""
    answered = threading.Event()

    def ask() -> None:
        try:
            link.global_request("keepalive@openssh.com", wait=True)
        except Exception:   # noqa: BLE001 - the link closed: no answer
            return
        if link.is_active():
            answered.set()

    threading.Thread(target=ask, daemon=True).start()
    return answered.wait(seconds)


def _taken(channel: Any, deadline: float) -> str | None:
    """Whether a standby took the call it was sent: "took" (its took line came first), "ended" (its
    output ended first: it died before reading the call, as one killed after the keeper's look at it
    does, so nothing ran), "late" (no answer by ``deadline``: it will not run it past its expiry), None
    (other bytes: whether it ran is unknown)."""
    seen = b""
    try:
        while len(seen) < len(STANDBY_TOOK):
            channel.settimeout(max(0.0, deadline - time.monotonic()) or 0.001)
            chunk = channel.recv(len(STANDBY_TOOK) - len(seen))
            if not chunk:
                return "ended" if not seen else None
            seen += chunk
    except OSError:          # socket.timeout included
        return "late" if not seen else None
    channel.settimeout(None)
    return "took" if seen == STANDBY_TOOK else None


def _read_request(conn: socket.socket) -> dict[str, Any]:
    """The request line (its input, if any, follows it on the socket and is left there), within
    REQUEST_S and MAX_REQUEST: half a line must not hold the keeper (an active request) for ever."""
    buf = bytearray()
    deadline = time.monotonic() + REQUEST_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ValueError(f"no whole request line within {REQUEST_S:g}s")
        conn.settimeout(left)
        peek = conn.recv(1 << 16, socket.MSG_PEEK)
        cut = peek.find(b"\n")
        chunk = read_exact(conn, cut + 1 if cut >= 0 else len(peek)) if peek else None
        if chunk is None or len(buf) + len(chunk) > MAX_REQUEST:
            raise ValueError("incomplete or oversized request")
        buf += chunk
        if cut >= 0:
            break
    conn.settimeout(None)
    request = json.loads(buf)
    if not isinstance(request, dict):
        raise ValueError("a request is a JSON object")
    return request


class _Relay:
    """One command's streams: the client's input to the channel; the channel's output, errors and exit
    code to the client. A client that goes away closes the channel, as a dropped SSH link would.

    Input given to a standby is also kept until the standby says it took the call, so that a standby
    that died before reading it can be replaced by an exec channel that gets the same bytes."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self.write = threading.Lock()
        self.lock = threading.Lock()           # the channel the input goes to, the replay and EOF
        self.channel: Any = None
        self.replay: bytearray | None = None
        self.ended = False                     # the client's input ended
        self.gone = False                      # the client went away

    def frame(self, kind: bytes, data: bytes = b"") -> None:
        with self.write:
            send_frame(self.conn, kind, data)

    def start_input(self, channel: Any, replay: bool = False) -> None:
        self.channel, self.replay = channel, bytearray() if replay else None
        threading.Thread(target=self.pump_input, daemon=True).start()

    def took(self) -> None:
        """The standby took the call: its input need not be kept any longer."""
        with self.lock:
            self.replay = None

    def switch(self, channel: Any) -> None:
        """Send the input to ``channel`` from now on, starting with all of it sent so far."""
        with self.lock:            # holds the pump back, so the bytes keep their order
            sent, self.replay, self.channel = bytes(self.replay or b""), None, channel
            channel.sendall(sent)
            if self.ended:
                channel.shutdown_write()

    def pump_input(self) -> None:
        while True:
            try:
                chunk = self.conn.recv(1 << 20)
            except OSError:
                chunk = None                   # the client went away
            with self.lock:
                target, kept = self.channel, self.replay is not None
                if chunk and self.replay is not None:
                    self.replay += chunk
                self.ended, self.gone = chunk == b"", chunk is None
            if not chunk:
                try:
                    if chunk is None:
                        target.close()
                    else:
                        target.shutdown_write()    # (switch() does it for a channel that replaces this)
                except OSError:
                    pass
                return
            try:
                target.sendall(chunk)
            except OSError:
                if not kept:                   # (a standby not yet answering: switch() resends it)
                    target.close()
                    return

    def pump_errors(self) -> None:
        try:
            while chunk := self.channel.recv_stderr(1 << 16):
                self.frame(ERR, chunk)
        except OSError:
            self.channel.close()

    def run(self, combine: bool) -> None:
        if combine:
            self.channel.set_combine_stderr(True)
        errors = None if combine else threading.Thread(target=self.pump_errors, daemon=True)
        if errors is not None:
            errors.start()
        try:
            while chunk := self.channel.recv(1 << 16):
                self.frame(OUT, chunk)
            if errors is not None:
                errors.join()
            self.frame(EXIT, str(self.channel.recv_exit_status()).encode())
        except OSError:
            pass
        finally:
            self.channel.close()


def main(argv: list[str]) -> int:
    """``FOLDER KEY [LOCK_FD]``: LOCK_FD is the key's lock file, already locked by the spawner (so a
    keeper is seen as starting from the moment it is spawned); without it the lock is taken here."""
    folder, key = Path(argv[0]), argv[1]
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if len(argv) > 2:
        lock = int(argv[2])
    else:
        lock = os.open(folder / f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return 0                               # another keeper holds this connection
    try:
        config = json.loads(sys.stdin.read())
        chain = [HostSpec.model_validate(doc) for doc in config["chain"]]
        transport = SSHTransport(chain[-1], hops=chain[:-1])
    except Exception as exc:   # noqa: BLE001 - every failure: calls go direct for a while
        return _failed(folder, key, f"could not connect: {exc}")
    path = socket_path(folder, key)
    try:
        listener, inode = _listen(folder, key, path)
    except OSError as exc:                         # a full disk, a folder made read-only ...
        transport.close()
        return _failed(folder, key, f"could not listen on {path}: {exc}")
    (folder / f"{key}.failed").unlink(missing_ok=True)
    log(f"holding {chain[-1].describe()} for {config['persist']:g}s idle")
    keeper = Keeper(transport, listener, float(config["persist"]))
    try:
        keeper.serve()
    finally:
        try:
            if os.stat(path).st_ino == inode:      # still ours: a newer keeper's socket stays
                path.unlink()
        except OSError:
            pass
        listener.close()
        transport.close()
    return 0


def _listen(folder: Path, key: str, path: Path) -> tuple[socket.socket, int]:
    """The keeper's socket, made under a staging name and renamed into place (a dead keeper's socket
    is replaced at once); its inode, to remove it at the end only if it is still ours."""
    staging = folder / f"{key}.sock.{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(str(staging))
        os.chmod(staging, 0o600)
        listener.listen(64)
        os.replace(staging, path)
        return listener, os.stat(path).st_ino
    except OSError:
        listener.close()
        staging.unlink(missing_ok=True)
        raise


def _failed(folder: Path, key: str, why: str) -> int:
    """Note the failure (calls connect directly, and no keeper is tried, for a while) and end."""
    log(why)
    try:
        (folder / f"{key}.failed").touch()
    except OSError:
        pass
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
