"""Stop what is left of a server's process group, even after its runner has exited.

A crashed server can leave children behind (a tokenizer or scheduler process) whose group leader,
the job runner, is gone; the host agent only signals groups of running jobs. Members are found in
/proc by process group *and* by the ``DRAFTOPS_RUN_ID`` every job process inherits, so a recycled
group id never hits an unrelated process.
"""
from __future__ import annotations

import os
import signal
import time
from typing import Any

MARK = "DRAFTOPS_RUN_ID"


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[2])


def members(pgid: int, run_id: str) -> list[int]:
    """Live (non-zombie) processes of group ``pgid`` that belong to run ``run_id``."""
    marker = f"{MARK}={run_id}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _stat(int(name))
        if stat is None or stat[1] != pgid or stat[0] == "Z":
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if marker not in fh.read().split(b"\0"):
                    continue
        except OSError:
            continue
        found.append(int(name))
    return sorted(found)


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def reap(pgid: int, run_id: str, grace: float) -> dict[str, Any]:
    """TERM the run's processes, wait up to ``grace`` seconds, KILL what is left."""
    if not os.path.isdir("/proc"):
        return {"pgid": pgid, "error": "no /proc on this host: cannot find the group's processes"}
    first = members(pgid, run_id)
    _signal(first, signal.SIGTERM)
    deadline = time.monotonic() + grace
    left = members(pgid, run_id)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = members(pgid, run_id)
    _signal(left, signal.SIGKILL)
    time.sleep(0.2 if left else 0)
    return {"pgid": pgid, "terminated": first, "killed": left, "left": members(pgid, run_id)}
