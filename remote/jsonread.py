"""JSON (and other small files) from a file someone else wrote, read with bounds.

``json.loads`` raises ``RecursionError`` (a RuntimeError) on a document nested about a thousand
levels deep, so a config of ``[[[[...]]]]`` escaped every ``except ValueError`` and was reported as
an internal error. :func:`loads` turns it into a ``ValueError`` the callers already report as "not
valid JSON", naming their file.

A path in a checkpoint folder may be anything: a FIFO (``open`` waits for a writer forever), a link
to ``/dev/zero`` (a read never ends, until MemoryError), a huge file. :func:`open_regular` opens
without blocking and refuses anything but a regular file; :func:`load` also bounds the size. Both
raise ``ValueError`` subclasses, which every caller already words as one paragraph naming its file.
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import IO, Any

#: the largest JSON file read (a config is a few KB; the shard index of a 1T-parameter model a few MB)
MAX_JSON = 64 * 1024 * 1024


class TooDeep(ValueError):
    """The document nests deeper than the parser can follow."""


class NotRegular(ValueError):
    """The path is a FIFO, a device, a socket or a folder: not opened (or not read)."""


class TooLarge(ValueError):
    """The file is larger than anything of its kind could be."""


def loads(raw: str | bytes) -> Any:
    """``json.loads(raw)``; a document nested too deep is :class:`TooDeep`, never a RecursionError."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise TooDeep("its arrays or objects are nested too deep to read (thousands of levels; a "
                      "config nests a few)") from None


def kind(mode: int) -> str | None:
    """What a non-regular file is, in words (None: a regular file)."""
    if stat.S_ISREG(mode):
        return None
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or other special file")


def _refuse(what: str) -> NotRegular:
    return NotRegular(f"it is {what}, not a regular file: a FIFO waits for a writer forever and a device "
                      "such as /dev/zero never ends, so it is not opened; put the file itself there")


def check_regular(path: Path) -> None:
    """:class:`NotRegular` unless ``path`` (through its links) is a regular file; for files another
    library opens (safetensors, torch). OSError when it cannot be stat'ed."""
    what = kind(os.stat(path).st_mode)
    if what is not None:
        raise _refuse(what)


def open_regular(path: Path) -> IO[bytes]:
    """``open(path, "rb")`` that never blocks on a FIFO and refuses anything but a regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        what = kind(os.fstat(fd).st_mode)
        if what is not None:
            raise _refuse(what)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: Path, limit: int = MAX_JSON) -> bytes:
    """The bytes of the regular file ``path``; :class:`TooLarge` past ``limit`` (never read whole)."""
    with open_regular(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"it is larger than {limit // (1024 * 1024)} MiB, far more than a file of its kind "
                       "holds, so it is not read; restore the file as written")
    return data


def load(path: Path, limit: int = MAX_JSON) -> Any:
    """The JSON document in the regular file ``path`` (bounded in size and depth)."""
    return loads(read_bounded(Path(path), limit))
