"""The engine's own hidden states that `invoke capture-check` kept (``<run>/engine-states/``, written by
remote/capture/engine_states.py), opened as a second dump set (``eval --engine-states``).

SpecForge's and ModelOpt's dumps hold only the slots training used (three aux and the final), so the
layout the engine will feed is often not in them; the engine's states hold every layer boundary, so
the draft can be scored there on the served layout, the trained one and the best. The folder is only
trusted for the dumps it was made from: every file's tokens must be those of the dump sample it names
(``hs_{i}`` is sample ``i`` of ``--data``) and its width the draft's.
"""
from __future__ import annotations

import re
from pathlib import Path

from ..errors import ConfigError, DataError, ShapeMismatchError
from . import dumpformats
from .dumps import DumpSet

#: hs_{i}: i in ASCII digits without leading zeros, so hs_01 and hs_1 never both name sample 1
NAME = re.compile(r"hs_(0|[1-9][0-9]*)\.safetensors")
REMAKE = ("pass --engine-states the engine-states/ folder of an `invoke capture-check` run on these dumps "
          "(--data) and this target, or run the capture check again")


def open_for(folder: Path, dumps: DumpSet, width: int) -> DumpSet:
    """The engine states as a DumpSet, refused in one paragraph naming the file when they are not
    of these dumps' tokens, of another width, or lack the data_config.json that names their slots."""
    states = DumpSet.open(folder)
    if states.format != dumpformats.SAFETENSORS:
        raise DataError("The engine-states folder does not hold speculators safetensors files", path=folder,
                        expected="hs_{i}.safetensors files written by the capture check",
                        found=dumpformats.NAME.get(states.format, states.format), fix=REMAKE)
    slots = states.slots
    if slots.path is None or slots.layer_ids is None or slots.final_slot is None:
        raise ConfigError("The engine-states folder lacks the data_config.json that names its slots (or it names "
                          "no layer_ids or final_slot): the capture check writes it last, so the folder is "
                          "unfinished", path=folder / "data_config.json", fix=REMAKE)
    if not 0 <= slots.final_slot < len(slots.layer_ids):   # the dumps' own is checked in evaluation._context
        raise ConfigError("The engine-states folder's data_config.json names a final_slot that is none of its "
                          "slots", path=slots.path, field="final_slot",
                          expected=f"0..{len(slots.layer_ids) - 1} (one per layer_ids entry)", found=slots.final_slot,
                          fix=REMAKE)
    for file in states.files:
        _same_as_dump(file, states, dumps, width)
    return states


def _same_as_dump(file: Path, states: DumpSet, dumps: DumpSet, width: int) -> None:
    match = NAME.fullmatch(file.name)
    index = int(match.group(1)) if match else -1
    if not 0 <= index < len(dumps.files):
        raise DataError(f"The engine-state file {file.name} names no sample of the dumps ({len(dumps.files)} "
                        f"files in {dumps.root})", path=file, expected=f"hs_{{i}} with i in 0..{len(dumps.files) - 1}",
                        found=file.name, fix=REMAKE)
    sample = states.load(states.files.index(file))
    expected = len(states.slots.layer_ids or ())
    if sample.hidden.shape[-1] != width or sample.hidden.shape[1] != expected:
        raise ShapeMismatchError("The engine-state file's hidden states are not the draft's width at every "
                                 "slot its data_config.json names", path=file, tensor="hidden_states",
                                 expected=f"[T, {expected}, {width}]", found=list(sample.hidden.shape), fix=REMAKE)
    dumped = dumps.load(index)
    if sample.token_ids.shape != dumped.token_ids.shape or not bool((sample.token_ids == dumped.token_ids).all()):
        raise DataError(f"The engine-state file {file.name} holds other tokens than dump sample {index} "
                        f"({dumped.path}): {sample.token_ids.numel()} tokens against {dumped.token_ids.numel()}, "
                        "so these states were not computed for these dumps", path=file, tensor="token_ids",
                        fix=REMAKE)


def indices(states: DumpSet) -> list[int]:
    """The dump sample each engine-state file holds (``hs_{i}``: sample i), in file order (checked by ``open_for``)."""
    return [int(m.group(1)) if (m := NAME.fullmatch(f.name)) else -1 for f in states.files]
