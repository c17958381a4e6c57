"""The host's files as every flow names and reads them: a path the user typed, made absolute by the one
rule of every task (``host_path``), and the digest of a draft's config read there (``config_digest_of``),
so the task, the doctor and the history agree on both."""
from __future__ import annotations

import posixpath
from pathlib import Path
from typing import overload

from draftops.errors import RemoteError
from draftops.link.host import Host
from remote.bench.digest import config_digest


@overload
def host_path(host: Host, path: str) -> str: ...
@overload
def host_path(host: Host, path: None) -> None: ...
@overload
def host_path(host: Host, path: str | None) -> str | None: ...
def host_path(host: Host, path: str | None) -> str | None:
    """A path the user typed for the host, made absolute by the one rule of every task: relative to
    where a login shell starts there, as `ssh`/`scp host:path` read it (the home folder over SSH,
    the project folder on `local`), `~` being the host's home. Jobs run in <root>/code, a folder
    draftops owns and replaces on sync, so a path left relative would silently point there; a serve
    profile's ``python: ~/...`` is such a path too."""
    if path is None:
        return None
    if host.spec.transport == "local":
        given = Path(path).expanduser()
        return str(given if given.is_absolute() else (host.project_root / given).resolve())
    if not host.info:
        host.prepare()
    home = str(host.info["home"]).rstrip("/") or "/"
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    return path if path.startswith("/") else posixpath.join(home, path)


def config_digest_of(host: Host, path: str) -> str | None:
    """The config digest (remote.bench.digest) of a config file on the host, None when unreadable. The
    agent reads its bytes, nothing else: a shell's banner in them made a digest that matched none."""
    try:
        return config_digest(host.agent.read(path).data)
    except RemoteError:
        return None
