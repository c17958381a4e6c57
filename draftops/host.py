"""A connected host: its inventory entry, its transport, its resolved root and the host agent there.

One ``Host`` per host name per process, so chained tasks (``invoke sync test-drafter``) share one
connection and one root check.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import shlex
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from draftops import hostagent
from draftops.connection import CommandResult, Transport, connect
from draftops.errors import RemoteError, RootError
from draftops.inventory import HostSpec, Inventory, default_inventory_path, load_inventory

AGENT_SOURCE = Path(hostagent.__file__).read_bytes()
AGENT_NAME = f"agent-{hashlib.sha256(AGENT_SOURCE).hexdigest()[:12]}.py"
AGENT_PYTHON = "python3"


@dataclass
class Host:
    """A host ready for work: connected, root checked, agent installed."""

    spec: HostSpec
    transport: Transport
    project_root: Path
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def root(self) -> str:
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

    @cached_property
    def agent_python(self) -> str:
        return sys.executable if self.spec.transport == "local" else AGENT_PYTHON

    def prepare(self) -> None:
        """Resolve and check ``root`` and install the agent, in one round trip."""
        inline = (f"import sys\ng = {{'__name__': 'draftops_agent'}}\nexec({AGENT_SOURCE.decode()!r}, g)\n"
                  "g['cmd_prepare'](*sys.argv[1:])")
        command = (f"{self.agent_python} -c {shlex.quote(inline)} "
                   f"{shlex.quote(self.spec.root)} {AGENT_NAME}")
        result = self.transport.run(command, input=AGENT_SOURCE, check=False)
        if result.exit_code in (3, 4):
            raise RootError(f"Host {self.name!r} ({self.spec.describe()}): "
                            f"{result.stderr.decode(errors='replace').strip()}. Fix `root:` in hosts.yaml.")
        if not result.ok:
            raise RemoteError(f"Host {self.name!r} ({self.spec.describe()}): could not start "
                              f"{self.agent_python} there (exit {result.exit_code}): "
                              f"{result.stderr.decode(errors='replace').strip()[-500:]}. draftops needs a "
                              "python3 on the host's PATH for its own bookkeeping.",
                              exit_code=result.exit_code, stderr=result.stderr.decode(errors="replace"))
        self.info = json.loads(result.text)

    def agent_command(self, *args: str) -> str:
        """Shell command that runs the agent with ``args`` (each quoted)."""
        quoted = " ".join(shlex.quote(a) for a in args)
        return f"{self.agent_python} {shlex.quote(self.state_dir + '/' + AGENT_NAME)} {quoted}"

    def agent(self, *args: str, input: bytes | None = None, check: bool = True) -> dict[str, Any]:
        """Run an agent subcommand and parse its one-line JSON answer."""
        result: CommandResult = self.transport.run(self.agent_command(*args), input=input, check=check)
        if not result.ok:
            raise RemoteError(f"Host {self.name!r}: {result.stderr.decode(errors='replace').strip()}",
                              exit_code=result.exit_code, stderr=result.stderr.decode(errors="replace"))
        return json.loads(result.text.strip().splitlines()[-1])


_OPEN: dict[tuple[str, str], Host] = {}


def project_root_default() -> Path:
    return Path.cwd()


def open_host(name: str | None = None, project_root: Path | None = None,
              inventory: Inventory | None = None) -> Host:
    """The connected host called ``name`` (default: $DRAFTOPS_HOST or the inventory default), cached."""
    root = (project_root or project_root_default()).resolve()
    inventory = inventory or load_inventory(default_inventory_path(root), root)
    spec = inventory.get(name)
    key = (str(root), spec.name)
    if key not in _OPEN:
        host = Host(spec, connect(spec, inventory), root)
        try:
            host.prepare()
        except BaseException:
            host.transport.close()
            raise
        _OPEN[key] = host
    return _OPEN[key]


@atexit.register
def close_all() -> None:
    """Close every open connection (end of the invoke call)."""
    for host in _OPEN.values():
        host.transport.close()
    _OPEN.clear()
