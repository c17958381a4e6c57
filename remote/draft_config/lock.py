"""One draft-config at a time per config file: its read-modify-write holds an flock.

Two runs on one checkpoint each read the ids, then each wrote theirs: one update was lost while
both said "changed" (issue 22, probe D). The lock is ``<config>.draftops-lock`` next to the real
file (links resolved, so two paths to one config share it): a file draftops owns, like its
backups, created once and never deleted (deleting a lock file races with its next holder).
The wait is bounded; a run that cannot get the lock changes nothing and says who to wait for.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from ..exitcodes import BUSY
from .errors import DraftConfigError, WriteError

SUFFIX = ".draftops-lock"
POLL_S = 0.05


class ConfigBusy(DraftConfigError):
    """Another draft-config held the config's lock for the whole wait."""

    exit_code = BUSY


def lock_path(ckpt: Path) -> Path:
    """The lock of the config ``config_file.load(ckpt)`` reads."""
    config = ckpt if ckpt.is_file() else ckpt / "config.json"
    real = Path(os.path.realpath(config))
    return real.with_name(real.name + SUFFIX)


@contextlib.contextmanager
def config_lock(ckpt: Path, timeout: float) -> Iterator[Path]:
    """Hold the config's lock for the block; ConfigBusy after ``timeout`` seconds of waiting."""
    path = lock_path(ckpt)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise WriteError(f"Cannot create the lock {path} that keeps two draft-config runs from rewriting "
                         f"{path.parent} at once ({exc.strerror}). Make the checkpoint folder writable, "
                         "or run draft-config with --dry-run to only check the ids.") from None
    try:
        _acquire(fd, path, timeout)
        yield path
    finally:
        os.close(fd)                       # closing drops the lock


def _acquire(fd: int, path: Path, timeout: float) -> None:
    deadline = time.monotonic() + max(0.0, timeout)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() >= deadline:
            raise ConfigBusy(
                f"Another draft-config is rewriting {path.parent} (it holds {path}) and did not finish "
                f"within {timeout:g} s; nothing was changed. Wait for it to end (`invoke runs` lists it), "
                "then run draft-config again.")
        time.sleep(POLL_S)
