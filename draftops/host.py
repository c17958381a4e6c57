"""A connected host: its inventory entry, its transport, its resolved root and the host agent there.

One ``Host`` per host name per process, so chained tasks (``invoke sync test-drafter``) share one
connection and one root check. The root check and agent install ride along with the first agent
command of the session (one SSH exec instead of two).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftops import hostagent
from draftops.connection import Transport, connect
from draftops.errors import RemoteError, RootError
from draftops.inventory import HostSpec, Inventory, default_inventory_path, load_inventory

AGENT_SOURCE = Path(hostagent.__file__).read_text()
AGENT_NAME = f"agent-{hashlib.sha256(AGENT_SOURCE.encode()).hexdigest()[:12]}.py"
_BOOT = ("import sys\nSRC = {src!r}\ng = {{'__name__': 'draftops_agent'}}\nexec(SRC, g)\n"
         "g['boot'](SRC, sys.argv[1:])")


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
        if result_code in (3, 4):
            raise RootError(f"{where}: {stderr.strip()}. Fix `root:` in hosts.yaml.")
        if not self.info:
            raise RemoteError(f"{where}: could not start {self.agent_python} there (exit {result_code}): "
                              f"{stderr.strip()[-500:]}. draftops needs a python3 on the host's PATH for "
                              "its own bookkeeping.", exit_code=result_code, stderr=stderr)
        raise RemoteError(f"{where}: {stderr.strip()}", exit_code=result_code, stderr=stderr)

    def agent_command(self, *args: str) -> str:
        """Shell command running the installed agent; ``args`` paths are relative to root."""
        root = self.root
        quoted = " ".join(shlex.quote(a) for a in (root, *args))
        return f"{self.agent_python} {shlex.quote(root + '/state/' + AGENT_NAME)} {quoted}"

    def agent(self, *args: str, input: bytes | None = None) -> dict[str, Any]:
        """Run an agent subcommand (paths relative to root) and parse its one-line JSON answer."""
        if self.info:
            command = self.agent_command(*args)
        else:
            boot = _BOOT.format(src=AGENT_SOURCE)
            command = " ".join([self.agent_python, "-c", shlex.quote(boot), shlex.quote(self.spec.root),
                                AGENT_NAME, *(shlex.quote(a) for a in args)])
        result = self.transport.run(command, input=input, check=False)
        lines = result.text.strip().splitlines()
        if not self.info and lines and lines[0].startswith('{"root"'):
            self.info = json.loads(lines.pop(0))
        if not result.ok:
            self._raise(result.exit_code, result.stderr.decode(errors="replace"))
        return json.loads(lines[-1]) if lines else {}


_OPEN: dict[tuple[str, str], Host] = {}


def open_host(name: str | None = None, project_root: Path | None = None,
              inventory: Inventory | None = None, prepare: bool = False) -> Host:
    """The connected host called ``name`` (default: $DRAFTOPS_HOST or the inventory default), cached.

    ``prepare=True`` checks root right away (otherwise the first agent command does it)."""
    root = (project_root or Path.cwd()).resolve()
    inventory = inventory or load_inventory(default_inventory_path(root), root)
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
    for host in _OPEN.values():
        host.transport.close()
    _OPEN.clear()
