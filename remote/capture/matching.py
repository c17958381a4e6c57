"""Each dumped slot against every boundary the engine returned: relative errors, the match, the runner-up.

Relative error of slot s against boundary b, pooled over every token of every sample sent:
``sqrt(sum |dump_s - served_b|^2 / sum |dump_s|^2)`` (float64 sums). A slot *matches* boundary b
when its error there is below ``MATCH_FRACTION`` of the distance from b to its nearest neighbouring
boundary, measured the same way on the engine's own states (closer to b than to anything one
layer's update away, so no two boundaries can both match; a target whose layers change the state
little gets a tight threshold), and below ``MATCH_CEILING`` (next to the embedding, whose norm is
small beside the first layer's update, half a step would let a slot 25% off pass as a match; the
engine's own arithmetic stays far below 5%: 3e-5 in fp32 on the demo, bf16 rounding keeps 8 bits).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

MATCH_FRACTION = 0.5
MATCH_CEILING = 0.05
#: at most this many token rows are kept for the "not this target" fits, and at most KEEP_VALUES
#: values of served states in all (a deep, wide target keeps fewer rows)
KEEP_ROWS = 2048
KEEP_VALUES = 64 << 20


def rows_to_keep(boundaries: int, hidden: int, samples: int) -> int:
    """Rows per sample to keep for the fits."""
    total = max(64, min(KEEP_ROWS, KEEP_VALUES // max(1, boundaries * hidden)))
    return max(1, total // max(1, samples))


@dataclass
class Tally:
    """Running sums over the samples sent."""

    slots: int
    boundaries: int
    sq_diff: torch.Tensor = field(init=False)        # [S, B]
    sq_dump: torch.Tensor = field(init=False)        # [S]
    sq_served: torch.Tensor = field(init=False)      # [B]
    sq_step: torch.Tensor = field(init=False)        # [B-1]: |served_b+1 - served_b|^2
    dot: torch.Tensor = field(init=False)            # [S, B]: for cosines
    tokens: int = 0
    samples: int = 0
    kept_dump: list[torch.Tensor] = field(default_factory=list)     # rows [r, S, H]
    kept_served: list[torch.Tensor] = field(default_factory=list)   # rows [r, B, H]

    def __post_init__(self) -> None:
        self.sq_diff = torch.zeros(self.slots, self.boundaries, dtype=torch.float64)
        self.sq_dump = torch.zeros(self.slots, dtype=torch.float64)
        self.sq_served = torch.zeros(self.boundaries, dtype=torch.float64)
        self.sq_step = torch.zeros(max(self.boundaries - 1, 0), dtype=torch.float64)
        self.dot = torch.zeros(self.slots, self.boundaries, dtype=torch.float64)

    def add(self, dump: torch.Tensor, served: torch.Tensor, rows_per_sample: int) -> None:
        """One sample: ``dump`` [T, S, H] and ``served`` [T, B, H]."""
        d, s = dump.to(torch.float64), served.to(torch.float64)
        d_sq, s_sq = (d * d).sum(dim=(0, 2)), (s * s).sum(dim=(0, 2))
        dot = torch.einsum("tsh,tbh->sb", d, s)
        self.sq_diff += d_sq[:, None] + s_sq[None, :] - 2 * dot
        self.sq_dump += d_sq
        self.sq_served += s_sq
        self.dot += dot
        if self.boundaries > 1:
            self.sq_step += ((s[:, 1:] - s[:, :-1]) ** 2).sum(dim=(0, 2))
        self.tokens += d.shape[0]
        self.samples += 1
        every = max(1, math.ceil(d.shape[0] / max(1, rows_per_sample)))
        self.kept_dump.append(dump[::every].to(torch.float32))
        self.kept_served.append(served[::every].to(torch.float32))

    def errors(self) -> torch.Tensor:
        """[S, B] relative errors."""
        return (self.sq_diff.clamp(min=0) / self.sq_dump.clamp(min=1e-300)[:, None]).sqrt()

    def cosines(self) -> torch.Tensor:
        return self.dot / (self.sq_dump[:, None].sqrt() * self.sq_served[None, :].sqrt()).clamp(min=1e-300)

    def neighbour_distance(self) -> torch.Tensor:
        """[B] relative distance from each boundary to its nearest neighbour, on the engine's own states."""
        step = (self.sq_step.clamp(min=0) / self.sq_served[:-1].clamp(min=1e-300)).sqrt()
        step_back = (self.sq_step.clamp(min=0) / self.sq_served[1:].clamp(min=1e-300)).sqrt()
        out = torch.full((self.boundaries,), math.inf, dtype=torch.float64)
        if self.boundaries > 1:
            out[:-1] = torch.minimum(out[:-1], step)
            out[1:] = torch.minimum(out[1:], step_back)
        return out


