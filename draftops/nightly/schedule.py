"""The nightly's crontab entry: one block between marker lines, owned by this project checkout.

* Idempotent: scheduling again replaces the block (never a second copy); unscheduling removes only
  it. Lines outside the block, other checkouts' blocks included, are kept byte for byte.
* The right interpreter: the python running this task (the project's venv), by absolute path, from
  the project folder, so cron's bare PATH and environment do not matter.
* ``flock -n`` on ``runs/.nightly.lock``: a night still running when the next one is due makes the
  next one skip (and say so in the log) instead of overlapping.
* Output appended to ``runs/nightly.log``.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from draftops.errors import ScheduleError

_AT = re.compile(r"([01]?\d|2[0-3]):([0-5]\d)")
BUSY_EXIT = 75          # flock -E: the lock was held (the previous night still runs)


def markers(project_root: Path) -> tuple[str, str]:
    where = str(project_root)
    return f"# >>> draftops nightly ({where}) >>>", f"# <<< draftops nightly ({where}) <<<"


def parse_at(at: str) -> tuple[int, int]:
    found = _AT.fullmatch(at.strip())
    if not found:
        raise ScheduleError(f"--at {at!r} is not a time of day; write HH:MM in 24-hour local time, e.g. 02:30.")
    return int(found.group(1)), int(found.group(2))


def _cron_safe(text: str, what: str) -> str:
    """Shell-quoted, with cron's ``%`` (newline in a crontab command) escaped."""
    if "\n" in text or "\r" in text or "\0" in text:
        raise ScheduleError(f"{what} {text!r} holds a line break or NUL; cron cannot run it. Move the project or "
                            "playbook to a plain path.")
    return shlex.quote(text).replace("%", "\\%")


def command(project_root: Path, playbook: str, python: str = sys.executable) -> str:
    """The shell command the crontab line runs (also what a user can paste to run it by hand). Every
    path is its own shell-quoted word, never inside double quotes, where a `'` in it would end the
    string and a `$(...)` in it would run."""
    root = _cron_safe(str(project_root), "the project folder")
    lock = _cron_safe(str(project_root / "runs" / ".nightly.lock"), "the lock file")
    log = _cron_safe(str(project_root / "runs" / "nightly.log"), "the log file")
    py = _cron_safe(python, "the python interpreter")
    book = _cron_safe(playbook, "--playbook")
    return (f"cd {root} && mkdir -p runs && {{ flock -n -E {BUSY_EXIT} {lock} {py} -m invoke nightly --playbook "
            f"{book}; rc=$?; [ $rc -eq {BUSY_EXIT} ] && echo \"$(date -u)\" nightly skipped: the previous night "
            f"still holds {lock}; exit $rc; }} >> {log} 2>&1")


def block(project_root: Path, at: str, playbook: str, python: str = sys.executable) -> list[str]:
    hour, minute = parse_at(at)
    start, end = markers(project_root)
    return [start, f"{minute} {hour} * * * {command(project_root, playbook, python)}", end]


@dataclass
class Crontab:
    """The crontab of ``user`` (None: the current user), read and written with the ``crontab`` command."""

    user: str | None = None

    def _argv(self, *args: str) -> list[str]:
        return ["crontab", *(["-u", self.user] if self.user else []), *args]

    def read(self) -> list[str]:
        try:
            done = subprocess.run(self._argv("-l"), capture_output=True, text=True, timeout=30, check=False)
        except FileNotFoundError:
            raise ScheduleError("the `crontab` command is not installed; install cron (Debian: apt-get install "
                                "cron) to schedule the nightly.") from None
        if done.returncode != 0:
            if "no crontab" in done.stderr:
                return []
            raise ScheduleError(f"`crontab -l` failed: {done.stderr.strip()}")
        return done.stdout.splitlines()

    def write(self, lines: list[str]) -> None:
        text = "\n".join(lines) + "\n" if lines else ""
        done = subprocess.run(self._argv("-"), input=text, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise ScheduleError(f"`crontab -` refused the new table ({done.stderr.strip()}); the old one is "
                                "unchanged.")


def without_block(lines: list[str], project_root: Path) -> tuple[list[str], list[str]]:
    """(lines outside this project's block, the block's lines). A start marker without its end marker
    is an error: guessing where the block ends could delete the user's own lines."""
    start, end = markers(project_root)
    if lines.count(start) != lines.count(end) or lines.count(start) > 1:
        raise ScheduleError(f"the crontab holds {lines.count(start)} start and {lines.count(end)} end marker(s) of "
                            f"this project's nightly block; fix it by hand with `crontab -e` (keep one pair "
                            f"or none), then run again.")
    if start not in lines:
        return list(lines), []
    i, j = lines.index(start), lines.index(end)
    if j < i:
        raise ScheduleError("the crontab's nightly end marker comes before its start marker; fix it with "
                            "`crontab -e`, then run again.")
    return lines[:i] + lines[j + 1:], lines[i:j + 1]


def schedule(tab: Crontab, project_root: Path, at: str, playbook: str, python: str = sys.executable) -> list[str]:
    """Install or replace this project's block; returns the block."""
    new = block(project_root, at, playbook, python)
    rest, _ = without_block(tab.read(), project_root)
    tab.write(rest + new)
    return new


def unschedule(tab: Crontab, project_root: Path) -> bool:
    """Remove this project's block; False when there was none."""
    rest, old = without_block(tab.read(), project_root)
    if old:
        tab.write(rest)
    return bool(old)


def show(tab: Crontab, project_root: Path) -> list[str]:
    return without_block(tab.read(), project_root)[1]
