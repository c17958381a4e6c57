"""A connected host: its inventory entry, its transport, its resolved root and the host agent there.

One ``Host`` per host name per process, so chained tasks (``invoke sync test-drafter``) share one
connection and one root check. The root check and agent install ride along with the first agent
command of the session (one SSH exec instead of two).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import secrets
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftops import hostagent, timing
from draftops.connection import Transport, connect
from draftops.errors import RemoteError, RootError
from draftops.terminal import clean

if TYPE_CHECKING:   # the inventory (pydantic, yaml) is loaded when a host is opened, not at import
    from draftops.inventory import HostSpec, Inventory

AGENT_SOURCE = Path(hostagent.__file__).read_text()
AGENT_NAME = f"agent-{hashlib.sha256(AGENT_SOURCE.encode()).hexdigest()[:12]}.py"
_BOOT = ("import sys, time\nT0 = time.time()\nSRC = {src!r}\ng = {{'__name__': 'draftops_agent', '_T0': T0}}\n"
         "exec(SRC, g)\ng['boot'](SRC, sys.argv[1:])")


@dataclass
class Host:
    """A host ready for work: connected; root checked and agent installed on first use."""

    spec: HostSpec
    transport: Transport
    project_root: Path
    info: dict[str, Any] = field(default_factory=dict)
    synced: bool = False

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def root(self) -> str:
        if not self.info:
            self.prepare()
        return self.info["root"]

    @property
    def code_dir(self) -> str:
        return f"{self.root}/code"

    @property
    def runs_dir(self) -> str:
        return f"{self.root}/runs"

    @property
    def state_dir(self) -> str:
        return f"{self.root}/state"

    @property
    def agent_python(self) -> str:
        return sys.executable if self.spec.transport == "local" else "python3"

    def prepare(self) -> None:
        """Resolve and check ``root`` and install the agent (if no agent command did it yet)."""
        self.agent()

    def _raise(self, result_code: int, stderr: str) -> None:
        where = f"Host {self.name!r} ({self.spec.describe()})"
        stderr = clean(stderr)
        if result_code in (3, 4):
            raise RootError(f"{where}: {stderr.strip()}. Fix `root:` in hosts.yaml.")
        if not self.info:
            raise RemoteError(f"{where}: could not start {self.agent_python} there (exit {result_code}): "
                              f"{stderr.strip()[-500:]}. draftops needs a python3 on the host's PATH for "
                              "its own bookkeeping.", exit_code=result_code, stderr=stderr)
        raise RemoteError(f"{where}: {stderr.strip()}", exit_code=result_code, stderr=stderr)

    def _unframed(self, what: str, exit_code: int, noise: bytes) -> RemoteError:
        shown = clean(noise.decode("utf-8", "replace")).strip()[-300:] or "(nothing)"
        return RemoteError(
            f"Host {self.name!r} ({self.spec.describe()}): the draftops agent's answer to `{what}` has no "
            f"reply marker (exit {exit_code}); the output was: {shown!r}. Something on the host replaced "
            "or swallowed it: check the SSH user's shell start-up files (~/.bashrc, ~/.profile) for "
            "commands that exit or exec, and that python3 there runs plain Python.", exit_code=exit_code)

    def agent_command(self, *args: str, nonce: str = "-") -> str:
        """Shell command running the installed agent; ``args`` paths are relative to root. The agent
        marks its reply with ``nonce`` (see the framing note in hostagent)."""
        root = self.root
        quoted = " ".join(shlex.quote(a) for a in (root, *args))
        return (f"{_env_prefix(nonce)} {self.agent_python} "
                f"{shlex.quote(root + '/state/' + AGENT_NAME)} {quoted}")

    def _command(self, args: tuple[str, ...], nonce: str) -> str:
        if self.info:
            return self.agent_command(*args, nonce=nonce)
        boot = _BOOT.format(src=AGENT_SOURCE)
        return " ".join([_env_prefix(nonce), self.agent_python, "-c", shlex.quote(boot),
                         shlex.quote(self.spec.root), AGENT_NAME, *(shlex.quote(a) for a in args)])

    def agent(self, *args: str, input: bytes | None = None) -> dict[str, Any]:
        """Run an agent subcommand (paths relative to root) and return its JSON reply.

        Whatever the host prints before the reply marker (a banner from a start-up file) is skipped;
        an answer without the marker is an error, never an empty reply."""
        nonce = secrets.token_hex(8)
        command = self._command(args, nonce)
        sent_at = time.time()
        result = self.transport.run(command, input=input, check=False)
        timing.host_stages(result.stderr, sent_at, time.time())
        replies, noise = split_replies(result.stdout, nonce)
        if not self.info and replies and "root" in replies[0]:
            self.info = replies.pop(0)
        if not result.ok:
            self._raise(result.exit_code, error_text(result.stderr, nonce))
        if not args and self.info:
            return self.info
        if not replies:
            raise self._unframed(args[0] if args else "prepare", result.exit_code, noise or result.stderr)
        return replies[-1]

    def agent_stream(self, *args: str, on_output: Callable[[bytes], object],
                     on_header: Callable[[dict[str, Any]], None] = lambda header: None) -> int:
        """Run an agent subcommand that answers with a raw stream (tail, follow, pack): ``on_header``
        gets its JSON header, ``on_output`` the bytes after it, noise before the marker is dropped.

        Returns the exit code once the stream ends. A failure before the marker raises as ``agent``
        does (the exit code is kept, e.g. 7 for a missing run folder)."""
        nonce = secrets.token_hex(8)
        command = self.agent_command(*args, nonce=nonce)      # prepared first: one marker per stream
        unframer = Unframer(nonce, on_output, on_header)
        code = self.transport.stream(command, unframer.feed)
        if not unframer.framed:
            if code != 0:
                self._raise(code, error_text(unframer.noise, nonce))
            raise self._unframed(args[0], code, unframer.noise)
        return code


def _env_prefix(nonce: str) -> str:
    """The agent's environment on its command line: the reply nonce (and the benchmark's timing flag)."""
    timed = f"{timing.ENV}=1 " if timing.ENABLED else ""
    return f"{timed}{hostagent.FRAME_ENV}={shlex.quote(nonce)}"


def _marker(prefix: str, nonce: str) -> bytes:
    return f"\n{prefix}{nonce}\n".encode()


def split_replies(stdout: bytes, nonce: str) -> tuple[list[dict[str, Any]], bytes]:
    """The JSON replies in an agent's stdout (each on the line after a marker) and the noise before
    the first marker. A marker followed by something that is not JSON is an error."""
    noise, *framed = stdout.split(_marker(hostagent.FRAME_PREFIX, nonce))
    replies = []
    for part in framed:
        line = part.split(b"\n", 1)[0]
        try:
            reply = json.loads(line)
        except ValueError:
            shown = clean(line[:200].decode(errors="replace"))
            raise RemoteError(f"the draftops agent's reply is not JSON: {shown!r}") from None
        if not isinstance(reply, dict):
            raise RemoteError(f"the draftops agent's reply is not a JSON object: {clean(line[:200].decode())!r}")
        replies.append(reply)
    return replies, noise


def error_text(stderr: bytes, nonce: str) -> str:
    """The agent's error message: what follows its error marker, or all of stderr (a traceback, or a
    shell's "python3: not found") when there is none."""
    marker = _marker(hostagent.ERROR_PREFIX, nonce)
    if marker in stderr:
        stderr = stderr.rsplit(marker, 1)[1]
    return stderr.decode("utf-8", "replace")


