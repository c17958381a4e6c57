"""One night per host at a time: a night holds ``runs/.nightly-host-<name>.lock`` (flock) for each of its
hosts while it runs. Two nights on one host would stop each other's servers (`serve --replace`) and
measure each other's load; two nights on different hosts, or one night's own hosts, never wait."""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from draftops.errors import NightBusy


def lock_path(runs: Path, host: str) -> Path:
    return runs / f".nightly-host-{host}.lock"       # host names are inventory names (no `/`)


@contextmanager
def hold(runs: Path, hosts: list[str], playbook: str) -> Iterator[None]:
    """Hold every host's lock for the night, or raise NightBusy naming the night that holds one (and
    hold none: nothing has run)."""
    runs.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        for host in hosts:
            path = lock_path(runs, host)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            stack.callback(os.close, fd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise NightBusy(f"nightly: host {host!r} is in use by another night of this project "
                                f"({_holder(path)}); nothing was run. Wait for that night to end, or leave "
                                f"{host!r} out with --hosts.") from None
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps({"pid": os.getpid(), "playbook": playbook}).encode())
        yield


def _holder(path: Path) -> str:
    """Who holds the lock, as the holder wrote it (best effort: a holder still writing shows nothing)."""
    try:
        info = json.loads(path.read_text() or "{}")
        return f"pid {int(info['pid'])}, playbook {info['playbook']}, lock {path}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"lock {path}"
