"""What a draft's safetensors files say without loading them: headers read with json + struct (stdlib).

One parser for every tool: the evaluator's tensor store (which then loads bytes with safetensors),
``draft-config`` (which needs only fc.weight's shape) and anything on the local side. A header that
is cut off, unparseable or points past the end of the file is a :class:`HeaderError` naming what is
wrong and the fix; each tool words it in its own error type.

The fc layer of an EAGLE-3 draft is ``Linear(A * H_target, H)``: its weight's second dimension
tells how many aux hidden states (A) the draft was trained on, whatever its config claims.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import jsonread

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER = 100 * 1024 * 1024  # a larger header means a corrupt or non-safetensors file
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
    """Parse and check the header of one .safetensors file (``__metadata__`` left out)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
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
    except (OSError, ValueError) as exc:         # JSONDecodeError, jsonread.TooDeep, UnicodeDecodeError
        raise HeaderError(f"The safetensors header cannot be parsed ({exc})", path,
                          fix=f"{_RECOPY}; its header is damaged") from exc
    if not isinstance(header, dict):
        raise HeaderError("The safetensors header is not a JSON object", path)
    entries: dict[str, TensorEntry] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            _, end = meta["data_offsets"]
            entries[name] = TensorEntry(name, tuple(int(d) for d in meta["shape"]), str(meta["dtype"]),
                                        8 + n + int(end))
        except (KeyError, TypeError, ValueError) as exc:
            raise HeaderError("A safetensors header entry is malformed", path, tensor=name) from exc
    full = max((e.end for e in entries.values()), default=8 + n)
    if full > size:
        cut = min((e for e in entries.values() if e.end > size), key=lambda e: e.end)
        raise HeaderError("The file is truncated: the bytes of a tensor are past its end", path,
                          tensor=cut.name, expected=f"{full} bytes", found=f"{size} bytes",
                          fix=f"{_RECOPY} (compare its size with the source)")
    return entries


def index_map(index: Path) -> dict[str, str]:
    """``weight_map`` of a shard index (tensor -> file name); HeaderError when unreadable."""
    try:
        weight_map = jsonread.loads(index.read_text())["weight_map"]
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