class Unframer:
    """Skips what comes before an agent stream's marker (bounded: keeps its first and last 4 KiB for
    error messages), reads the JSON header line after it, then passes every byte on."""

    NOISE_KEPT = 4096

    def __init__(self, nonce: str, on_output: Callable[[bytes], object],
                 on_header: Callable[[dict[str, Any]], None]):
        self.marker = _marker(hostagent.FRAME_PREFIX, nonce)
        self.on_output, self.on_header = on_output, on_header
        self.pending = bytearray()
        self.noise_head, self.noise_tail, self.noise_dropped = bytearray(), bytearray(), False
        self.framed = False
        self.header: dict[str, Any] | None = None

    @property
    def noise(self) -> bytes:
        """What came before the marker (or everything, when none came), middle left out if long."""
        rest = self.noise_tail + (b"" if self.framed else self.pending)
        return bytes(self.noise_head) + (b"\n...\n" if self.noise_dropped else b"") + bytes(rest)

    def _keep_noise(self, data: bytes | bytearray) -> None:
        room = self.NOISE_KEPT - len(self.noise_head)
        self.noise_head += data[:max(0, room)]
        self.noise_tail += data[max(0, room):]
        if len(self.noise_tail) > self.NOISE_KEPT:
            self.noise_dropped = True
            del self.noise_tail[:len(self.noise_tail) - self.NOISE_KEPT]

    def feed(self, chunk: bytes) -> None:
        if self.header is not None:
            self.on_output(chunk)
            return
        self.pending += chunk
        if not self.framed:
            at = self.pending.find(self.marker)
            if at < 0:
                cut = max(0, len(self.pending) - (len(self.marker) - 1))   # a marker may straddle chunks
                self._keep_noise(self.pending[:cut])
                del self.pending[:cut]
                return
            self._keep_noise(self.pending[:at])
            del self.pending[:at + len(self.marker)]
            self.framed = True
        end = self.pending.find(b"\n")
        if end < 0:
            if len(self.pending) > 1 << 16:
                raise RemoteError("the draftops agent's stream header is longer than 64 KiB")
            return
        try:
            header = json.loads(bytes(self.pending[:end]))
        except ValueError:
            raise RemoteError("the draftops agent's stream header is not JSON") from None
        self.header = header if isinstance(header, dict) else {}
        rest = bytes(self.pending[end + 1:])
        self.pending.clear()
        self.on_header(self.header)
        if rest:
            self.on_output(rest)


_OPEN: dict[tuple[str, str], Host] = {}


def project_inventory(root: Path) -> Inventory:
    """The project's hosts.yaml (or the built-in ``local`` host), loaded and checked."""
    started = time.monotonic()    # the stage includes importing the schemas (pydantic)
    from draftops.inventory import default_inventory_path, load_inventory

    inventory = load_inventory(default_inventory_path(root), root)
    timing.took("inventory", time.monotonic() - started)
    return inventory


def open_host(name: str | None = None, project_root: Path | None = None,
              inventory: Inventory | None = None, prepare: bool = False) -> Host:
    """The connected host called ``name`` (default: $DRAFTOPS_HOST or the inventory default), cached.

    ``prepare=True`` checks root right away (otherwise the first agent command does it)."""
    root = (project_root or Path.cwd()).resolve()
    inventory = inventory or project_inventory(root)
    spec = inventory.get(name)
    key = (str(root), spec.name)
    if key not in _OPEN:
        _OPEN[key] = Host(spec, connect(spec, inventory), root)
    host = _OPEN[key]
    if prepare and not host.info:
        try:
            host.prepare()
        except BaseException:
            host.transport.close()
            _OPEN.pop(key, None)
            raise
    return host


@atexit.register
def close_all() -> None:
    """Close every open connection (end of the invoke call)."""
    started = time.monotonic()
    for host in _OPEN.values():
        host.transport.close()
    _OPEN.clear()
    timing.took("close", time.monotonic() - started)
