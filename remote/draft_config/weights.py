"""Read tensor shapes from safetensors headers with json + struct (no torch, no safetensors).

The fc layer of an EAGLE-3 draft is ``Linear(A * H_target, H)``: its weight's second dimension
tells how many aux hidden states (A) the draft was trained on, whatever its config claims.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

_MAX_HEADER = 100 * 1024 * 1024  # a larger header means a corrupt or non-safetensors file


def header(path: Path) -> dict[str, dict]:
    """The JSON header of a .safetensors file (tensor name -> {dtype, shape, data_offsets})."""
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path}: shorter than a safetensors header")
        (size,) = struct.unpack("<Q", prefix)
        if size > _MAX_HEADER:
            raise ValueError(f"{path}: header of {size} bytes is not plausible")
        data = json.loads(handle.read(size))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: header is not a JSON object")
    return data


def find_shape(ckpt: Path, name: str) -> tuple[list[int], Path] | None:
    """Shape of tensor ``name`` (or ``*.name``) in the checkpoint, and the file holding it."""
    for path in _candidates(ckpt, name):
        try:
            entries = header(path)
        except (OSError, ValueError):
            continue
        for key, info in entries.items():
            if (key == name or key.endswith("." + name)) and isinstance(info, dict):
                return list(info.get("shape") or []), path
    return None


def _candidates(ckpt: Path, name: str) -> list[Path]:
    index = ckpt / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (OSError, ValueError):
            weight_map = {}
        shards = [ckpt / f for k, f in weight_map.items() if k == name or k.endswith("." + name)]
        if shards:
            return shards
    return sorted(ckpt.glob("*.safetensors"))


def aux_slots(fc_shape: list[int], target_hidden: int | None) -> int | None:
    """Number of aux states fc takes, when ``target_hidden`` divides its input width."""
    if len(fc_shape) != 2 or not target_hidden or fc_shape[1] % target_hidden:
        return None
    return fc_shape[1] // target_hidden
