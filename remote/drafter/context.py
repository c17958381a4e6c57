"""What an evaluation has loaded before scoring starts: the draft, the dumps, the verifier head and
the facts about them that the report states (``report.build`` reads it; ``evaluate`` fills it)."""
from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .data.chattemplate import Scan
from .data.dumps import DumpSet, Sample, check_sample
from .launch.distributed import SINGLE, World
from .load.checkpoint import CheckpointInfo
from .load.verifier import Verifier
from .model.draft import Eagle3Draft
from .scoring.score import VerifierHead
from .scoring.temperature import TemperatureTally


@dataclass
class EvalContext:
    """Everything loaded before scoring starts (read by report.build)."""

    draft: Eagle3Draft
    info: CheckpointInfo
    dumps: DumpSet
    verifier: Verifier | None
    head: VerifierHead | None
    slot_count: int
    hidden_size: int
    final_slot: int | None
    final_source: str | None
    num_layers: int | None
    device: torch.device
    budget: int
    skipped: dict[str, str] = field(default_factory=dict)  # dump file -> why it was not scored
    extra: dict[str, Any] = field(default_factory=dict)  # what loading found for the cause checks (Results.extra)
    chat: Scan | None = None  # where the target's role markers sit in the samples loaded (chattemplate.py)
    read: dict[str, int] = field(default_factory=lambda: {"samples": 0, "bytes": 0})  # what the loads read
    world: World = SINGLE  # this process's rank of a torchrun (distributed.py); one process: the world of one
    tally: TemperatureTally | None = None  # the counts of the prediction at --temperature (temperature.py)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def load(self, index: int, slots: Sequence[int] | None = None) -> Sample:
        """Sample ``index`` (only ``slots`` of its states, when given), value-checked; one with NaN/inf
        is recorded in ``skipped`` and replaced by a 1-token stand-in, which the batcher drops (it has
        no token pair to score).  Loads run on reader threads: ``read`` is counted under a lock."""
        sample = self.dumps.load(index, slots) if slots is not None else self.dumps.load(index)
        size = sample.hidden.nbytes + sample.token_ids.nbytes
        with self._lock:
            self.read["samples"] += 1
            self.read["bytes"] += size
        if self.chat is not None:
            self.chat.see(index, sample.token_ids)
        problem = check_sample(sample, self.draft.arch.vocab_size)
        if problem is None:
            return sample
        self.skipped[str(sample.path)] = problem
        mask = None if sample.loss_mask is None else sample.loss_mask[:1]
        return replace(sample, token_ids=sample.token_ids[:1], hidden=torch.zeros_like(sample.hidden[:1]),
                       loss_mask=mask)
