"""Each dump slot's activation statistics against the target's own states for the same tokens, and the
draft's own embedding against the target's: the measurements behind the findings ``embedding-scale``
and ``target-differs`` (causes/states.py, docs/drafter.md § Findings).

A cosine hides a scale (Gemma's embedding without its sqrt(hidden) normalizer reads cosine 1.000003 at
50x too small: ModelOpt examples/speculative_decoding/debug/), so what is compared is the norm ratio,
the relative RMS difference, the largest absolute difference, and the least-squares factor c of
``dump = c * target`` with what it leaves. The target's own states are the verifier's embedding
output (``embed_tokens[ids]``, times sqrt(hidden) for a Gemma target, as its model computes) and,
when the verifier is a small standard Llama (the demo's target, tinyllama.py), every layer's output.
Measured on the layout scan's batches only: no extra pass over the data.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from ..data.batching import Batch
from ..errors import DrafterError
from ..load.verifier import Verifier
from ..measures import SLOT_STATISTICS
from ..model import tinyllama

#: beyond these the difference is no dtype's rounding. An embedding is a table lookup: only the
#: dump's dtype rounds it (bf16 keeps 8 mantissa bits, 0.4%); a recomputed layer output also carries
#: the engine's arithmetic, so its allowance is the capture check's noise ceiling.
EMBED_NOISE = 0.02
LAYER_NOISE = 0.2
#: a target this small (bytes of weights) is recomputed layer by layer; a real one is not
RECOMPUTE_BYTES = 64 << 20
#: rows compared per evaluation: enough to tell a scale or another target from the noise, few enough
#: that the comparison (a tiny target's forward included) costs a few percent of the evaluation
MAX_ROWS = 1024
#: the key of these measurements in Results.extra and the report's data section (declared in measures.py)
STATS = SLOT_STATISTICS.key


@dataclass
class SlotTally:
    """Sums over the compared rows of one slot (dump rows d, target rows s)."""

    slot: int
    layer_id: int
    reference: str  # "embedding" or "recomputed layer"
    rows: int = 0
    dd: float = 0.0
    ds: float = 0.0
    ss: float = 0.0
    max_abs_diff: float = 0.0
    max_abs_target: float = 0.0

    def add(self, d: torch.Tensor, s: torch.Tensor) -> None:
        d, s = d.double(), s.double()
        self.rows += int(d.shape[0])
        self.dd += float((d * d).sum())
        self.ds += float((d * s).sum())
        self.ss += float((s * s).sum())
        if d.numel():
            self.max_abs_diff = max(self.max_abs_diff, float((d - s).abs().max()))
            self.max_abs_target = max(self.max_abs_target, float(s.abs().max()))

    @property
    def noise(self) -> float:
        return EMBED_NOISE if self.reference == "embedding" else LAYER_NOISE

    def to_dict(self) -> dict[str, Any]:
        ss = max(self.ss, 1e-300)
        factor = self.ds / ss
        diff = max(self.dd - 2 * self.ds + self.ss, 0.0)
        left = max(self.dd - 2 * factor * self.ds + factor * factor * self.ss, 0.0)
        rel = math.sqrt(diff / ss)
        ratio = math.sqrt(self.dd / ss)
        return {"slot": self.slot, "layer_id": self.layer_id, "reference": self.reference, "rows": self.rows,
                "norm_ratio": ratio, "relative_rms_diff": rel, "max_abs_diff": self.max_abs_diff,
                "max_abs_target": self.max_abs_target, "scale_factor": factor,
                "scale_residual": math.sqrt(left / max(self.dd, 1e-300)), "noise": self.noise,
                "differs": self.rows > 0 and (rel > self.noise or abs(math.log(max(ratio, 1e-300))) > self.noise)}


@dataclass
class SlotStats:
    """Filled by the layout scan (``update`` per batch); ``to_dict`` is the report's ``slot_statistics``."""

    embed: torch.Tensor  # [V, H] the target's embedding table as stored (rows are read per batch)
    embed_scale: float
    tallies: dict[int, SlotTally]
    tiny: tuple[tinyllama.TinyConfig, dict[str, torch.Tensor]] | None
    draft_embed: torch.Tensor | None  # the draft's own embed_tokens, when it ships one
    draft: SlotTally | None = None
    notes: list[str] = field(default_factory=list)

    @classmethod
    def prepare(cls, verifier: Verifier, slot_ids: tuple[int, ...] | None, draft_embed: torch.Tensor | None,
                table: torch.Tensor | None = None) -> SlotStats:
        """What can be compared for these dumps: the embedding slot (SGLang id -1) always, every other
        slot whose layer is known when the target can be recomputed here, and the draft's own embedding
        (``draft_embed``). ``table``: the verifier's embedding already loaded (the draft borrowed it), so
        it is not read twice; else it is read once, kept on the host in its stored dtype."""
        scale = math.sqrt(verifier.hidden_size) if str(verifier.config.get("model_type", "")).startswith("gemma") \
            else 1.0
        embed = table if table is not None else verifier.embed_tokens()
        notes = []
        try:
            tiny = _recomputable(verifier)
        except DrafterError as exc:   # a NaN in a layer's weight: no layer is compared, and the report says why
            tiny = None
            notes.append(f"the target's layers are not recomputed, so no layer slot is compared: {exc}")
        tallies: dict[int, SlotTally] = {}
        if slot_ids is None:
            notes.append("the slots' layers are unknown, so no slot is compared with the target's states")
        else:
            for slot, layer in enumerate(slot_ids):
                if layer == -1:
                    tallies[slot] = SlotTally(slot, layer, "embedding")
                elif tiny is not None and 0 <= layer < tiny[0].num_hidden_layers:
                    tallies[slot] = SlotTally(slot, layer, "recomputed layer")
        mine = draft_embed if draft_embed is not None and draft_embed.shape == embed.shape else None
        return cls(embed, scale, tallies, tiny, mine,
                   SlotTally(-1, -1, "embedding") if mine is not None else None, notes)

    @property
    def full(self) -> bool:
        """MAX_ROWS rows are compared: later batches add nothing."""
        return max((t.rows for t in self.tallies.values()), default=self.draft.rows if self.draft else 0) >= MAX_ROWS

    def update(self, batch: Batch) -> None:
        """Rows 1..N of the batch's samples (the positions whose token ``input_ids`` holds), whole samples
        until MAX_ROWS rows are compared."""
        done = max((t.rows for t in self.tallies.values()), default=self.draft.rows if self.draft else 0)
        room = MAX_ROWS - done
        if room <= 0:
            return
        take = int((batch.lengths.cumsum(0) < room).sum()) + 1  # whole samples, the last one may pass the cap
        if take < batch.lengths.shape[0]:
            batch = Batch(*(getattr(batch, f.name)[:take] for f in fields(batch)))
        valid = torch.arange(batch.input_ids.shape[1], device=batch.input_ids.device)[None, :] < batch.lengths[:, None]
        ids = batch.input_ids[valid]
        device = batch.states.device
        target = self.embed[ids.to(self.embed.device)].to(device, torch.float32) * self.embed_scale
        if self.draft is not None and self.draft_embed is not None:
            mine = self.draft_embed[ids.to(self.draft_embed.device)].to(device, torch.float32)
            self.draft.add(mine * self.embed_scale, target)
        layers = self._recompute(batch) if self.tiny is not None else None
        for slot, tally in self.tallies.items():
            dumped = batch.states[:, 1:, slot][valid].float()
            if tally.reference == "embedding":
                tally.add(dumped, target)
            elif layers is not None:
                tally.add(dumped, layers[:, 1:, tally.layer_id + 1][valid])

    def _recompute(self, batch: Batch) -> torch.Tensor:
        """[B, T, n+1, H]: the tiny target's states for the batch's tokens, in fp32 (right padding
        cannot reach the valid positions of a causal model)."""
        assert self.tiny is not None
        cfg, w = self.tiny
        ids = torch.cat([batch.first_ids[:, None], batch.input_ids], 1)
        states, _ = tinyllama.forward(cfg, w, ids.cpu())  # tiny: on the host, where tinyllama computes
        return states.to(batch.states.device)

    def to_dict(self) -> dict[str, Any]:
        return {"embed_scale": self.embed_scale, "recomputed": self.tiny is not None,
                "slots": [t.to_dict() for t in self.tallies.values()],
                "draft_embedding": self.draft.to_dict() if self.draft is not None else None, "notes": self.notes}


def _recomputable(verifier: Verifier) -> tuple[tinyllama.TinyConfig, dict[str, torch.Tensor]] | None:
    """The verifier as a tiny Llama this module can run, or None (too big, or another architecture); a
    DrafterError when it is one but cannot be run (a NaN in a layer's weight)."""
    size = sum(Path(f).stat().st_size for f in verifier.store.files)
    if size > RECOMPUTE_BYTES or verifier.config.get("model_type") != "llama" or not verifier.path.is_dir():
        return None
    return tinyllama.load(verifier.path)
