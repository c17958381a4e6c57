"""The four dump formats, told apart by what a file holds, and the torch-saved ones decoded into slots.

* ``safetensors`` (speculators >= 0.5): ``token_ids`` [T], ``hidden_states`` [T, S, H] (read in data.py).
* ``pt`` (speculators <= 0.4): ``input_ids``, ``hidden_states`` a list of S x [T, H], ``loss_mask``.
* ``specforge`` (SpecForge offline features, ``.ckpt`` / ``.ckpt.gz`` in ``rows_{a}-{b}/``):
  ``input_ids`` [T], ``loss_mask`` [T], ``hidden_state`` [T, H] (the final state),
  ``aux_hidden_state`` [T, k*H] (the k aux slots concatenated on the last axis, in layer order).
* ``modelopt`` (``{conversation_id}.pt``): ``input_ids``, ``hidden_states`` [T, H] (final),
  ``aux_hidden_states`` [T, k*H].

SpecForge's and ModelOpt's files become slots ``[aux_0 .. aux_{k-1}, final]`` (final slot k). They do
not record which layers they hold; ``data_config.json`` or a capture-check says.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import DataError, MissingTensorError, ShapeMismatchError

SAFETENSORS, LEGACY_PT, SPECFORGE, MODELOPT = "safetensors", "pt", "specforge", "modelopt"
TRAINERS = (SPECFORGE, MODELOPT)
NAME = {SAFETENSORS: "speculators safetensors", LEGACY_PT: "speculators legacy .pt",
        SPECFORGE: "SpecForge offline features", MODELOPT: "ModelOpt"}


@dataclass(frozen=True)
class Keys:
    """Where one trainer keeps each tensor, and how to remake its files."""

    final: str
    aux: str
    regenerate: str


KEYS = {
    SPECFORGE: Keys("hidden_state", "aux_hidden_state",
                    "regenerate it with SpecForge's scripts/prepare_hidden_states.py --enable-aux-hidden-states"),
    MODELOPT: Keys("hidden_states", "aux_hidden_states",
                   "regenerate it with ModelOpt's hidden-state dump (examples/speculative_decoding)"),
}
LEGACY_FIX = "regenerate the dump (speculators' legacy {input_ids, hidden_states, loss_mask} format)"
EXPECTED = ("speculators' legacy {input_ids, hidden_states: list of S x [T, H], loss_mask}, SpecForge's "
            "{input_ids, loss_mask, hidden_state, aux_hidden_state} or ModelOpt's "
            "{input_ids, hidden_states, aux_hidden_states}")


def classify(raw: Any, file: Path) -> str:
    """The format a torch-saved dump holds, by its keys; one that matches none is refused."""
    if not isinstance(raw, dict):
        raise DataError("The torch-saved dump is not a dict", path=file, expected=EXPECTED,
                        found=type(raw).__name__, fix="point --data at the trainer's hidden-state dumps")
    if "aux_hidden_state" in raw or "hidden_state" in raw:
        return SPECFORGE
    if "aux_hidden_states" in raw:
        return MODELOPT
    hs = raw.get("hidden_states")
    if isinstance(hs, (list, tuple)) or (isinstance(hs, torch.Tensor) and hs.dim() == 3):
        return LEGACY_PT
    if isinstance(hs, torch.Tensor):
        raise MissingTensorError(
            "The dump holds one final hidden_states [T, H] and no aux states: a ModelOpt file without "
            "aux_hidden_states (an EAGLE-1 dump), not one an EAGLE-3 draft can be scored on", path=file,
            tensor="aux_hidden_states", expected="aux_hidden_states [T, k*H]", found=_names(raw),
            fix="regenerate the dump with the aux layers (ModelOpt's EAGLE-3 hidden-state dump)")
    raise MissingTensorError("The torch-saved dump holds the keys of no known dump format", path=file,
                             tensor="hidden_states", expected=EXPECTED, found=_names(raw),
                             fix="point --data at the trainer's hidden-state dumps, or regenerate them")


def _names(raw: dict[Any, Any]) -> list[str]:
    return sorted(map(str, raw))


def trainer_slots(raw: dict[Any, Any], fmt: str) -> int:
    """How many slots a SpecForge or ModelOpt file holds (its aux ones and the final), from the shapes alone."""
    keys = KEYS[fmt]
    final, aux = raw.get(keys.final), raw.get(keys.aux)
    if not isinstance(final, torch.Tensor) or not isinstance(aux, torch.Tensor) or not final.shape[-1]:
        return 0
    return int(aux.shape[-1]) // int(final.shape[-1]) + 1


def decode_trainer(raw: dict[Any, Any], fmt: str, file: Path,
                   slots: Sequence[int] | None = None) -> tuple[Any, torch.Tensor, Any]:
    """(ids, hidden [T, k+1, H], loss_mask or None) of a SpecForge or ModelOpt file; with ``slots``,
    [T, len(slots), H] holding only those (the others' columns of a memory-mapped file are not touched)."""
    keys = KEYS[fmt]
    missing = [name for name in ("input_ids", keys.final, keys.aux) if name not in raw]
    if missing:
        raise MissingTensorError(
            f"A {NAME[fmt]} dump lacks {', '.join(missing)}", path=file, tensor=missing[0],
            expected=f"input_ids [T], {keys.final} [T, H], {keys.aux} [T, k*H]"
                     + (", loss_mask [T]" if fmt == SPECFORGE else ""),
            found=_names(raw), fix=keys.regenerate)
    final = _rows(raw[keys.final], keys.final, file)
    aux = _rows(raw[keys.aux], keys.aux, file)
    if final.shape[0] != aux.shape[0]:
        raise ShapeMismatchError(f"{keys.aux} and {keys.final} hold different numbers of tokens", path=file,
                                 tensor=keys.aux, expected=f"[{final.shape[0]}, k*H]", found=list(aux.shape),
                                 fix=keys.regenerate)
    width, hidden = aux.shape[1], final.shape[1]
    if hidden == 0 or width == 0 or width % hidden:
        raise ShapeMismatchError(
            f"{keys.aux} is {width} wide, not a multiple of the hidden size {hidden} ({keys.final}'s width), "
            "so it cannot be split into aux slots", path=file, tensor=keys.aux,
            expected=f"[T, k*{hidden}] (k aux layers concatenated on the last axis)", found=list(aux.shape),
            fix=keys.regenerate)
    count = width // hidden
    parts = aux.reshape(aux.shape[0], count, hidden)
    if slots is None:
        return raw["input_ids"], torch.cat([parts, final[:, None, :].to(aux.dtype)], 1), raw.get("loss_mask")
    if any(not 0 <= s <= count for s in slots):
        raise ShapeMismatchError("A dump file has fewer slots than the layouts being scored read", path=file,
                                 tensor=keys.aux, expected=f"slots {sorted(slots)}", found=f"{count + 1} slots",
                                 fix="dump every sample with the same layers of the same model")
    columns = [final.to(aux.dtype) if s == count else parts[:, s] for s in slots]
    return raw["input_ids"], torch.stack(columns, 1), raw.get("loss_mask")


def _rows(value: Any, name: str, file: Path) -> torch.Tensor:
    """A [T, W] floating tensor (a leading batch axis of 1 is dropped), or one paragraph."""
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        found = str(value.dtype).replace("torch.", "") if isinstance(value, torch.Tensor) else type(value).__name__
        raise DataError(f"The dump's {name} is not a floating-point tensor", path=file, tensor=name,
                        expected="float32 / bfloat16 / float16 tensor [T, W]", found=found,
                        fix="regenerate the dump from the target model's hidden states")
    if value.dim() == 3 and value.shape[0] == 1:
        value = value[0]
    if value.dim() != 2:
        raise ShapeMismatchError(f"The dump's {name} is not one row per token", path=file, tensor=name,
                                 expected="[T, W] (or [1, T, W])", found=list(value.shape),
                                 fix="regenerate the dump")
    return value
