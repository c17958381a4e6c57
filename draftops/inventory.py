"""hosts.yaml: the hosts draftops can drive, validated with pydantic so a typo fails before any SSH.

The built-in ``local`` host (transport ``local``, root ``.draftops/`` in the project, python = this
interpreter) always exists and is the default, so every task works with no remote at all.

Host names end up in file names (the sync cache) and in rich output, so they are restricted to
letters, digits, ``.``, ``_`` and ``-``. Paths that reach a shell on the host (``env.venv``,
``python``, ``env.base_python``) must be absolute or start with ``~/``, and are always quoted there.
"""
from __future__ import annotations

import difflib
import os
import re
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from draftops import cmdline, yamlfile
from draftops.cmdline import did_you_mean
from draftops.errors import InventoryError
from draftops.slurmspec import SlurmOptions, SlurmSettings

LOCAL = "local"
HOST_ENV_VAR = "DRAFTOPS_HOST"
INVENTORY_ENV_VAR = "DRAFTOPS_INVENTORY"
TOP_LEVEL_KEYS = ("default", "hosts")
HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_WORD = r"[A-Za-z0-9_][A-Za-z0-9._-]*"
_JUMP_HOP = re.compile(rf"(?:(?P<user>{_WORD})@)?(?P<host>{_WORD}|\[[0-9A-Fa-f:.]+\])(?::(?P<port>\d{{1,5}}))?")
_COMMAND_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*")


def _host_path(value: str, what: str, *, command_ok: bool = False) -> str:
    """A path used on the host: absolute or ``~/``-relative (a bare command name where allowed)."""
    if "\0" in value:
        raise ValueError(f"{what} {value!r} contains a NUL byte")
    if value.startswith("/") or value.startswith("~/"):
        return value
    if command_ok and _COMMAND_NAME.fullmatch(value):
        return value
    hint = "an absolute path or one starting with ~/" + (" (or a command name such as python3)"
                                                          if command_ok else "")
    raise ValueError(f"{what} {value!r} must be {hint}: a relative path would depend on the folder "
                     "the command happens to start in")


def _not_a_bool(value: Any) -> Any:
    """YAML reads true/false/yes/no as booleans, and pydantic would take them as 1 and 0: `port: true`
    would silently mean port 1. A number field must be written as a number."""
    if isinstance(value, bool):
        raise ValueError(f"write a number, not {str(value).lower()} (YAML reads true/false/yes/no/on/off "
                         "as booleans)")
    return value


def check_host_name(name: object) -> str:
    """The name as a string, or ValueError saying what a host name may hold."""
    text = str(name) if isinstance(name, (str, int)) and not isinstance(name, bool) else None
    if text is None or not HOST_NAME.fullmatch(text):
        raise ValueError(f"host name {name!r} is not allowed: use 1-64 letters, digits, '.', '_' or '-', "
                         "not starting with '.' or '-' (the name is used in file names and messages)")
    return text


class EnvSpec(BaseModel):
    """The host's ml-env: a venv made from ``base_python`` with ``requirements`` installed."""

    model_config = ConfigDict(extra="forbid")
    venv: str = Field(description="venv directory on the host, e.g. ~/ml-env")
    requirements: str | None = Field(None, description="local requirements file, relative to hosts.yaml")
    base_python: str = Field("python3", description="interpreter on the host that creates the venv")
    system_site_packages: bool = Field(False, description="let the venv see the host's torch/CUDA install")

    @field_validator("venv")
    @classmethod
    def _venv_is_a_host_path(cls, value: str) -> str:
        cleaned = value.rstrip("/")
        if cleaned in ("", "~"):
            raise ValueError(f"venv {value!r} would turn / or the home directory into a venv; name a "
                             "folder of its own, e.g. ~/ml-env")
        return _host_path(cleaned, "venv")

    @field_validator("base_python")
    @classmethod
    def _base_python_is_a_host_path(cls, value: str) -> str:
        return _host_path(value, "base_python", command_ok=True)


Engine = Literal["sglang", "vllm"]


