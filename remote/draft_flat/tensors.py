"""Safetensors files copied with layer 0 renamed for SGLang: a new header, every tensor's bytes
streamed unchanged (no torch, a fixed buffer at any checkpoint size).

safetensors: an 8-byte little-endian header length, the JSON header (tensor name -> dtype, shape,
data_offsets relative to the data that follows), the data.  Offsets are relative, so a new header of
another length keeps them; it is padded with spaces to a multiple of 8, as the format allows, so the
data stays aligned as the writer aligned it.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from .. import jsonread
from ..eagle import weights
from .errors import NotConvertible

SPECULATORS_PREFIX, SGLANG_PREFIX = "layers.0.", "midlayer."
CHUNK = 16 * 1024 * 1024


def renamed(name: str) -> str:
    """The name SGLang loads a tensor under: ``layers.0.*`` (speculators) is ``midlayer.*``."""
    return SGLANG_PREFIX + name[len(SPECULATORS_PREFIX):] if name.startswith(SPECULATORS_PREFIX) else name


def weight_files(ckpt: Path) -> tuple[list[str], dict[str, str] | None]:
    """The checkpoint's safetensors file names, and its shard index's weight_map when it has one."""
    index = ckpt / weights.INDEX_NAME
    mapped: dict[str, str] | None = None
    try:
        if index.is_file():
            mapped = weights.index_map(index)
            files = sorted(set(mapped.values()))
        else:
            files = sorted(p.name for p in ckpt.glob("*.safetensors") if not p.is_dir())
        for name in files:
            weights.check_inside(ckpt, ckpt / name)
    except weights.HeaderError as exc:
        raise NotConvertible(_header_text(exc)) from None
    if not files:
        raise NotConvertible(f"{ckpt} holds no *.safetensors file and no {weights.INDEX_NAME}: there are no "
                             "weights to copy. Point --ckpt at the draft checkpoint folder.")
    return files, mapped


def read(path: Path) -> tuple[int, dict[str, Any]]:
    """(header length, header object) of one file, checked (weights.read_header: cut off, damaged,
    data past the end) before anything is written."""
    try:
        weights.read_header(path)
        with jsonread.open_regular(path) as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = jsonread.loads(f.read(n))
    except weights.HeaderError as exc:
        raise NotConvertible(_header_text(exc)) from None
    except (OSError, ValueError) as exc:
        raise NotConvertible(f"{path}: cannot be read ({exc}). Re-copy the checkpoint.") from None
    return n, header


def new_header(path: Path, header: dict[str, Any]) -> tuple[bytes, int]:
    """(the renamed header, padded; how many names changed). Refused when two names would meet (a
    checkpoint holding both ``layers.0.x`` and ``midlayer.x``)."""
    out: dict[str, Any] = {}
    changed = 0
    for name, meta in header.items():
        new = name if name == "__metadata__" else renamed(name)
        if new in out:
            raise NotConvertible(f"{path}: holds both `{name}` and `{new}`, which SGLang would load as one tensor. "
                                 "Re-export the checkpoint with its trainer: it is neither format as written.")
        out[new] = meta
        changed += new != name
    body = json.dumps(out, separators=(",", ":")).encode()
    return body + b" " * (-len(body) % 8), changed


def copy(src: Path, dest: Path, n: int, header: bytes) -> int:
    """Write ``dest``: ``header`` then the data of ``src`` (whose header is ``n`` bytes), with the permission
    bits of ``src``; its bytes."""
    written = 0
    with src.open("rb") as inp, open(dest, "xb") as out:
        out.write(struct.pack("<Q", len(header)) + header)
        inp.seek(8 + n)
        while chunk := inp.read(CHUNK):
            out.write(chunk)
            written += len(chunk)
        out.flush()
        os.fchmod(out.fileno(), os.fstat(inp.fileno()).st_mode & 0o777)    # 0600 weights stay 0600
        os.fsync(out.fileno())
    return 8 + len(header) + written


def dtype_of(header: dict[str, Any]) -> str | None:
    """The torch_dtype a flat config states: fc.weight's (the draft's own trained layers' dtype)."""
    meta = next((m for k, m in header.items() if weights.matches(k, "fc.weight") and isinstance(m, dict)), None)
    return {"F16": "float16", "BF16": "bfloat16", "F32": "float32"}.get(str((meta or {}).get("dtype")))


def _header_text(exc: weights.HeaderError) -> str:
    where = f" (tensor {exc.tensor})" if exc.tensor else ""
    found = f"; expected {exc.expected}, found {exc.found}" if exc.expected is not None else ""
    return f"{exc.path}: {exc.problem}{where}{found}. Fix: {exc.fix}; nothing was written."
