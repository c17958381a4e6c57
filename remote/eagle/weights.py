"""What a draft's safetensors files say without loading them: headers read with json + struct (stdlib).

One parser for every tool: the evaluator's tensor store (which then loads bytes with safetensors),
``draft-config`` (which needs only fc.weight's shape) and anything on the local side. A header that
is cut off, unparseable or points past the end of the file is a :class:`HeaderError` naming what is
wrong and the fix; each tool words it in its own error type.

The fc layer of an EAGLE-3 draft is ``Linear(A * H_target, H)``: its weight's second dimension
tells how many aux hidden states (A) the draft was trained on, whatever its config claims.
"""
from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import jsonread

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER = 100 * 1024 * 1024  # a larger header means a corrupt or non-safetensors file
#: bits per element of each safetensors dtype (the format's own list)
DTYPE_BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
              "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
              "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64}
_RECOPY = "re-copy or re-generate the file"


class HeaderError(ValueError):
    """A safetensors header that cannot be used; the fields feed each tool's one-paragraph error."""

    def __init__(self, problem: str, path: Path, *, tensor: str | None = None, expected: Any = None,
                 found: Any = None, fix: str = _RECOPY) -> None:
        self.problem, self.path, self.tensor = problem, path, tensor
        self.expected, self.found, self.fix = expected, found, fix
        super().__init__(f"{path}: {problem}")


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as its file's header describes it (``end``: absolute byte offset of its last byte + 1)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    end: int


def read_header(path: Path) -> dict[str, TensorEntry]:
    """Parse and check the header of one .safetensors file (``__metadata__`` left out) as the safetensors
    library checks it before it loads a byte: every tensor's bytes in bounds, the tensors one after the
    other from the start of the data to the end of the file (none overlapping, none negative), and each
    one's byte length what its dtype and shape need. A stdlib copier (draft-flat) so refuses what the
    evaluator would refuse, instead of copying it."""
    n, size, header = _raw_header(path)
    entries: dict[str, TensorEntry] = {}
    spans: list[tuple[int, int, str]] = []
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        entry, begin = _entry(path, name, meta, n)
        entries[name] = entry
        spans.append((begin, entry.end, name))
    full = max((e.end for e in entries.values()), default=8 + n)
    if full > size:
        cut = min((e for e in entries.values() if e.end > size), key=lambda e: e.end)
        raise HeaderError("The file is truncated: the bytes of a tensor are past its end", path,
                          tensor=cut.name, expected=f"{full} bytes", found=f"{size} bytes",
                          fix=f"{_RECOPY} (compare its size with the source)")
    _contiguous(path, sorted(spans), 8 + n, size)
    return entries


def _raw_header(path: Path) -> tuple[int, int, dict[str, Any]]:
    """(header length, file size, header object) of a regular file, read within bounds."""
    try:
        with jsonread.open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise HeaderError("The safetensors file is shorter than its 8-byte header length", path,
                                  expected=">= 8 bytes", found=f"{size} bytes",
                                  fix=f"{_RECOPY}; it was probably cut off during transfer")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise HeaderError("The safetensors header length is larger than the file", path,
                                  expected=f"header of {n} bytes within the file", found=f"{size} bytes",
                                  fix=f"{_RECOPY}; it is truncated or not a safetensors file")
            raw = f.read(n)
        header = jsonread.loads(raw)
    except HeaderError:                          # a ValueError too: already says what is wrong
        raise
    except jsonread.NotRegular as exc:
        raise HeaderError(f"The weight file is not read: {exc}", path, fix="put the shard file itself there "
                          "(a regular file)") from exc
    except (OSError, ValueError) as exc:         # JSONDecodeError, jsonread.TooDeep, UnicodeDecodeError
        raise HeaderError(f"The safetensors header cannot be parsed ({exc})", path,
                          fix=f"{_RECOPY}; its header is damaged") from exc
    if not isinstance(header, dict):
        raise HeaderError("The safetensors header is not a JSON object", path)
    return n, size, header


def _entry(path: Path, name: str, meta: Any, n: int) -> tuple[TensorEntry, int]:
    """One header entry, checked: (the entry, the absolute offset of its first byte)."""
    try:
        begin, end = (_count(v) for v in meta["data_offsets"])
        shape = tuple(_count(d) for d in meta["shape"])
        dtype = meta["dtype"]
        if not isinstance(dtype, str):
            raise TypeError("dtype is not a string")
    except (KeyError, TypeError, ValueError) as exc:
        raise HeaderError(f"A safetensors header entry is malformed ({exc})", path, tensor=name,
                          expected="dtype, shape and data_offsets of non-negative integers") from exc
    if end < begin:
        raise HeaderError("A tensor's data_offsets end before they begin", path, tensor=name,
                          expected="begin <= end", found=[begin, end])
    bits = DTYPE_BITS.get(dtype)
    if bits is None:
        raise HeaderError("A tensor's dtype is not a safetensors dtype", path, tensor=name,
                          expected=", ".join(sorted(DTYPE_BITS)), found=dtype)
    need = math.prod(shape) * bits
    if need != 8 * (end - begin):
        raise HeaderError(f"A tensor's byte length does not match its dtype and shape ({dtype} {list(shape)})",
                          path, tensor=name, expected=f"{need / 8:g} bytes", found=f"{end - begin} bytes")
    return TensorEntry(name, shape, dtype, 8 + n + end), 8 + n + begin