class ServeProfile(BaseModel):
    """One way to serve on a host (``serve:`` in a host entry, by name): `invoke serve --profile NAME`."""

    model_config = ConfigDict(extra="forbid")
    engine: Engine | None = Field(default=None, description="sglang or vllm (default: the host's engine)")
    python: str | None = Field(default=None, description="python that runs the engine, or its venv folder")
    target: str | None = Field(default=None, description="target model folder on the host")
    tp: int = Field(default=1, ge=1, le=64, description="tensor parallel size")
    mem_fraction: float | None = Field(default=None, gt=0, le=1, description="static memory fraction (GPU)")
    max_running_requests: int | None = Field(default=None, ge=1, description="set for comparable runs")
    port: int | None = Field(default=None, ge=1, le=65535, description="default: 30000 (SGLang), 8000 (vLLM)")
    listen: str = Field(default="127.0.0.1", description="address the server binds on the host")
    context_length: int | None = Field(default=None, ge=16, description="max context the server accepts")
    extra_args: list[str] = Field(default_factory=list, description="more engine flags, verbatim")
    env: dict[str, str] = Field(default_factory=dict, description="environment of the server")
    ready_timeout: float = Field(default=900.0, gt=0, le=24 * 3600, description="seconds to wait for readiness")
    slurm: SlurmOptions | None = Field(default=None, description="on a Slurm host: this profile's job options")

    _numbers_not_bools = field_validator("tp", "mem_fraction", "max_running_requests", "port",
                                         "context_length", "ready_timeout", mode="before")(_not_a_bool)

    @field_validator("extra_args", mode="before")
    @classmethod
    def _args_are_strings(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError("write extra_args as a YAML list, e.g. [--disable-cuda-graph, --page-size, '1']")
        if isinstance(value, list):
            return [str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in value]
        return value

    @field_validator("env", mode="before")
    @classmethod
    def _env_names(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        bad = [k for k in value if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(k))]
        if bad:
            raise ValueError(f"{bad} are not environment variable names (letters, digits, _)")
        return {k: str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
                for k, v in value.items()}


class HostSpec(BaseModel):
    """One host entry of hosts.yaml."""

    model_config = ConfigDict(extra="forbid")
    name: str = ""
    transport: Literal["ssh", "local"] = "ssh"
    address: str | None = None
    user: str | None = None
    port: int = Field(22, ge=1, le=65535)
    key: str | None = None
    jump: str | None = None
    host_key: Literal["strict", "accept-new"] = "strict"
    known_hosts: str = "~/.ssh/known_hosts"
    root: str = "~/draftops"
    python: str | None = None
    env: EnvSpec | None = None
    gpu: str | None = None
    sync_paths: list[str] = Field(default_factory=list)
    connect_timeout: float = Field(10.0, gt=0, le=300)
    #: seconds an idle connection is kept open for the next `invoke` call (0: connect on every call)
    persist: float = Field(600.0, ge=0, le=86400)
    engine: Engine | None = None
    engine_python: str | None = None
    serve: dict[str, ServeProfile] = Field(default_factory=dict)
    #: ``slurm``: every job is a Slurm batch job submitted on this host, its login node (docs/slurm.md)
    scheduler: Literal["slurm"] | None = None
    slurm: SlurmSettings | None = None

    _numbers_not_bools = field_validator("port", "connect_timeout", "persist", mode="before")(_not_a_bool)

    @field_validator("root")
    @classmethod
    def _root_not_dangerous(cls, value: str) -> str:
        cleaned = value.rstrip("/") or "/"
        if cleaned in ("/", "~", "$HOME", "${HOME}"):
            raise ValueError(
                f"root {value!r} would put draftops' code and runs straight into / or the home "
                "directory, where a sync may delete files it does not own; use a folder of its "
                "own, e.g. ~/draftops")
        return value

    @field_validator("python")
    @classmethod
    def _python_is_a_host_path(cls, value: str | None) -> str | None:
        return None if value is None else _host_path(value, "python", command_ok=True)

    @model_validator(mode="after")
    def _ssh_needs_address(self) -> HostSpec:
        if self.transport == "ssh" and not self.address:
            raise ValueError("an ssh host needs `address` (a DNS name or IP of the GPU box)")
        return self

    @model_validator(mode="after")
    def _slurm_needs_scheduler(self) -> HostSpec:
        if self.scheduler != "slurm" and (self.slurm is not None or any(p.slurm for p in self.serve.values())):
            raise ValueError("`slurm:` settings are given but `scheduler: slurm` is not; add `scheduler: slurm` "
                             "to run this host's jobs as Slurm jobs, or remove the `slurm:` settings")
        return self

    @property
    def interpreter(self) -> str:
        """The python that runs remote jobs: explicit ``python``, else the env's venv, else python3."""
        if self.python:
            return self.python
        if self.env:
            return self.env.venv.rstrip("/") + "/bin/python"
        return sys.executable if self.transport == "local" else "python3"

    def describe(self) -> str:
        """user@address:port, or 'local' — for messages."""
        if self.transport == "local":
            return "this machine (local)"
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.address}:{self.port}"


