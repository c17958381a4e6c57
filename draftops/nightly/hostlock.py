"""One night per machine and root at a time: a night holds ``runs/.nightly-host-<key>.lock`` (flock) for
each of its hosts while it runs. The key is the host's address, port and root (not its inventory name):
two names for one box and root would stop each other's servers (`serve --replace`) and measure each
other's load just as two nights on one name would. Nights on different machines or roots never wait."""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import posixpath
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path

from draftops.errors import NightBusy, PlaybookError
from draftops.inventory import HostSpec


def machine_key(spec: HostSpec) -> str:
    """Where a host's night acts: address, port and root (the user too when the root is under ~,
    which is another folder for another user); a local host by its real root folder."""
    if spec.transport == "local":
        return "local:" + os.path.realpath(os.path.expanduser(spec.root))
    root = posixpath.normpath(spec.root)
    user = f"{spec.user or ''}@" if root.startswith("~") else ""
    return f"ssh:{user}{(spec.address or '').lower().rstrip('.')}:{spec.port}:{root}"


def lock_keys(specs: Mapping[str, HostSpec]) -> dict[str, str]:
    """Each chosen host's lock key; two of one night's hosts on one machine and root are refused
    (they would break each other's steps as two nights would)."""
    keys: dict[str, str] = {}
    for name, spec in specs.items():
        key = machine_key(spec)
        twin = next((other for other, k in keys.items() if k == key), None)
        if twin is not None:
            raise PlaybookError(f"nightly: hosts {twin!r} and {name!r} are the same machine and root "
                                f"({spec.describe()}, root {spec.root}); their nights would stop each other's "
                                f"servers. Run one of them (--hosts {twin}), or give the other its own root.")
        keys[name] = key
    return keys


def lock_path(runs: Path, key: str) -> Path:
    return runs / f".nightly-host-{hashlib.sha256(key.encode()).hexdigest()[:16]}.lock"


@contextmanager
def hold(runs: Path, keys: Mapping[str, str], playbook: str) -> Iterator[None]:
    """Hold every host's lock (``keys``: host name -> machine key) for the night, or raise NightBusy
    naming the night that holds one (and hold none: nothing has run)."""
    runs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        for host, key in keys.items():
            path = lock_path(runs, key)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            stack.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise NightBusy(f"nightly: host {host!r} is in use by another night of this project "
                                f"({_holder(path)}); nothing was run. Wait for that night to end, or leave "
                                f"{host!r} out with --hosts.") from None
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "playbook": playbook, "host": host}).encode())
        yield


def _holder(path: Path) -> str:
    """Who holds the lock, as the holder wrote it (best effort: a holder still writing shows nothing)."""
    try:
        info = json.loads(path.read_text() or "{}")
        name = f", as host {str(info['host'])!r}" if "host" in info else ""
        return f"pid {int(info['pid'])}, playbook {info['playbook']}{name}, lock {path}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"lock {path}"
