"""A full disk, made on purpose (on a small tmpfs of tests/conftest.py's ``small_tmpfs``)."""
from __future__ import annotations

import os
from pathlib import Path


def fill(folder: Path) -> None:
    """Write into ``folder`` until its file system is full, to its last byte."""
    fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 512):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