def _count(value: Any) -> int:
    """A JSON integer >= 0 (a bool, float or negative number is refused)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value


def _contiguous(path: Path, spans: list[tuple[int, int, str]], start: int, size: int) -> None:
    """The tensors' bytes, sorted, follow one another from ``start`` to the end of the file."""
    at = start
    for begin, end, name in spans:
        if begin != at:
            problem = "overlap the tensor before them" if begin < at else "leave a gap after the tensor before them"
            raise HeaderError(f"A tensor's data_offsets {problem}", path, tensor=name,
                              expected=f"its bytes from offset {at - start}", found=f"from {begin - start}")
        at = end
    if at != size:
        raise HeaderError("The file holds bytes after its last tensor that no header entry describes", path,
                          expected=f"{at} bytes", found=f"{size} bytes",
                          fix=f"{_RECOPY}; it is damaged or two files were joined")


def index_map(index: Path) -> dict[str, str]:
    """``weight_map`` of a shard index (tensor -> file name); HeaderError when unreadable."""
    try:
        weight_map = jsonread.load(index)["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
        mapped = {str(k): str(v) for k, v in weight_map.items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise HeaderError(f"The shard index cannot be read ({exc})", index, tensor="weight_map",
                          fix="re-copy the index or remove it to scan *.safetensors") from exc
    outside = next((v for v in mapped.values() if _outside(v)), None)
    if outside is not None:     # the engines join the name to the folder: this would read another file
        raise HeaderError(f"The shard index names a shard outside the checkpoint folder ({outside!r}): shard "
                          "names are file names relative to the folder the index is in", index,
                          tensor="weight_map", fix="re-copy the index as the trainer wrote it (plain shard file "
                                                   "names), or remove it to scan *.safetensors")
    return mapped


def check_inside(folder: Path, file: Path) -> None:
    """HeaderError when ``file``, through its links, is not in the checkpoint ``folder``: a shard linked
    elsewhere would serve (or be copied as) weights of another folder, unseen. The one exception is
    the Hugging Face cache, whose ``snapshots/<rev>/`` files are links into the repository's ``blobs/``."""
    real, home = Path(os.path.realpath(file)), Path(os.path.realpath(folder))
    blobs = home.parent.parent / "blobs" if home.parent.name == "snapshots" else None
    if home in real.parents or (blobs is not None and blobs in real.parents):
        return
    raise HeaderError(f"The weight file is a link to {real}, outside the checkpoint folder {home}, so it is "
                      "not read", file, expected="the shard files inside the checkpoint folder",
                      found=str(real), fix="copy the shard into the checkpoint folder (cp --dereference), "
                                           "or point at the folder that holds it")


def _outside(name: str) -> bool:
    """An absolute path, or one that climbs out with '..' (or is empty: the folder itself)."""
    parts = Path(name).parts
    return not name or Path(name).is_absolute() or ".." in parts or not parts


def matches(key: str, name: str) -> bool:
    """``key`` is tensor ``name``, possibly under a prefix (``model.fc.weight`` for ``fc.weight``)."""
    return key == name or key.endswith("." + name)


def find_shape(ckpt: Path, name: str) -> tuple[list[int], Path] | None:
    """Shape of tensor ``name`` (or ``*.name``) in the checkpoint, and the file holding it; None when
    no readable file has it (unreadable files are skipped: the caller only warns)."""
    for path in _candidates(ckpt, name):
        try:
            entries = read_header(path)
        except HeaderError:
            continue
        for key, entry in entries.items():
            if matches(key, name):
                return list(entry.shape), path
    return None


def _candidates(ckpt: Path, name: str) -> list[Path]:
    index = ckpt / INDEX_NAME
    if index.is_file():
        try:
            weight_map = index_map(index)
        except HeaderError:
            weight_map = {}
        shards = [ckpt / f for k, f in weight_map.items() if matches(k, name)]
        if shards:
            return shards
    return sorted(ckpt.glob("*.safetensors"))


def aux_slots(fc_shape: list[int], target_hidden: int | None) -> int | None:
    """Number of aux states fc takes, when ``target_hidden`` divides its input width."""
    if len(fc_shape) != 2 or not target_hidden or fc_shape[1] % target_hidden:
        return None
    return fc_shape[1] // target_hidden
