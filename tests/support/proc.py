"""Processes of this machine found through /proc (the hosts of the tests are this machine)."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def pids_whose(name: str, keep: Callable[[bytes], bool]) -> list[int]:
    """Pids of the processes whose ``/proc/<pid>/<name>`` (``stat``, ``cmdline``, ``environ``) ``keep``
    accepts; a process that ends or cannot be read meanwhile is passed over."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                data = Path(f"/proc/{entry}/{name}").read_bytes()
            except OSError:
                continue
            if keep(data):
                found.append(int(entry))
    return found


def stat_fields(stat: bytes) -> list[str]:
    """``/proc/<pid>/stat``'s fields after the command name: [state, ppid, pgrp, ...]."""
    return stat.decode().rsplit(")", 1)[1].split()


def group_members(pgid: int) -> list[int]:
    """Non-zombie processes in process group ``pgid`` (zombies wait for a reaper, they are not running)."""
    return pids_whose("stat", lambda stat: int(stat_fields(stat)[2]) == pgid and stat_fields(stat)[0] != "Z")
