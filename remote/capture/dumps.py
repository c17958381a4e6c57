"""Which dump samples the capture check sends, and the refusals a dump earns before any engine starts."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..drafter.data.dumps import DumpSet, Sample, SlotInfo
from .errors import CaptureError, DumpMismatchError

DEFAULT_SAMPLES = 24
MAX_SAMPLES = 4096


@dataclass(frozen=True)
class Picked:
    """The samples to send (indices into the dump set, spread over it) and what the dump says of itself."""

    dumps: DumpSet
    indices: list[int]
    slots: SlotInfo

    @property
    def files(self) -> list[Path]:
        return [self.dumps.files[i] for i in self.indices]


def pick(data: Path, samples: int) -> Picked:
    if not 1 <= samples <= MAX_SAMPLES:
        raise CaptureError(f"--samples {samples} is outside 1..{MAX_SAMPLES}", field="--samples",
                           fix=f"pass a few dozen (default {DEFAULT_SAMPLES})")
    dumps = DumpSet.open(data)
    count = min(samples, len(dumps.files))
    step = len(dumps.files) / count
    indices = sorted({int(i * step) for i in range(count)})
    return Picked(dumps, indices, dumps.slots)


def load(picked: Picked) -> Iterator[Sample]:
    for index in picked.indices:
        yield picked.dumps.load(index)


def check(sample: Sample, vocab_size: int, context: int, target: str) -> None:
    """Token ids the target's vocabulary holds and a length its context takes, or one paragraph."""
    ids = sample.token_ids
    if ids.numel() == 0:
        raise CaptureError("A dump sample holds no tokens", path=sample.path, tensor="token_ids",
                           fix="remove the empty file or regenerate the dump")
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or high >= vocab_size:
        raise DumpMismatchError(
            f"The dump holds token ids outside the vocabulary of the target {target} (vocab_size "
            f"{vocab_size}): ids {low}..{high}, so these dumps were not made with this target's tokenizer",
            path=sample.path, tensor="token_ids", expected=f"ids in [0, {vocab_size})", found=f"{low}..{high}",
            fix="check the target against the one the dumps were made with (--target, or the profile's)")
    if ids.numel() + 1 > context:
        raise DumpMismatchError(
            f"A dump sample is {ids.numel()} tokens long, beyond the context the engine serves the target with "
            f"({context} tokens, one more is generated)", path=sample.path, tensor="token_ids",
            fix="raise the serve profile's context_length (or --max-model-len) to at least "
                f"{ids.numel() + 1}, or check that these dumps belong to this target")
    if not bool(torch.isfinite(sample.hidden).all()):
        raise CaptureError("The dump sample holds NaN or inf hidden states, so it cannot be compared with "
                           "anything", path=sample.path, tensor="hidden_states",
                           fix="regenerate that dump file, or remove it")
