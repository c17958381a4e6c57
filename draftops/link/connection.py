"""One small interface (run / stream / put / get) over SSH (Fabric) or this machine, so every task is
written once and runs on the built-in ``local`` host too.

Commands go through raw channels of the Fabric connection rather than ``Connection.run``: stdin and
stdout must carry binary tar streams for sync and pull, and Fabric's inline env is not quoted.
"""
from __future__ import annotations

import io
import logging
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from draftops import timing
from draftops.errors import (
    AuthFailed,
    FailedCommand,
    HostKeyRejected,
    HostUnreachable,
    InventoryError,
    RemoteError,
    host_prefix,
)

if TYPE_CHECKING:   # paramiko and fabric are imported when a connection opens: `invoke --list` needs neither
    import paramiko
    from fabric import Connection

    from draftops.inventory import HostSpec, Inventory

log = logging.getLogger(__name__)
KEEPALIVE_S = 15
CONNECT_ATTEMPTS = 3
SEND_CHUNK = 1 << 20
# Tried first when the server offers them (benchmarks/sync.py, 50 MB over loopback): AES-GCM needs no
# separate MAC pass; encrypt-then-MAC for servers without GCM. Everything else paramiko offers stays
# behind them, so no server that worked before is refused. Host-key and key-exchange choices are
# untouched, and so is the 2 MiB channel window (16 MiB was no faster and once stalled a download).
FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")
FAST_MACS = ("hmac-sha2-256-etm@openssh.com", "hmac-sha2-512-etm@openssh.com")


class _ParamikoToDebug(logging.Handler):
    """paramiko logs a failed handshake at ERROR with a traceback from its transport thread, which
    Python's last-resort handler prints to the terminal before draftops' own one-paragraph error.
    Those records are kept, at DEBUG level, under draftops' logger (shown only when asked for)."""

    def emit(self, record: logging.LogRecord) -> None:
        log.debug("paramiko %s: %s", record.levelname, record.getMessage())


def _quiet_paramiko() -> None:
    paramiko_log = logging.getLogger("paramiko")
    if not paramiko_log.handlers:   # a handler set up on purpose (paramiko.util.log_to_file) stays
        paramiko_log.addHandler(_ParamikoToDebug())
        paramiko_log.propagate = False


_quiet_paramiko()


