"""The target as the engine will load it: the sizes the check needs and its identity for the report."""
from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import jsonread
from ..eagle import weights as headers
from .errors import CaptureError

MAX_WEIGHT_FILES = 4096


@dataclass(frozen=True)
class Target:
    path: Path
    num_layers: int
    hidden: int
    vocab: int
    context: int | None
    identity: dict[str, Any]


def _int(config: dict[str, Any], key: str, file: Path, required: bool = True) -> int | None:
    value = config.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if value is None and not required:
        return None
    raise CaptureError("The target's config lacks a positive integer it needs", path=file, field=key,
                       found=value, fix="point --target at the model folder the engine serves (its HF config.json)")


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    """A multimodal config keeps the language model's sizes under text_config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) and "num_hidden_layers" in inner else config


def read(path: Path) -> Target:
    file = path / "config.json"
    try:
        raw = jsonread.read_bounded(file)
        config = jsonread.loads(raw)
    except (OSError, ValueError) as exc:
        raise CaptureError(f"The target's config cannot be read ({type(exc).__name__}: {exc})", path=file,
                           fix="pass --target the model folder the engine serves") from exc
    if not isinstance(config, dict):
        raise CaptureError("The target's config.json is not a JSON object", path=file,
                           fix="pass --target the model folder the engine serves")
    text = _text_config(config)
    layers, hidden, vocab = (_int(text, k, file) for k in ("num_hidden_layers", "hidden_size", "vocab_size"))
    context = _int(text, "max_position_embeddings", file, required=False)
    assert layers is not None and hidden is not None and vocab is not None
    return Target(path, layers, hidden, vocab, context, identity(path, raw, config))


def identity(path: Path, raw: bytes, config: dict[str, Any]) -> dict[str, Any]:
    """config digest, and the weights' names, shapes and dtypes (headers only) summed into a digest."""
    files = sorted(path.glob("*.safetensors"))[:MAX_WEIGHT_FILES]
    listing = hashlib.sha256()
    dtypes: Counter[str] = Counter()
    params = 0
    tensors = 0
    unread = []
    for f in files:
        try:
            entries = headers.read_header(f)
        except Exception as exc:  # noqa: BLE001 - identity is a report detail: say which file, go on
            unread.append(f"{f.name}: {type(exc).__name__}")
            continue
        for name in sorted(entries):
            e = entries[name]
            listing.update(f"{name}|{list(e.shape)}|{e.dtype}\n".encode())
            dtypes[str(e.dtype)] += 1
            count = 1
            for n in e.shape:
                count *= int(n)
            params += count
            tensors += 1
    quant = config.get("quantization_config")
    return {"path": str(path), "config_sha256": hashlib.sha256(raw).hexdigest(),
            "weights_listing_sha256": listing.hexdigest(), "weight_files": len(files), "tensors": tensors,
            "parameters": params, "dtypes": dict(dtypes), "torch_dtype": config.get("torch_dtype"),
            "quantization": quant.get("quant_method") if isinstance(quant, dict) else None,
            "architectures": config.get("architectures"), "unread_weight_files": unread}
