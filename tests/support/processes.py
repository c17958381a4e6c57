"""Processes a test waits on or looks for: a run's state, a process group's live members, what a run left."""
from __future__ import annotations

import time
from pathlib import Path

from draftops.link.host import open_host
from draftops.runs import jobs
from tests.support.proc import group_members, pids_whose


def live_group_members(pgid: int) -> list[int]:
    """Non-zombie processes in process group ``pgid`` (zombies wait for a reaper, they are not running)."""
    return group_members(pgid)


def wait_state(project, run_id, states, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = jobs.status(open_host(None, project), run_id)
        # "running" can be read before the runner has recorded its pid: wait for both
        if row["state"] in states and (row["state"] != "running" or "pid" in row):
            return row
        time.sleep(0.1)
    raise AssertionError(f"run {run_id} never reached {states}: {row}")


def wait_until(predicate, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def processes_with(mark: str) -> list[int]:
    """Processes of run ``mark`` (every job process inherits DRAFTOPS_RUN_ID), zombies included."""
    return pids_whose("environ", lambda environ: f"DRAFTOPS_RUN_ID={mark}".encode() in environ.split(b"\0"))


def left_files(out: Path) -> list[Path]:
    """The engine's hidden-state files (and locks) left behind, the kept engine states aside."""
    return [p for p in out.rglob("*") if p.suffix in (".safetensors", ".lock") and "engine-states" not in p.parts]
