"""The measured cost of a verification round, per concurrency, and the baseline's decode step.

A bench gives throughput (output tok/s) and, for a speculative server, the accept length L (tokens per
sequence per round, the bonus token included). At concurrency c every round yields c × L tokens, so a
round takes ``c × L / throughput`` seconds; the baseline's decode step is ``c / throughput`` (L = 1).
On a GPU verification is nearly flat in the draft tokens until compute-bound; on a CPU it is not, so
the cost is measured where the server runs and fitted per concurrency as a line in the draft tokens
verified per sequence: ``round(c, n) = fixed[c] + per_token[c] × n``. Between measured concurrencies
the fit is interpolated linearly (beyond them, the nearest one's line scaled by c / c_nearest).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """One bench: ``draft_tokens`` 0 is the baseline (no draft); ``accept_length`` the server's
    (1 for the baseline); ``tok_s`` its output throughput."""

    concurrency: int
    draft_tokens: int
    tok_s: float
    accept_length: float = 1.0

    @property
    def round_seconds(self) -> float:
        """Seconds per round: c × tokens per round per sequence / throughput."""
        return self.concurrency * self.accept_length / self.tok_s


@dataclass(frozen=True)
class RoundCost:
    """Seconds per verification round at a concurrency, and the baseline's seconds per decode step.

    ``fixed[c]`` and ``per_token[c]``: the line in the draft tokens verified per sequence fitted at
    concurrency c; ``baseline[c]``: the baseline's decode step there."""

    fixed: Mapping[int, float]
    per_token: Mapping[int, float]
    baseline: Mapping[int, float]

    @property
    def concurrencies(self) -> tuple[int, ...]:
        return tuple(sorted(self.fixed))

    def round_seconds(self, concurrency: int, draft_tokens: int) -> float:
        """Seconds per speculative round at ``concurrency`` verifying ``draft_tokens`` per sequence."""
        if draft_tokens < 1:
            return self.baseline_step(concurrency)
        return _at(concurrency, {c: self.fixed[c] + self.per_token[c] * draft_tokens for c in self.fixed})

    def baseline_step(self, concurrency: int) -> float:
        """Seconds per decode step of the baseline (no draft) at ``concurrency``."""
        return _at(concurrency, dict(self.baseline))

    def baseline_tok_s(self, concurrency: int) -> float:
        return concurrency / self.baseline_step(concurrency)

    def tok_s(self, concurrency: int, draft_tokens: int, accept_length: float) -> float:
        """Predicted output throughput: c × L / round seconds."""
        return concurrency * accept_length / self.round_seconds(concurrency, draft_tokens)

    def break_even(self, concurrency: int, draft_tokens: int) -> float:
        """The accept length at which this many draft tokens is as fast as no draft at all."""
        return self.round_seconds(concurrency, draft_tokens) / self.baseline_step(concurrency)


def _at(concurrency: int, by_c: Mapping[int, float]) -> float:
    """``by_c`` at ``concurrency``: linear between the measured concurrencies, scaled by c outside."""
    if not by_c:
        raise ValueError("no measured concurrency to predict from")
    cs = sorted(by_c)
    if concurrency in by_c:
        return by_c[concurrency]
    if concurrency < cs[0] or concurrency > cs[-1]:
        near = cs[0] if concurrency < cs[0] else cs[-1]
        return by_c[near] * concurrency / near
    hi = next(c for c in cs if c > concurrency)
    lo = max(c for c in cs if c < concurrency)
    w = (concurrency - lo) / (hi - lo)
    return by_c[lo] * (1 - w) + by_c[hi] * w


def line(points: Iterable[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` through (x, y) points; one x, or a slope below 0 (a round that
    verifies more tokens cannot be cheaper: noise between the benches), a flat line at their mean."""
    pts = list(points)
    if not pts:
        raise ValueError("no points to fit")
    n = len(pts)
    mx, my = sum(x for x, _ in pts) / n, sum(y for _, y in pts) / n
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    if sxx == 0:
        return my, 0.0
    slope = sum((x - mx) * (y - my) for x, y in pts) / sxx
    if slope < 0:
        return my, 0.0
    return my - slope * mx, slope


def fit(points: Iterable[Measured]) -> RoundCost:
    """A RoundCost from benches: per concurrency, the baseline's step (the mean where repeated) and a
    line through the speculative rounds; with one speculative setting there, the line runs through
    the baseline's step at 0 draft tokens. A concurrency without a baseline bench cannot be fitted."""
    by_c: dict[int, list[Measured]] = {}
    for p in points:
        if not (math.isfinite(p.tok_s) and p.tok_s > 0 and math.isfinite(p.accept_length) and p.accept_length >= 1):
            raise ValueError(f"a bench at concurrency {p.concurrency} has no usable throughput or accept "
                             f"length ({p.tok_s!r} tok/s, accept length {p.accept_length!r})")
        by_c.setdefault(p.concurrency, []).append(p)
    fixed, per, base = {}, {}, {}
    for c, pts in sorted(by_c.items()):
        plain = [p.round_seconds for p in pts if p.draft_tokens == 0]
        spec = [(float(p.draft_tokens), p.round_seconds) for p in pts if p.draft_tokens > 0]
        if not plain:
            raise ValueError(f"no baseline bench at concurrency {c}: the speed-up needs one")
        base[c] = sum(plain) / len(plain)
        if not spec:
            continue
        if len({x for x, _ in spec}) < 2:
            spec = spec + [(0.0, base[c])]
        fixed[c], per[c] = line(spec)
    if not fixed:
        raise ValueError("no speculative bench to fit the round's cost from")
    return RoundCost(fixed=fixed, per_token=per, baseline=base)
