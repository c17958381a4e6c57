"""Reading one torch.save file of a dump (``.pt``, ``.ckpt``, ``.ckpt.gz``), safely, or one paragraph.

Always ``weights_only=True``: a pickle that would build anything but tensors and plain containers
(a class whose ``__reduce__`` runs a command) is refused before any of it runs.  A zip-format file
is memory-mapped, so a sample costs the pages it touches; ``.ckpt.gz`` is decompressed as a stream
into memory, never to a temp file (torch's zip reader needs random access, and seeking backwards
in a gzip stream decompresses it again from the start: 8x slower on a 24 MB sample).
"""
from __future__ import annotations

import gzip
import io
import stat
import zlib
from pathlib import Path
from typing import Any

import torch

from ..errors import CorruptFileError

ZIP_MAGIC = b"PK\x03\x04"


def is_gzip(file: Path) -> bool:
    return file.name.endswith(".gz")


def load(file: Path, regenerate: str) -> Any:
    """The object ``file`` holds; ``regenerate`` says how to remake the file (the fix of a refusal)."""
    _regular(file, regenerate)
    if file.stat().st_size == 0:   # torch.load's EOFError was told as a gzip stream cut short
        raise CorruptFileError("The file is empty (0 bytes), so it holds no torch save", path=file,
                               expected="a torch.save file", found="0 bytes",
                               fix=f"re-copy the file whole (a full disk or an interrupted copy leaves it empty), "
                                   f"or {regenerate}")
    try:
        loaded = _load(file)
    except Expanded as exc:
        size = file.stat().st_size
        raise CorruptFileError(
            f"The gzip stream expands past {exc.args[0] / 2**20:.0f} MiB ({MAX_GZIP_RATIO} times the file's "
            f"{size / 2**20:.1f} MiB): hidden states compress far less, so this is no sample (a gzip bomb, or "
            "a stream of repeated bytes) and it is refused before it fills memory", path=file,
            expected=f"at most {MAX_GZIP_RATIO} times the compressed size", found="more",
            fix=f"re-copy the file, or {regenerate}") from None
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise CorruptFileError(
            f"The gzip stream is cut short or damaged ({type(exc).__name__}: {exc}), so no sample is read from it",
            path=file, fix=f"re-copy the file whole, or {regenerate}") from exc
    except OSError as exc:
        raise CorruptFileError(f"The dump file cannot be read ({type(exc).__name__}: {exc})", path=file,
                               fix=f"check the path and its permissions, or {regenerate}") from exc
    except Exception as exc:  # pickle/zip errors have many types
        raise _refusal(file, exc, regenerate) from exc
    _dense(loaded, file, regenerate)
    return loaded


def _dense(obj: Any, file: Path, regenerate: str, where: str = "", depth: int = 0) -> None:
    """Every tensor in a loaded file is a dense one with storage: ``weights_only`` lets a sparse or a
    meta tensor through, and the first reshape or ``.item()`` on one was an internal-error traceback."""
    if isinstance(obj, torch.Tensor):
        kind = ("a meta tensor (no data was saved)" if obj.is_meta else
                f"a {str(obj.layout).replace('torch.', '')} tensor" if obj.layout != torch.strided else None)
        if kind is not None:
            raise CorruptFileError(f"The file holds {kind} where a dense tensor of values belongs", path=file,
                                   tensor=where or None, expected="dense (strided) tensors with their values",
                                   found=kind,
                                   fix=f"save the tensors themselves (.to_dense(), on cpu), or {regenerate}")
    elif depth < 8 and isinstance(obj, dict):
        for key, value in obj.items():
            _dense(value, file, regenerate, f"{where}.{key}" if where else str(key), depth + 1)
    elif depth < 8 and isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            _dense(value, file, regenerate, f"{where}[{i}]", depth + 1)


def _regular(file: Path, regenerate: str) -> None:
    """Only a regular file (through its links) is opened: a FIFO blocks ``open`` forever, a device such as
    /dev/zero reads without end, and a folder is no save."""
    try:
        mode = file.stat().st_mode
    except OSError as exc:
        raise CorruptFileError(f"The file cannot be read ({type(exc).__name__}: {exc})", path=file,
                               fix=f"check the path and its permissions, or {regenerate}") from exc
    if not stat.S_ISREG(mode):
        kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket or other special file")
        raise CorruptFileError(f"The file is not a regular file but {kind}, so it is not opened", path=file,
                               expected="a torch.save file", found=kind,
                               fix=f"point at the saved file itself (not a link to a device or pipe), or {regenerate}")


#: how far a ``.ckpt.gz`` may expand: hidden states (floats) compress to 70-95 % of their size and a
#: zero-padded sample a few times smaller, so a stream past 64 times its file (and past 256 MiB) is no
#: sample but a gzip bomb, refused before it fills memory
MAX_GZIP_RATIO = 64
MIN_GZIP_CAP = 256 * 1024 * 1024


class Expanded(ValueError):
    """A gzip stream expands past the bound of :func:`gzip_cap`."""


def gzip_cap(file: Path) -> int:
    """The most bytes ``file``'s gzip stream may expand to."""
    return max(MIN_GZIP_CAP, MAX_GZIP_RATIO * file.stat().st_size)


def _load(file: Path) -> Any:
    if is_gzip(file):
        buffer = io.BytesIO()
        cap = gzip_cap(file)
        with gzip.open(file, "rb") as stream:
            while chunk := stream.read(min(1 << 22, cap + 1 - buffer.tell())):
                buffer.write(chunk)
                if buffer.tell() > cap:
                    raise Expanded(cap)
        buffer.seek(0)
        return torch.load(buffer, map_location="cpu", weights_only=True)
    with open(file, "rb") as fh:
        zipped = fh.read(4) == ZIP_MAGIC
    return torch.load(file, map_location="cpu", weights_only=True, mmap=zipped)


def _refusal(file: Path, exc: Exception, regenerate: str) -> CorruptFileError:
    text = str(exc)
    if "Unsupported operand" in text:      # bytes that are no pickle at all (zeros, noise): no code in them
        return CorruptFileError("The file is not a torch save (its bytes are no pickle stream: "
                                f"{text.split('Unsupported operand', 1)[1].split(chr(10))[0].strip()[:40]!r} "
                                "is no pickle operation)", path=file,
                                fix=f"re-copy the file (it is damaged or not a torch.save), or {regenerate}")
    if "Weights only load failed" in text or "Unsupported global" in text:
        culprit = next((line.strip() for line in text.splitlines() if "GLOBAL" in line or "global" in line), "")
        return CorruptFileError(
            "The file is a pickle that would run code or build objects other than tensors when loaded, so "
            "it is refused unread (torch.load weights_only=True)" + (f": {culprit[:160]}" if culprit else ""),
            path=file, fix=f"do not load this file with weights_only=False; {regenerate} from a source you trust")
    first = text.splitlines()[0][:200] if text else ""
    return CorruptFileError(f"The file is not a readable torch save ({type(exc).__name__}: {first})", path=file,
                            fix=f"re-copy the file (it is truncated or not a torch.save), or {regenerate}")