class Inventory(BaseModel):
    """All hosts plus the default one."""

    model_config = ConfigDict(extra="forbid")
    default: str = LOCAL
    hosts: dict[str, HostSpec] = Field(default_factory=dict)
    source: str | None = Field(None, exclude=True)

    def names(self) -> list[str]:
        return sorted(self.hosts)

    def get(self, name: str | None = None) -> HostSpec:
        """Resolve ``name``, else $DRAFTOPS_HOST, else the inventory default."""
        cmdline.note_inventory_default(self.default)     # printed commands leave out --host for it
        chosen = name or os.environ.get(HOST_ENV_VAR) or self.default
        if chosen not in self.hosts:
            where = self.source or "the built-in inventory"
            raise InventoryError(
                f"Unknown host {chosen!r}{did_you_mean(chosen, self.names())}: {where} defines "
                f"{', '.join(self.names())}. Pass one of "
                f"those with --host (or ${HOST_ENV_VAR}), or add an entry for {chosen!r} under "
                "`hosts:` in hosts.yaml.")
        return self.hosts[chosen]

    def jump_chain(self, spec: HostSpec) -> list[HostSpec]:
        """The hops in front of ``spec``, outermost first: each hop is reached through the ones before it.

        ``jump`` names another entry (whose own ``jump`` is followed too) or ``user@host:port``;
        several comma-separated hops are taken in order, like ``ssh -J``. A loop is an error."""
        return self._hops(spec, [spec.name])

    def _hops(self, spec: HostSpec, path: list[str]) -> list[HostSpec]:
        hops: list[HostSpec] = []
        for item in spec.jump.split(",") if spec.jump else []:
            item = item.strip()
            if item in self.hosts:
                if item in path:
                    raise InventoryError(
                        f"Host {path[0]!r}: the jump chain {' -> '.join(path + [item])} loops back to "
                        f"{item!r}; fix `jump:` so that every chain ends at a host reached directly.")
                entry = self.hosts[item]
                if entry.transport != "ssh":
                    raise InventoryError(f"Host {spec.name!r}: jump host {item!r} is not an ssh host.")
                hops += self._hops(entry, path + [item]) + [entry]
                continue
            match = _JUMP_HOP.fullmatch(item)
            if not match or not 0 < int(match["port"] or 22) < 65536:
                raise InventoryError(
                    f"Host {spec.name!r}: jump hop {item!r} is neither a host of "
                    f"{self.source or 'the inventory'} nor user@host:port; write one of those "
                    "(several hops: comma-separated, outermost first).")
            hops.append(HostSpec(name=item, address=match["host"].strip("[]"), user=match["user"] or spec.user,
                                 port=int(match["port"] or 22), key=spec.key, host_key=spec.host_key,
                                 known_hosts=spec.known_hosts, connect_timeout=spec.connect_timeout))
        return hops


def local_host(project_root: Path) -> HostSpec:
    """The built-in host that runs everything on this machine."""
    return HostSpec(name=LOCAL, transport="local", root=str(project_root / ".draftops"),
                    python=sys.executable, engine="vllm")


def default_inventory_path(project_root: Path) -> Path:
    return Path(os.environ.get(INVENTORY_ENV_VAR) or project_root / "hosts.yaml")


def load_inventory(path: Path | None, project_root: Path) -> Inventory:
    """Read and validate ``path`` (missing file: the built-in ``local`` host alone)."""
    builtin = {LOCAL: local_host(project_root)}
    if path is None or not path.exists():
        if path is not None and os.environ.get(INVENTORY_ENV_VAR):
            raise InventoryError(f"{INVENTORY_ENV_VAR} names {path}, which does not exist; fix the path "
                                 "or unset the variable to use ./hosts.yaml.")
        return Inventory(hosts=builtin)
    try:
        data, root_node = yamlfile.load(path)
    except (yamlfile.DuplicateKeyError, yamlfile.ValueTooLongError) as exc:
        raise InventoryError(f"{path}:{exc.line}: {exc}.") from None
    except yamlfile.YamlFileError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise InventoryError(f"{where}: hosts.yaml is not valid YAML ({exc}). Fix the indentation or quoting "
                             "on that line; every host is a mapping under `hosts:`.") from None
    data = {} if data is None else data
    hosts = _host_entries(path, data, root_node)
    try:
        inventory = Inventory(default=data.get("default", LOCAL), hosts=hosts)
    except ValidationError as exc:
        raise InventoryError(_explain(exc, path, root_node)) from None
    for spec in inventory.hosts.values():
        _resolve_local_paths(spec, path.parent)
    inventory.hosts = {**builtin, **inventory.hosts}
    inventory.source = str(path)
    if inventory.default not in inventory.hosts:
        raise InventoryError(f"{path}:{yamlfile.line_of(root_node, ['default'])}: default host "
                             f"{inventory.default!r} is not defined; known hosts: {', '.join(inventory.names())}.")
    for name in hosts:
        try:
            inventory.jump_chain(inventory.hosts[name])
        except InventoryError as exc:
            raise InventoryError(f"{path}:{yamlfile.line_of(root_node, ['hosts', name, 'jump'])}: {exc}") from None
    return inventory


