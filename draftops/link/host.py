"""A connected host: its inventory entry, its transport, its resolved root and the host agent there.

One ``Host`` per host name per process, so chained tasks (``invoke sync test-drafter``) share one
connection and one root check. The root check and agent install ride along with the first agent
command of the session (one SSH exec instead of two); ``host.agent`` (draftops.link.agent) makes the calls.
"""
from __future__ import annotations

import atexit
import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftops import timing
from draftops.link.agent import AgentClient
from draftops.link.connection import Transport
from draftops.link.keeper_link import open_transport

if TYPE_CHECKING:   # the inventory (pydantic, yaml) is loaded when a host is opened, not at import
    from draftops.inventory import HostSpec, Inventory


@dataclass
class Host:
    """A host ready for work: connected; root checked and agent installed on first use."""

    spec: HostSpec
    transport: Transport
    project_root: Path
    synced: bool = False
    #: this task's ``--max-pending``: over every job's ``slurm.max_pending`` (set by each task's connect)
    max_pending: float | None = None
    agent: AgentClient = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # over SSH, the interpreter the agent reported is remembered and called directly next time
        # (no pyenv shim or PATH search in every exec); the local host runs this process's own python
        memory = host_cache_file(self.spec, self.project_root, "agent-python") if self.spec.transport == "ssh" else None
        installed = host_cache_file(self.spec, self.project_root, "agent-run")   # the warm boot's copy
        self.agent = AgentClient(self.spec, self.transport, memory, installed)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def info(self) -> dict[str, Any]:
        """The agent's prepare reply as a dict (empty before the first agent call); ``agent.info`` is typed."""
        return asdict(self.agent.info) if self.agent.info else {}

    @property
    def root(self) -> str:
        return self.agent.prepare().root

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
        """The interpreter that runs the agent (and draftops' other stdlib-only host tools)."""
        return self.agent.python

    def prepare(self) -> None:
        """Resolve and check ``root`` and install the agent (if no agent command did it yet)."""
        self.agent.prepare()


def host_cache_file(spec: HostSpec, project_root: Path, kind: str) -> Path:
    """A file in the project's ``.draftops/cache/`` about ``spec``'s host, keyed by where that host and its
    root are (renaming the entry or pointing it elsewhere starts afresh)."""
    key = hashlib.sha256(f"{spec.transport}|{spec.user}|{spec.address}|{spec.port}|{spec.root}".encode())
    return project_root / ".draftops" / "cache" / f"{kind}-{spec.name}-{key.hexdigest()[:12]}.json"


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
        _OPEN[key] = Host(spec, open_transport(spec, inventory), root)
    host = _OPEN[key]
    if prepare and host.agent.info is None:
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