def threshold_at(neighbour_distance: float) -> float:
    """The match threshold at a boundary whose nearest neighbour is ``neighbour_distance`` away."""
    half = MATCH_FRACTION * neighbour_distance if math.isfinite(neighbour_distance) else math.inf
    return min(half, MATCH_CEILING)


@dataclass(frozen=True)
class SlotMatch:
    """One dumped slot: the nearest boundary, its error, the runner-up, and whether it is a match."""

    slot: int
    boundary: int
    error: float
    runner_up: int | None
    runner_up_error: float | None
    threshold: float
    matched: bool
    cosine: float
    norm_ratio: float          # |dump| / |served at the nearest boundary|, pooled

    def to_dict(self) -> dict[str, Any]:
        return {"slot": self.slot, "boundary": self.boundary, "relative_error": self.error,
                "runner_up": self.runner_up, "runner_up_error": self.runner_up_error,
                "threshold": self.threshold, "matched": self.matched, "cosine": self.cosine,
                "norm_ratio": self.norm_ratio}


def match(tally: Tally) -> list[SlotMatch]:
    errors, cosines, near = tally.errors(), tally.cosines(), tally.neighbour_distance()
    out = []
    for s in range(tally.slots):
        order = torch.argsort(errors[s]).tolist()
        best = int(order[0])
        second = int(order[1]) if len(order) > 1 else None
        threshold = threshold_at(float(near[best]))
        error = float(errors[s, best])
        ratio = math.sqrt(float(tally.sq_dump[s]) / max(float(tally.sq_served[best]), 1e-300))
        out.append(SlotMatch(s, best, error, second, float(errors[s, second]) if second is not None else None,
                             threshold, error < threshold, float(cosines[s, best]), ratio))
    return out


def error_table(tally: Tally) -> list[list[float]]:
    """Every slot's error against every boundary (for the report's full table)."""
    return [[round(float(e), 6) for e in row] for row in tally.errors()]


@dataclass
class PostNormTally:
    """Each slot against the one state SGLang returns, the final layer's output after the final norm:
    the slot, RMS-normalized per token, fitted per channel (the norm's weight, unknown here) to it."""

    slots: int
    hidden: int
    nn: torch.Tensor = field(init=False)       # [S, H] sum of n^2
    ns: torch.Tensor = field(init=False)       # [S, H] sum of n * served
    ss: torch.Tensor = field(init=False)       # [H] sum of served^2
    tokens: int = 0
    samples: int = 0

    def __post_init__(self) -> None:
        self.nn = torch.zeros(self.slots, self.hidden, dtype=torch.float64)
        self.ns = torch.zeros(self.slots, self.hidden, dtype=torch.float64)
        self.ss = torch.zeros(self.hidden, dtype=torch.float64)

    def add(self, dump: torch.Tensor, served: torch.Tensor) -> None:
        """``dump`` [T, S, H], ``served`` [T, H] (post-norm)."""
        d, s = dump.to(torch.float64), served.to(torch.float64)
        n = d / d.pow(2).mean(dim=-1, keepdim=True).add(1e-6).sqrt()
        self.nn += (n * n).sum(dim=0)
        self.ns += (n * s[:, None, :]).sum(dim=0)
        self.ss += (s * s).sum(dim=0)
        self.tokens += d.shape[0]
        self.samples += 1

    def errors(self) -> list[float]:
        """Per slot: what is left of the served states after the best per-channel fit, relative."""
        left = (self.ss[None, :] - self.ns ** 2 / self.nn.clamp(min=1e-300)).clamp(min=0).sum(dim=1)
        return [float(x) for x in (left / self.ss.sum().clamp(min=1e-300)).sqrt()]
