"""One small interface (run / stream / put / get) over SSH (Fabric) or this machine, so every task is
written once and runs on the built-in ``local`` host too.

Commands go through raw channels of the Fabric connection rather than ``Connection.run``: stdin and
stdout must carry binary tar streams for sync and pull, and Fabric's inline env is not quoted.
"""
from __future__ import annotations

import logging
import shlex
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

import paramiko
from fabric import Config, Connection
from paramiko.ssh_exception import NoValidConnectionsError

from draftops.errors import AuthFailed, HostKeyRejected, HostUnreachable, InventoryError, RemoteError
from draftops.inventory import HostSpec, Inventory

log = logging.getLogger(__name__)
KEEPALIVE_S = 15
CONNECT_ATTEMPTS = 3
SEND_CHUNK = 1 << 20


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


def _checked(result: CommandResult, spec: HostSpec, check: bool) -> CommandResult:
    if check and not result.ok:
        tail = result.stderr.decode("utf-8", "replace").strip()[-2000:]
        raise RemoteError(
            f"Host {spec.name!r} ({spec.describe()}): command exited {result.exit_code}: "
            f"{result.command[:300]}\n{tail}",
            exit_code=result.exit_code, stdout=result.text, stderr=tail)
    return result


class LocalTransport:
    """Runs commands on this machine with ``sh -c``; same semantics as the SSH transport."""

    def __init__(self, spec: HostSpec):
        self.spec = spec

    def run(self, command: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        proc = subprocess.run(["sh", "-c", command], input=input if input is not None else b"",
                              capture_output=True, timeout=timeout)
        return _checked(CommandResult(command, proc.returncode, proc.stdout, proc.stderr), self.spec, check)

    def stream(self, command: str, on_output: Callable[[bytes], None]) -> int:
        proc = subprocess.Popen(["sh", "-c", command], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        try:
            while chunk := proc.stdout.read1(65536):
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


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """Trust on first use, as OpenSSH's StrictHostKeyChecking=accept-new: record the key, never replace one."""

    def __init__(self, known_hosts: str):
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        path = Path(self.known_hosts)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        log.warning("accepted new host key %s %s for %s into %s", key.get_name(),
                    key.fingerprint, hostname, path)


def _make_connection(spec: HostSpec, gateway: Connection | None) -> Connection:
    if spec.key and not Path(spec.key).is_file():
        raise InventoryError(f"Host {spec.name!r}: key file {spec.key} does not exist; fix `key:` in "
                             "hosts.yaml or create the key with ssh-keygen.")
    config = Config(overrides={"load_ssh_configs": False, "run": {"in_stream": False}})
    connect_kwargs: dict[str, object] = {"banner_timeout": spec.connect_timeout,
                                         "auth_timeout": spec.connect_timeout}
    if spec.key:
        connect_kwargs.update(key_filename=[spec.key], look_for_keys=False, allow_agent=False)
    conn = Connection(spec.address or "", user=spec.user, port=spec.port, config=config,
                      gateway=gateway, connect_timeout=max(1, int(round(spec.connect_timeout))),
                      connect_kwargs=connect_kwargs, inline_ssh_env=False)
    if Path(spec.known_hosts).is_file():
        conn.client.load_host_keys(spec.known_hosts)
    policy = (_AcceptNewPolicy(spec.known_hosts) if spec.host_key == "accept-new"
              else paramiko.RejectPolicy())
    conn.client.set_missing_host_key_policy(policy)
    return conn


class SSHTransport:
    """A Fabric connection (with its jump-host gateway), opened once, with keepalive and retries."""

    def __init__(self, spec: HostSpec, inventory: Inventory | None = None):
        self.spec = spec
        jump = inventory.parse_jump(spec) if inventory else None
        gateway = _make_connection(jump, None) if jump else None
        self.connection = _make_connection(spec, gateway)
        self._open()

    def _open(self) -> None:
        spec = self.spec
        deadline = time.monotonic() + spec.connect_timeout
        delay = 0.5
        for attempt in range(1, CONNECT_ATTEMPTS + 1):
            try:
                self.connection.open()
                break
            except paramiko.BadHostKeyException as exc:
                raise HostKeyRejected(
                    f"Host {spec.name!r} ({spec.describe()}) presented a host key that differs from the "
                    f"one in {spec.known_hosts} ({exc.expected_key.get_name()}). Someone may be "
                    "intercepting the connection, or the host was reinstalled; check with its owner, "
                    f"then remove the old line with `ssh-keygen -R` on {spec.known_hosts}.") from None
            except paramiko.AuthenticationException:
                raise AuthFailed(
                    f"Host {spec.name!r} ({spec.describe()}) rejected key {spec.key or '(agent/default keys)'}"
                    f". Put its .pub into the host's ~/.ssh/authorized_keys for user {spec.user!r}, or fix "
                    "`key:`/`user:` in hosts.yaml.") from None
            except paramiko.SSHException as exc:
                if "known_hosts" in str(exc) or "not found in known_hosts" in str(exc):
                    raise HostKeyRejected(
                        f"Host {spec.name!r} ({spec.describe()}) has a host key that is not in "
                        f"{spec.known_hosts} and its entry says `host_key: strict`. Verify the key and "
                        f"add it (ssh-keyscan -p {spec.port} {spec.address} >> {spec.known_hosts}), or "
                        "set `host_key: accept-new` to trust it on first use.") from None
                error: Exception = exc
            except (NoValidConnectionsError, socket.timeout, TimeoutError, OSError, EOFError) as exc:
                error = exc
            self.connection.close()
            remaining = deadline - time.monotonic()
            if attempt == CONNECT_ATTEMPTS or remaining <= delay:
                raise HostUnreachable(
                    f"Host {spec.name!r} ({spec.describe()}) could not be reached within "
                    f"{spec.connect_timeout:g}s after {attempt} attempt(s): {error}. Check that the box is "
                    "up and `address`/`port`/`jump` in hosts.yaml are right (try the same with plain "
                    "ssh).") from None
            time.sleep(delay)
            delay *= 2
        assert self.connection.transport is not None
        self.connection.transport.set_keepalive(KEEPALIVE_S)

    def _channel(self, command: str) -> paramiko.Channel:
        transport = self.connection.transport
        if transport is None or not transport.is_active():
            self.connection.close()
            self._open()
            transport = self.connection.transport
        assert transport is not None
        channel = transport.open_session()
        channel.exec_command(f"sh -c {shlex.quote(command)}")
        return channel

    def run(self, command: str, *, input: bytes | None = None, timeout: float | None = None,
            check: bool = True) -> CommandResult:
        channel = self._channel(command)
        channel.settimeout(timeout)
        out, err = bytearray(), bytearray()

        def drain_stderr() -> None:
            # stderr has its own reader: blocking on stdout while stderr fills the window deadlocks
            while chunk := channel.recv_stderr(1 << 16):
                err.extend(chunk)

        reader = threading.Thread(target=drain_stderr, daemon=True)
        reader.start()
        try:
            if input:
                view = memoryview(input)
                for start in range(0, len(view), SEND_CHUNK):   # one big sendall is O(n^2) in paramiko
                    channel.sendall(view[start:start + SEND_CHUNK])
            channel.shutdown_write()
            while chunk := channel.recv(1 << 16):
                out += chunk
            reader.join(timeout)
            code = channel.recv_exit_status()
        except socket.timeout:
            raise RemoteError(f"Host {self.spec.name!r}: command timed out after {timeout}s: {command[:200]}") from None
        finally:
            channel.close()
        return _checked(CommandResult(command, code, bytes(out), bytes(err)), self.spec, check)

    def stream(self, command: str, on_output: Callable[[bytes], None]) -> int:
        channel = self._channel(command)
        channel.set_combine_stderr(True)
        channel.shutdown_write()
        try:
            while chunk := channel.recv(1 << 16):
                on_output(chunk)
            return channel.recv_exit_status()
        finally:
            channel.close()

    def put(self, local: Path, remote: str) -> None:
        self.connection.put(str(local), remote)

    def get(self, remote: str, local: Path) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        self.connection.get(remote, str(local))

    def close(self) -> None:
        self.connection.close()


def connect(spec: HostSpec, inventory: Inventory | None = None) -> Transport:
    """Open the right transport for ``spec``."""
    if spec.transport == "local":
        return LocalTransport(spec)
    return SSHTransport(spec, inventory)
