"""How long a night's step waited in a Slurm queue, apart from how long its jobs ran: read from the run
folders the step brought home (``slurm.json``: when the job was queued and, once Slurm said so, its
``queued_s``; ``status.json``: when the runner started and how long the command ran).

A step on a host without a scheduler pulls no ``slurm.json``, so it has no queue time (None)."""
from __future__ import annotations

import calendar
import math
import time
from dataclasses import dataclass
from pathlib import Path

from remote import jsonread

MAX_FILE = 1 << 20          # slurm.json and status.json are a few hundred bytes


@dataclass(frozen=True)
class QueueTime:
    """A step's jobs: seconds queued and seconds run, summed; how many Slurm jobs that is."""

    queued_s: float
    ran_s: float
    jobs: int


def _read(path: Path) -> dict:
    try:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > MAX_FILE:
            return {}
        data = jsonread.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
        return float(value)
    return None


def _epoch(stamp: object) -> float | None:
    try:
        return float(calendar.timegm(time.strptime(str(stamp), "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def of_run(folder: Path) -> tuple[float, float] | None:
    """(queued, ran) seconds of one pulled Slurm run folder; None for a run that was no Slurm job."""
    slurm = _read(folder / "slurm.json")
    if not slurm.get("job_id"):
        return None
    status = _read(folder / "status.json")
    got = slurm.get("final")
    final: dict = got if isinstance(got, dict) else {}
    queued = _number(final.get("queued_s"))
    if queued is None:
        submitted, started = _number(slurm.get("submitted")), _epoch(status.get("started"))
        queued = max(0.0, started - submitted) if submitted is not None and started is not None else 0.0
    ran = _number(status.get("seconds"))
    if ran is None:
        ran = _number(final.get("ran_s")) or 0.0
    return queued, ran


def of_step(runs_dir: Path, since: float) -> QueueTime | None:
    """The Slurm runs pulled into ``runs_dir`` since ``since`` (epoch seconds: the step's start)."""
    queued = ran = 0.0
    count = 0
    try:
        folders = [p for p in runs_dir.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return None
    for folder in folders:
        mark = folder / ".draftops-pulled.json"
        try:
            if mark.stat().st_mtime < since:
                continue
        except OSError:
            continue
        times = of_run(folder)
        if times is not None:
            queued, ran, count = queued + times[0], ran + times[1], count + 1
    # unrounded: the report rounds once where it prints (rounding here first made 6.52 s print as 6)
    return QueueTime(queued, ran, count) if count else None