def _host_entries(path: Path, data: Any, root_node: yaml.Node | None) -> dict[str, Any]:
    """The raw host mappings by (checked) name, after checking the file's top-level shape."""
    if not isinstance(data, dict):
        raise InventoryError(f"{path}: expected a mapping with `default:` and `hosts:`, found "
                             f"{type(data).__name__}.")
    for key in data:
        if key not in TOP_LEVEL_KEYS:
            close = difflib.get_close_matches(str(key), TOP_LEVEL_KEYS, n=1)
            hint = f" (did you mean `{close[0]}`?)" if close else ""
            raise InventoryError(
                f"{path}:{yamlfile.line_of(root_node, [key])}: unknown top-level key `{key}`{hint}; "
                "hosts.yaml holds only `default:` and `hosts:`, and every host goes under `hosts:`.")
    hosts_raw = data.get("hosts") or {}
    if not isinstance(hosts_raw, dict):
        raise InventoryError(f"{path}:{yamlfile.line_of(root_node, ['hosts'])}: `hosts:` must map host names "
                             "to entries.")
    hosts: dict[str, Any] = {}
    for name, entry in hosts_raw.items():
        line = yamlfile.line_of(root_node, ["hosts", name])
        try:
            checked = check_host_name(name)
        except ValueError as exc:
            raise InventoryError(f"{path}:{line}: {exc}. Rename the entry under `hosts:`.") from None
        if not isinstance(entry, dict):
            raise InventoryError(f"{path}:{line}: host {checked!r} must be a mapping of fields (address, "
                                 "user, port, key, root, ...).")
        if checked in hosts:
            raise InventoryError(f"{path}:{line}: host {checked!r} is defined twice under `hosts:`; keep one.")
        if "name" in entry:
            raise InventoryError(f"{path}:{yamlfile.line_of(root_node, ['hosts', name, 'name'])}: host "
                                 f"{checked!r}, field `name`: the name is the key under `hosts:`; remove it.")
        hosts[checked] = {**entry, "name": checked}
    return hosts


def _resolve_local_paths(spec: HostSpec, base: Path) -> None:
    """Paths that live on this machine are taken relative to hosts.yaml's folder."""
    if spec.key:
        spec.key = str((base / os.path.expanduser(spec.key)).resolve())
    spec.known_hosts = str((base / os.path.expanduser(spec.known_hosts)).resolve())
    if spec.env and spec.env.requirements:
        spec.env.requirements = str((base / os.path.expanduser(spec.env.requirements)).resolve())
    if spec.transport == "local" and not os.path.isabs(os.path.expanduser(spec.root)):
        spec.root = str((base / spec.root).resolve())


def _explain(exc: ValidationError, path: Path, root_node: yaml.Node | None) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        keys = loc[1:] if loc and loc[0] == "hosts" else loc
        host = keys[0] if loc and loc[0] == "hosts" and keys else None
        field = ".".join(keys[1:]) if host else ".".join(keys)
        what = (f"host {host!r}, field `{field}`" if host and field else f"host {host!r}" if host
                else f"field `{field}`")   # a check of the whole entry (ssh needs address) has no field
        model: type[BaseModel] = HostSpec
        if host and len(keys) > 3 and keys[1] == "serve":
            what = f"host {host!r}, serve profile {keys[2]!r}, field `{'.'.join(keys[3:])}`"
            model = ServeProfile
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = _unknown_field(field, model)
        parts.append(f"{path}:{yamlfile.line_of(root_node, loc)}: {what}: {msg}.")
    return " ".join(parts) + " Fix hosts.yaml and run again."


def _unknown_field(field: str, model: type[BaseModel] = HostSpec) -> str:
    """'unknown field' plus the fields valid at that place (a host entry, its env, or a serve profile)."""
    parent, _, name = field.rpartition(".")
    if parent == "env":
        model = EnvSpec
    elif parent == "slurm":
        model = SlurmSettings if model is HostSpec else SlurmOptions
    elif parent.startswith("slurm.tasks."):
        model = SlurmOptions
    valid = [f for f in model.model_fields if f != "name"]
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" (did you mean `{close[0]}`?)" if close else ""
    where = f"`{parent}` fields" if parent in ("env", "slurm") or parent.startswith("slurm.") else "fields"
    return f"unknown field{hint}; valid {where} are {', '.join(valid)}"
