"""The nightly's crontab entry: one block between marker lines, owned by this project checkout.

* Idempotent: scheduling again replaces the block in place (never a second copy); unscheduling removes
  only it. Everything outside the block, other checkouts' blocks included, is kept byte for byte: the
  table is handled as bytes and split only on b"\n" (a form feed, U+2028, U+0085, a CR or a byte that
  is not UTF-8 is the user's text, not a line break). A table that does not end in a newline gets one
  (cron refuses it otherwise).
* The right interpreter: the python running this task (the project's venv), by absolute path, from
  the project folder, so cron's bare PATH and environment do not matter.
* ``flock -n`` on ``runs/.nightly.lock``: a night still running when the next one is due makes the
  next one skip (and say so in the log) instead of overlapping.
* Output appended to ``runs/nightly.log``.
"""
from __future__ import annotations

import os
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
    """The crontab of ``user`` (None: the current user), read and written with the ``crontab`` command,
    as bytes (a crontab may hold any bytes; draftops changes only its own block)."""

    user: str | None = None

    def _argv(self, *args: str) -> list[str]:
        return ["crontab", *(["-u", self.user] if self.user else []), *args]

    def read(self) -> bytes:
        try:
            done = subprocess.run(self._argv("-l"), capture_output=True, timeout=30, check=False)
        except FileNotFoundError:
            raise ScheduleError("the `crontab` command is not installed; install cron (Debian: apt-get install "
                                "cron) to schedule the nightly.") from None
        if done.returncode != 0:
            if b"no crontab" in done.stderr:
                return b""
            raise ScheduleError(f"`crontab -l` failed: {_said(done.stderr)}")
        return done.stdout

    def write(self, data: bytes) -> None:
        done = subprocess.run(self._argv("-"), input=data, capture_output=True, timeout=30, check=False)
        if done.returncode != 0:
            raise ScheduleError(f"`crontab -` refused the new table ({_said(done.stderr)}); the old one is "
                                "unchanged.")


def _said(raw: bytes) -> str:
    return raw.decode("utf-8", "replace").strip()


def _lines(data: bytes) -> list[bytes]:
    """The table's lines, split on b"\n" only; a final newline leaves a last empty item."""
    return data.split(b"\n") if data else []


def _is(line: bytes, marker: bytes) -> bool:
    return line.rstrip(b"\r") == marker          # a block an editor saved with CRLF is still ours


def without_block(lines: list[bytes], project_root: Path) -> tuple[list[bytes], list[bytes], int]:
    """(lines outside this project's block, the block's lines, where the block was in the rest; -1:
    none). A start marker without its end marker is an error: guessing where the block ends could
    delete the user's own lines."""
    start, end = (os.fsencode(m) for m in markers(project_root))
    starts = [i for i, ln in enumerate(lines) if _is(ln, start)]
    ends = [i for i, ln in enumerate(lines) if _is(ln, end)]
    if len(starts) != len(ends) or len(starts) > 1:
        raise ScheduleError(f"the crontab holds {len(starts)} start and {len(ends)} end marker(s) of "
                            f"this project's nightly block; fix it by hand with `crontab -e` (keep one pair "
                            f"or none), then run again.")
    if not starts:
        return list(lines), [], -1
    i, j = starts[0], ends[0]
    if j < i:
        raise ScheduleError("the crontab's nightly end marker comes before its start marker; fix it with "
                            "`crontab -e`, then run again.")
    return lines[:i] + lines[j + 1:], lines[i:j + 1], i


def _joined(lines: list[bytes]) -> bytes:
    if lines and lines[-1] != b"":
        lines = [*lines, b""]                     # cron refuses a table without its final newline
    return b"\n".join(lines)


def with_block(data: bytes, project_root: Path, new: list[str]) -> bytes:
    """``data`` with this project's block replaced in place by ``new`` (or added at the end)."""
    rest, _, at = without_block(_lines(data), project_root)
    block_lines = [os.fsencode(line) for line in new]
    if at < 0:
        at = len(rest) - 1 if rest and rest[-1] == b"" else len(rest)
    return _joined(rest[:at] + block_lines + rest[at:])


def schedule(tab: Crontab, project_root: Path, at: str, playbook: str, python: str = sys.executable) -> list[str]:
    """Install or replace this project's block; returns the block."""
    new = block(project_root, at, playbook, python)
    tab.write(with_block(tab.read(), project_root, new))
    return new


def unschedule(tab: Crontab, project_root: Path) -> bool:
    """Remove this project's block; False when there was none."""
    rest, old, _ = without_block(_lines(tab.read()), project_root)
    if old:
        tab.write(_joined(rest) if rest != [b""] else b"")
    return bool(old)


def show(tab: Crontab, project_root: Path) -> list[str]:
    """This project's block, as text to show (bytes that are not UTF-8 replaced)."""
    return [line.decode("utf-8", "replace") for line in without_block(_lines(tab.read()), project_root)[1]]