@dataclass
class CommandResult:
    """What a finished command left behind."""

    command: str
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Transport(Protocol):
    """What the rest of draftops needs from a host connection."""

    spec: HostSpec

    def run(self, command: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult: ...

    def stream(self, command: str, on_output: Callable[[bytes], None]) -> int: ...

    def put(self, local: Path, remote: str) -> None: ...

    def get(self, remote: str, local: Path) -> None: ...

    def close(self) -> None: ...

    def run_standby(self, standby: dict[str, Any], command: str, input: bytes | None,
                    timeout: float | None = None) -> CommandResult | None:
        """An agent call or quick tool given to a standby agent (a kept connection's,
        draftops/link/keeper_link.py), ``command`` where none can take it; None: this transport keeps
        no standbys, and the caller runs ``command`` itself."""
        ...

    def stream_standby(self, standby: dict[str, Any], command: str, on_output: Callable[[bytes], None]) -> int | None:
        """``run_standby`` for a streaming agent call; None: no standbys here."""
        ...

    def standby_ready(self, python: str, agent: str, run: str, asked: str | None = None) -> None:
        """Which agent to keep a standby of (the session's boot says it); nothing where none are kept."""
        ...


class NoStandbys:
    """The standby calls of a transport that keeps no standby agents (every call is an exec)."""

    def run_standby(self, standby: dict[str, Any], command: str, input: bytes | None,
                    timeout: float | None = None) -> CommandResult | None:
        return None

    def stream_standby(self, standby: dict[str, Any], command: str, on_output: Callable[[bytes], None]) -> int | None:
        return None

    def standby_ready(self, python: str, agent: str, run: str, asked: str | None = None) -> None:
        return None


def _checked(result: CommandResult, spec: HostSpec, check: bool) -> CommandResult:
    if check and not result.ok:
        failed = FailedCommand.of(spec.name, result.command, result.exit_code, result.stdout, result.stderr)
        raise RemoteError(f"{host_prefix(spec.name, spec.describe())}: command exited {result.exit_code}: "
                          f"{result.command[:300]}\n{failed.stderr.strip()}", failed)
    return result


def _timed_out(spec: HostSpec, command: str, timeout: float | None, out: bytes, err: bytes) -> RemoteError:
    return RemoteError(f"{host_prefix(spec.name, spec.describe())}: command timed out after {timeout}s: "
                       f"{command[:200]}", FailedCommand.of(spec.name, command, None, out, err))


class LocalTransport(NoStandbys):
    """Runs commands on this machine with ``sh -c``; same semantics as the SSH transport."""

    def __init__(self, spec: HostSpec):
        self.spec = spec

    def run(self, command: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        started = time.monotonic()
        try:
            proc = subprocess.run(["sh", "-c", command], input=input if input is not None else b"",
                                  capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise _timed_out(self.spec, command, timeout, exc.stdout or b"", exc.stderr or b"") from None
        finally:
            timing.ran(command, time.monotonic() - started)
        return _checked(CommandResult(command, proc.returncode, proc.stdout, proc.stderr), self.spec, check)

    def stream(self, command: str, on_output: Callable[[bytes], None]) -> int:
        proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        stdout = proc.stdout
        assert isinstance(stdout, io.BufferedReader)
        try:
            while chunk := stdout.read1(65536):
                on_output(chunk)
            return proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    def put(self, local: Path, remote: str) -> None:
        Path(remote).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local, remote)

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(remote, local)

    def close(self) -> None:
        pass


def _accept_new_policy(spec: HostSpec) -> paramiko.MissingHostKeyPolicy:
    """Trust on first use, as OpenSSH's StrictHostKeyChecking=accept-new: record the key, never replace one.

    A key that cannot be recorded is refused: trusted only in memory, the connect's retry would take it,
    and every later call would trust whatever key the host showed, with nothing to compare against."""
    import paramiko

    known_hosts = spec.known_hosts

    class AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
        def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
            path = Path(known_hosts)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "a", encoding="utf-8") as fh:
                    fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            except OSError as exc:
                raise HostKeyRejected(
                    f"{host_prefix(spec.name, spec.describe())}: cannot record its host key ({key.get_name()} "
                    f"{key.fingerprint}) in {known_hosts} ({exc.strerror or exc}), and `host_key: accept-new` "
                    "trusts a key on first use only by recording it. Fix `known_hosts:` in hosts.yaml (a file "
                    "in a folder you can write), then connect again.") from None
            client.get_host_keys().add(hostname, key.get_name(), key)
            log.warning("accepted new host key %s %s for %s into %s", key.get_name(),
                        key.fingerprint, hostname, path)

    return AcceptNewPolicy()


def _first(preferred: tuple[str, ...], offered: tuple[str, ...]) -> tuple[str, ...]:
    """``offered`` with those of ``preferred`` it holds moved to the front (in ``preferred``'s order)."""
    return tuple(name for name in preferred if name in offered) + tuple(n for n in offered if n not in preferred)


def _fast_transport(sock: object, **kwargs: object) -> paramiko.Transport:
    """paramiko's transport with the fast ciphers and MACs first (SSHClient.connect's transport_factory)."""
    import paramiko

    transport = paramiko.Transport(sock, **kwargs)   # type: ignore[arg-type]
    options = transport.get_security_options()
    options.ciphers = _first(FAST_CIPHERS, tuple(options.ciphers))
    options.digests = _first(FAST_MACS, tuple(options.digests))
    return transport


def _check_key_file(spec: HostSpec) -> None:
    """Load ``key:`` as paramiko's authentication will (the same key classes; a ``-cert.pub`` names its
    private key), so a file that is no private key, or one locked by a passphrase, is named as such.
    paramiko's own failure would read "could not be reached" after three attempts, or "rejected key"
    though the host never saw it."""
    import paramiko

    assert spec.key is not None
    path = spec.key.removesuffix("-cert.pub")
    locked = False
    for key_class in (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key):
        try:
            key_class.from_private_key_file(path)
            return
        except paramiko.PasswordRequiredException:
            locked = True
        except (paramiko.SSHException, ValueError, TypeError, IndexError, OSError):
            continue
    where = host_prefix(spec.name)
    if locked:
        raise InventoryError(
            f"{where}: key file {path} is protected by a passphrase, and draftops cannot ask for it. Load the "
            "key into your ssh-agent (ssh-add) and remove `key:` from the entry in hosts.yaml (then the "
            "agent's keys are used), or name a key without a passphrase.")
    raise InventoryError(
        f"{where}: key file {path} is not a private key draftops can read (RSA, ECDSA or Ed25519, OpenSSH "
        "or PEM format); `key:` in hosts.yaml names the private half (id_ed25519, not id_ed25519.pub).")


def _make_connection(spec: HostSpec, gateway: Connection | None) -> Connection:
    import paramiko
    from fabric import Config, Connection

    if spec.key and not Path(spec.key).is_file():
        raise InventoryError(f"{host_prefix(spec.name)}: key file {spec.key} does not exist; fix `key:` in "
                             "hosts.yaml or create the key with ssh-keygen.")
    if spec.key:
        _check_key_file(spec)
    config = Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False}})
    # No SSH compression: sync payloads are gzipped already where that pays (small, text-heavy ones),
    # and big binaries do not shrink; compressing again only costs CPU at both ends.
    connect_kwargs: dict[str, object] = {"banner_timeout": spec.connect_timeout,
                                         "auth_timeout": spec.connect_timeout, "compress": False,
                                         "transport_factory": _fast_transport}
    if spec.key:
        connect_kwargs.update(key_filename=[spec.key], look_for_keys=False, allow_agent=False)
    conn = Connection(spec.address or "", user=spec.user, port=spec.port, config=config,
                      gateway=gateway, connect_timeout=max(1, int(round(spec.connect_timeout))),
                      connect_kwargs=connect_kwargs, inline_ssh_env=False)
    if Path(spec.known_hosts).is_file():
        conn.client.load_host_keys(spec.known_hosts)
    policy = (_accept_new_policy(spec) if spec.host_key == "accept-new"
              else paramiko.RejectPolicy())
    conn.client.set_missing_host_key_policy(policy)
    return conn


