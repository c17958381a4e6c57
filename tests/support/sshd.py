"""A real OpenSSH sshd on 127.0.0.1 for the SSH test suite (random port, generated keys, no PAM)."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.proc import pids_whose, stat_fields

SSHD = shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin") or "/usr/sbin/sshd"

CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {d}/ssh_host_ed25519_key
PidFile {d}/sshd.pid
AuthorizedKeysFile {authorized}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
AllowTcpForwarding yes
Subsystem sftp internal-sftp
MaxSessions 64
MaxStartups 64:30:128
LogLevel {log_level}
"""


@dataclass
class Sshd:
    """One running sshd and what a client needs to reach it."""

    port: int
    key: Path
    host_key_pub: Path
    log: Path
    proc: subprocess.Popen
    host: str = "127.0.0.1"
    user: str = "root"

    def stop_sessions(self) -> None:
        """Drop every SSH connection now (their sshd processes go; the listener stays): a dropped link."""
        for pid in children(self.proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def stop(self) -> None:
        """Stop the listener and its per-connection processes: a test's client that did not close its
        connection would otherwise keep a session (and its shell) after the test. Detached jobs are in
        sessions of their own and are left to the test that started them."""
        sessions = children(self.proc.pid)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pid in sessions:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    return pids_whose("stat", lambda stat: int(stat_fields(stat)[1]) == pid)


def keygen(path: Path) -> Path:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_banner(port: int, proc: subprocess.Popen, log: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                if sock.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd on port {port} did not answer: {log.read_text()[-2000:]}")


def start_sshd(workdir: Path, client_key: Path, log_level: str = "VERBOSE", extra_config: str = "") -> Sshd:
    """Start sshd in the foreground (-D) with its own config, host key and authorized_keys.

    ``extra_config`` is appended to the config (e.g. ``SetEnv HOME=...`` for a test home whose shell
    start-up files print a banner).

    DEBUG1 makes sshd log forwarded channels (to prove a jump went through it), but it also sends
    debug lines to exec sessions' stderr, so only the jump server uses it.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o700)
    keygen(workdir / "ssh_host_ed25519_key")
    authorized = workdir / "authorized_keys"
    shutil.copy(client_key.with_suffix(".pub"), authorized)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)   # Debian's privilege-separation directory
    port = free_port()
    config = workdir / "sshd_config"
    config.write_text(CONFIG.format(port=port, d=workdir, authorized=authorized, log_level=log_level)
                      + extra_config)
    subprocess.run([SSHD, "-t", "-f", str(config)], check=True)
    log = workdir / "sshd.log"
    with open(log, "wb") as out:             # sshd keeps its own copy of the descriptor
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=out, stderr=subprocess.STDOUT)
    _wait_for_banner(port, proc, log)
    return Sshd(port, client_key, workdir / "ssh_host_ed25519_key.pub", log, proc)


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None