def _reason(exc: BaseException) -> str:
    """An exception as a short reason; some paramiko errors have an empty message."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _open_one(conn: Connection, spec: HostSpec, via: str) -> None:
    """Open one SSH connection (its gateway must be open already) with retries inside the connect
    timeout, mapping every failure to a one-paragraph ConnectError. ``via`` says which hop this is."""
    import paramiko
    from paramiko.ssh_exception import NoValidConnectionsError

    who = f"{host_prefix(spec.name, spec.describe())}{via}"
    deadline = time.monotonic() + spec.connect_timeout
    delay = 0.5
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        error: BaseException
        try:
            conn.open()
            return
        except paramiko.BadHostKeyException as exc:
            raise HostKeyRejected(
                f"{who} presented a host key that differs from the one in {spec.known_hosts} "
                f"({exc.expected_key.get_name()}). Someone may be intercepting the connection, or the host "
                f"was reinstalled; check with its owner, then remove the old line with `ssh-keygen -R` on "
                f"{spec.known_hosts}.") from None
        except paramiko.AuthenticationException as exc:
            if _link_up(conn):
                raise AuthFailed(
                    f"{who} rejected key {spec.key or '(agent/default keys)'}. Put its .pub into the host's "
                    f"~/.ssh/authorized_keys for user {spec.user!r}, or fix `key:`/`user:` in hosts.yaml."
                ) from None
            # paramiko says "Authentication failed." for a link that dropped during authentication too
            error = EOFError(f"the connection closed during authentication ({_reason(exc)}), so the key "
                             "was neither accepted nor refused")
        except paramiko.SSHException as exc:
            if "known_hosts" in str(exc):
                raise HostKeyRejected(
                    f"{who} has a host key that is not in {spec.known_hosts} and its entry says "
                    f"`host_key: strict`. Verify the key and add it (ssh-keyscan -p {spec.port} "
                    f"{spec.address} >> {spec.known_hosts}), or set `host_key: accept-new` to trust it on "
                    "first use.") from None
            error = exc
        except (NoValidConnectionsError, TimeoutError, OSError, EOFError) as exc:
            error = exc
        conn.close()
        remaining = deadline - time.monotonic()
        if attempt == CONNECT_ATTEMPTS or remaining <= delay:
            raise HostUnreachable(
                f"{who} could not be reached within {spec.connect_timeout:g}s after {attempt} attempt(s): "
                f"{_reason(error)}. Check that the box is up and `address`/`port`/`jump` in hosts.yaml "
                "are right (try the same with plain ssh).") from None
        time.sleep(delay)
        delay *= 2


def transport_failures() -> tuple[type[BaseException], ...]:
    """What a transport call raises when its link fails under it: OSError and EOFError (a socket, the
    keeper's), and paramiko's SSHException once an SSH connection has loaded paramiko (the local host
    never imports it). ``draftops.link.agent`` maps these to ``LinkDropped`` where the call is made."""
    paramiko = sys.modules.get("paramiko")
    return (OSError, EOFError) + ((paramiko.SSHException,) if paramiko else ())


def _link_errors() -> tuple[type[BaseException], ...]:
    """What paramiko raises when the link drops as a channel opens or takes input (EOFError from its
    packetizer, SSHException "Unable to open channel", OSError "Socket is closed")."""
    import paramiko

    return (paramiko.SSHException, EOFError, OSError)


def _link_up(conn: Connection) -> bool:
    """Whether ``conn``'s SSH transport is still connected (a host that refuses a key keeps it open)."""
    transport = conn.client.get_transport()
    return transport is not None and transport.is_active()


def _no_delay(sock: object) -> None:
    """Send small SSH packets at once (TCP_NODELAY, as OpenSSH does): a command's last bytes and its
    end-of-input are two small packets, and with Nagle's rule the second waited for the host's delayed
    ACK (40 ms), which an agent already waiting for its input (a kept connection's standby) shows.
    A hop behind a jump host is a channel, not a socket: its jump host's socket carries it."""
    import socket

    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class ExecUnanswered(OSError):
    """The host did not accept a command in time after it was sent: it may run all the same."""


def _bounded_exec(transport: paramiko.Transport, command: str, open_s: float, exec_s: float) -> paramiko.Channel:
    """``open_session`` + ``exec_command`` with both waits bounded (paramiko waits an hour for the first
    and for ever for the second): see SSHTransport._channel."""
    import paramiko

    try:
        channel = transport.open_session(timeout=open_s)
    except paramiko.SSHException as exc:
        raise OSError(f"the host did not open a channel within {open_s:g}s ({_reason(exc)})") from None
    watchdog = threading.Timer(exec_s, channel.close)     # a closed channel ends exec_command's wait
    watchdog.daemon = True
    watchdog.start()
    try:
        channel.exec_command(command)
    except paramiko.SSHException as exc:
        channel.close()
        if watchdog.finished.is_set():
            raise ExecUnanswered(f"the host did not accept the command within {exec_s:g}s") from None
        raise OSError(f"the host refused the command ({_reason(exc)})") from None
    finally:
        watchdog.cancel()
    return channel


class SSHTransport(NoStandbys):
    """A Fabric connection behind its chain of jump hosts (Fabric gateways), opened once, with
    keepalive and retries. Every hop is opened in turn, so an error names the hop that failed."""

    def __init__(self, spec: HostSpec, inventory: Inventory | None = None, hops: list[HostSpec] | None = None):
        self.spec = spec
        self.hops = hops if hops is not None else inventory.jump_chain(spec) if inventory else []
        gateway: Connection | None = None
        self.gateways: list[Connection] = []
        for hop in self.hops:
            gateway = _make_connection(hop, gateway)
            self.gateways.append(gateway)
        self.connection = _make_connection(spec, gateway)
        self._open()

    def _open(self) -> None:
        chain = [*self.hops, self.spec]
        try:
            for index, (hop, conn) in enumerate(zip(chain, [*self.gateways, self.connection], strict=True)):
                _open_one(conn, hop, self._role(index))
                assert conn.transport is not None
                conn.transport.set_keepalive(KEEPALIVE_S)
                _no_delay(conn.transport.sock)
                if index + 1 < len(chain):   # this hop makes the next one's TCP connection: bound it
                    conn.transport.channel_timeout = chain[index + 1].connect_timeout
        except BaseException:
            self.close()
            raise

    def _role(self, index: int) -> str:
        """How hop ``index`` of the chain is described in errors (empty for a direct connection)."""
        role = ""
        if index < len(self.hops):
            role = f", jump host {index + 1} of {len(self.hops)} for {self.spec.name!r},"
        if index:
            role += f" via {self.hops[index - 1].name!r}"
        return role

    def _channel(self, command: str, reconnect: bool = True, bound: tuple[float, float] | None = None
                 ) -> paramiko.Channel:
        """A channel running ``command``; a dropped connection is opened again first, unless
        ``reconnect`` is False (the keeper: it never reconnects), then it is an OSError.

        ``bound`` (the keeper: a link that went silent must not hold a call for paramiko's hour):
        (seconds for the host to open the channel, seconds for it to accept the command). A channel not
        opened in time is an OSError (the command was never sent); a command not accepted in time is
        ``ExecUnanswered`` (it was sent, so it may still run)."""
        transport = self.connection.transport
        if transport is None or not transport.is_active():
            if not reconnect:
                raise OSError("the SSH connection is closed")
            self.close()
            self._open()
            transport = self.connection.transport
        assert transport is not None
        if bound is None:
            channel = transport.open_session()
            channel.exec_command(f"sh -c {shlex.quote(command)}")
            return channel
        return _bounded_exec(transport, f"sh -c {shlex.quote(command)}", *bound)

    def run(self, command: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        started = time.monotonic()
        try:
            channel = self._channel(command)
        except _link_errors() as exc:
            return _checked(CommandResult(command, -1, b"", self._dropped(exc)), self.spec, check)
        channel.settimeout(timeout)
        out, err = bytearray(), bytearray()

        def drain_stderr() -> None:
            # stderr has its own reader: blocking on stdout while stderr fills the window deadlocks
            while chunk := channel.recv_stderr(1 << 16):
                err.extend(chunk)

        reader = threading.Thread(target=drain_stderr, daemon=True)
        reader.start()
        try:
            data = input or b""
            try:
                for start in range(0, len(data), SEND_CHUNK):   # one big sendall is O(n^2) in paramiko
                    channel.sendall(data[start:start + SEND_CHUNK])
                channel.shutdown_write()
            except TimeoutError:
                raise
            except _link_errors():   # it ended without reading all of it, or the link dropped: its exit says
                pass
            while chunk := channel.recv(1 << 16):
                out += chunk
            reader.join(timeout)
            code = channel.recv_exit_status()
        except TimeoutError:
            raise _timed_out(self.spec, command, timeout, bytes(out), bytes(err)) from None
        finally:
            channel.close()
            timing.ran(command, time.monotonic() - started)
        if code == -1 and not self._up():
            err += self._dropped(None)
        return _checked(CommandResult(command, code, bytes(out), bytes(err)), self.spec, check)

    def stream(self, command: str, on_output: Callable[[bytes], None]) -> int:
        try:
            channel = self._channel(command)
        except _link_errors():
            return -1                    # the caller says the stream ended early (jobs.follow: how to re-attach)
        channel.set_combine_stderr(True)
        channel.shutdown_write()
        try:
            while chunk := channel.recv(1 << 16):
                on_output(chunk)
            return channel.recv_exit_status()
        finally:
            channel.close()

    def _up(self) -> bool:
        transport = self.connection.transport
        return transport is not None and transport.is_active()

    def _dropped(self, exc: BaseException | None) -> bytes:
        """What a command whose link dropped says on stderr (exit -1: no exit status came back)."""
        when = (f"as the command was being started ({_reason(exc)})" if exc
                else "before the command's exit status came back")
        return (f"\ndraftops: the SSH connection to {self.spec.describe()} dropped {when}; "
                "the next call connects again\n").encode()

    def put(self, local: Path, remote: str) -> None:
        self.connection.put(str(local), remote)

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self.connection.get(remote, str(local))

    def close(self) -> None:
        """Close the target first, then each jump host from the innermost out."""
        for conn in [self.connection, *reversed(self.gateways)]:
            conn.close()


def connect(spec: HostSpec, inventory: Inventory | None = None) -> Transport:
    """Open the right transport for ``spec``."""
    if spec.transport == "local":
        return LocalTransport(spec)
    started = time.monotonic()
    import fabric  # noqa: F401  (imported here, when a connection opens, and timed on its own)
    import paramiko  # noqa: F401

    timing.took("ssh library import", time.monotonic() - started)
    started = time.monotonic()
    transport = SSHTransport(spec, inventory)
    timing.took("handshake", time.monotonic() - started)
    return transport
