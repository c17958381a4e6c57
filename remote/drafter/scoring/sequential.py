"""The sequential verdict: score samples in a seeded random order and stop as soon as the paired
served-vs-best comparison is decided, with error rates that hold however often it is looked at.

Why not the full pass's test checked after every block: a fixed-sample p-value looked at again and
again crosses alpha by chance far more often than alpha.  A *confidence sequence* is an interval
around the unknown mean that covers it at every sample count at once, with probability 1 - alpha
(time-uniform, by Ville's inequality), so stopping the first time it excludes a value costs nothing.
The one here is the predictable plug-in empirical-Bernstein CS of Waudby-Smith & Ramdas ("Estimating
means of bounded random variables by betting", JRSS-B 2023, Theorem 2 with its tuned lambda): for values
known to lie in [lo, hi], it adapts to their variance, so near-constant gains decide in a few samples.

The quantity.  For each sample i with scored rows: its own accept-length gain
``x_i = sum_k (best_ik - served_ik) / total_ik`` and its served accept length
``s_i = 1 + sum_k served_ik / total_ik`` (``*_ik``: chain-correct rows of step k, as stats.py counts them).
"Better" is ``E[x] >= tolerance * E[s]`` (the gain reaches the margin, a fraction of the served accept
length), "the same" is the opposite.  Both sides meet in one mean: ``y_i = x_i - tolerance * s_i``, bounded
in ``[-K - tolerance * (K + 1), K - tolerance]``; a CS on E[y] of level 1 - alpha (each side alpha / 2) decides:

* the upper bound below 0: ``same`` (wrong only if E[y] >= 0, i.e. the upper side missed: probability <= alpha/2);
* the lower bound above 0: ``better`` (E[x] > margin >= 0; wrong only if the lower side missed: <= alpha/2).

Whatever the truth, only one of the two mistakes is possible, so a wrong answer has probability at most
alpha / 2; the intervals reported (the gain, each accept length) are CSs of the same level 1 - alpha, so
a decided "better" comes with a gain interval above 0.  The means are over samples (each sample weighs
the same), the full pass's accept lengths over positions (a long sample weighs more); they agree when
accuracy does not vary with length.  Samples the layout scan picked "best" on are not used here
(evaluation.py scores them last): the scan's choice is then a fixed hypothesis for the test, and its
noise cannot favour the layout it chose.

Without a decision by the end of the data, evaluation.py applies the full pass's rule (stats.py) to all
samples, so the sequential verdict then is the full pass's.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import DataError
from .score import LayoutScore
from .stats import BETTER, SAME, PerSample

#: samples per block: the rule is checked after each block (the batches are capped at this many samples)
BLOCK = 16
METHOD = ("sequential: samples in a seeded random order, scored in blocks, stopped when a time-uniform "
          "confidence sequence (predictable plug-in empirical Bernstein, Waudby-Smith & Ramdas 2023) on the "
          "mean per-sample gain minus the margin lies wholly above 0 (better) or below 0 (same); a wrong "
          "answer at most alpha/2 under optional stopping")


#: why the metrics pass stopped (the report's ``sequential.decided_by``)
DECIDED = "the sequential test decided"
ONE_LAYOUT = "one layout measured (nothing to compare): one block"
NON_FINITE = "non-finite values: the verdict is UNKNOWN"
END_OF_DATA = "undecided at the end of the data: the full pass's rule on every sample"


def order(count: int, seed: int) -> list[int]:
    """The samples ``0..count-1`` in the seeded random order they are scored in (stated in the report)."""
    out = list(range(count))
    random.Random(seed).shuffle(out)
    return out


@dataclass
class ConfidenceSequence:
    """A time-uniform CS for the mean of values in ``[lo, hi]`` (PrPl-EB, one bound per side, each at
    ``alpha``; ``bounds()`` is the running intersection, so it only ever narrows)."""

    lo: float
    hi: float
    alpha: float
    count: int = 0
    _sum_lam: float = 0.0
    _sum_lam_x: float = 0.0
    _sum_psi: float = 0.0
    _sum_x: float = 0.0
    _sum_sq: float = 0.0
    _mean: float = 0.5   # predictable estimates of the scaled mean and variance (before the next value)
    _var: float = 0.25
    _lower: float = 0.0
    _upper: float = 1.0

    def add(self, value: float) -> None:
        if not math.isfinite(value):
            raise DataError("A per-sample value of the sequential test is not finite", found=value,
                            expected=f"a number in [{self.lo:g}, {self.hi:g}]",
                            fix="rerun with --full to see which samples' counts are broken")
        if not self.lo - 1e-9 <= value <= self.hi + 1e-9:
            raise DataError("A per-sample value of the sequential test lies outside its bounds", found=value,
                            expected=f"a number in [{self.lo:g}, {self.hi:g}]",
                            fix="this is a bug in the counts; rerun with --full")
        x = min(1.0, max(0.0, (value - self.lo) / (self.hi - self.lo)))
        t = self.count + 1
        log_term = math.log(1.0 / self.alpha)
        lam = min(math.sqrt(2.0 * log_term / (self._var * t * math.log(1.0 + t))), 0.5)
        self._sum_lam += lam
        self._sum_lam_x += lam * x
        self._sum_psi += 4.0 * (x - self._mean) ** 2 * (-math.log(1.0 - lam) - lam) / 4.0
        self.count = t
        self._sum_x += x
        self._mean = (0.5 + self._sum_x) / (t + 1)
        self._sum_sq += (x - self._mean) ** 2
        self._var = (0.25 + self._sum_sq) / (t + 1)
        centre = self._sum_lam_x / self._sum_lam
        width = (log_term + self._sum_psi) / self._sum_lam
        self._lower = max(self._lower, centre - width)
        self._upper = min(self._upper, centre + width)

    def bounds(self) -> tuple[float, float]:
        """The interval in the values' own units (the whole range before any value)."""
        span = self.hi - self.lo
        lower, upper = self._lower, max(self._upper, self._lower)   # an empty intersection: a point
        return self.lo + span * lower, self.lo + span * upper


def values(served: PerSample, best: PerSample | None, steps: int) -> tuple[torch.Tensor, torch.Tensor,
                                                                          torch.Tensor | None]:
    """(gain x, served accept length s, best accept length b) per sample with scored rows."""
    keep = served.total[:, 0] > 0
    total = served.total[keep].double()
    share = torch.where(total > 0, 1.0 / total.clamp(min=1), torch.zeros_like(total))
    s = 1.0 + (served.correct[keep].double() * share)[:, :steps].sum(1)
    if best is None:
        return torch.zeros_like(s), s, None
    if not torch.equal(served.total, best.total):
        raise ValueError("served and best were not scored on the same rows")
    b = 1.0 + (best.correct[keep].double() * share)[:, :steps].sum(1)
    return b - s, s, b


@dataclass
class SequentialTest:
    """The stopping rule on per-sample values, fed as samples are scored (``observe``)."""

    alpha: float
    tolerance: float
    steps: int
    compared: bool = True   # False: only one layout is measured (nothing to decide, only its accept length)
    role: str = "served"   # that one layout's role when nothing is compared ("served" or "best")
    decision: ConfidenceSequence = field(init=False)
    gain: ConfidenceSequence = field(init=False)
    served: ConfidenceSequence = field(init=False)
    best: ConfidenceSequence = field(init=False)
    outcome: str | None = None
    decided_at: int | None = None

    def __post_init__(self) -> None:
        k, tol = float(self.steps), self.tolerance
        half = self.alpha / 2   # each side at alpha / 2: the decision's CS and the reported ones are one level
        self.decision = ConfidenceSequence(-k - tol * (k + 1), k - tol, half)
        self.gain = ConfidenceSequence(-k, k, half)
        self.served = ConfidenceSequence(1.0, 1.0 + k, half)
        self.best = ConfidenceSequence(1.0, 1.0 + k, half)

    @property
    def samples(self) -> int:
        return self.served.count

    def observe(self, gain: torch.Tensor, served: torch.Tensor, best: torch.Tensor | None) -> str | None:
        """Add samples' values in scoring order; the outcome once decided (then later values only narrow
        the reported intervals; the decision stays)."""
        gains, serveds = gain.tolist(), served.tolist()
        bests = best.tolist() if best is not None else None
        for i, s in enumerate(serveds):
            self.served.add(s)
            if not self.compared or bests is None:
                continue
            self.gain.add(gains[i])
            self.best.add(bests[i])
            self.decision.add(gains[i] - self.tolerance * s)
            if self.outcome is None:
                lower, upper = self.decision.bounds()
                if upper < 0:
                    self.outcome, self.decided_at = SAME, self.samples
                elif lower > 0:
                    self.outcome, self.decided_at = BETTER, self.samples
        return self.outcome

    def to_dict(self) -> dict[str, Any]:
        def ci(cs: ConfidenceSequence) -> list[float] | None:
            return list(cs.bounds()) if cs.count else None
        return {"statistic": "mean over samples of (gain - tolerance x served accept length), each sample's "
                             "own accept lengths (1 + sum_k chain-correct_k / scored_k)",
                "alpha": self.alpha,
                "error_rates": {"better_when_same": self.alpha / 2, "same_when_better": self.alpha / 2,
                                "any": self.alpha / 2},
                "tolerance": self.tolerance, "samples": self.samples, "decided_at": self.decided_at,
                "outcome": self.outcome, "decision_cs": ci(self.decision) if self.compared else None,
                "gain_mean": _mean(self.gain), "gain_ci": ci(self.gain) if self.compared else None,
                "accept_length": self._accept(ci), "ci_level": 1 - self.alpha}

    def _accept(self, ci: Callable[[ConfidenceSequence], list[float] | None]) -> dict[str, Any]:
        """Each measured layout's mean per-sample accept length and its interval."""
        if self.compared:
            return {"served": {"mean": _mean(self.served), "ci": ci(self.served)},
                    "best": {"mean": _mean(self.best), "ci": ci(self.best)}}
        one = {"mean": _mean(self.served), "ci": ci(self.served)}
        return {"served": one if self.role == "served" else None, "best": one if self.role == "best" else None}


@dataclass
class Watch:
    """The metrics pass's stop check: feeds the test the samples scored since the last look (their
    per-sample counts, in scoring order) and says whether to stop: the comparison is decided, or, with
    one layout to measure, ``minimum`` samples are in."""

    test: SequentialTest
    basis: str
    role: str
    minimum: int = BLOCK
    seen: int = 0
    done: bool = False

    def __call__(self, scores: Mapping[str, LayoutScore]) -> bool:
        def new(role: str) -> PerSample:
            score = scores[role]
            counts = score.counts(self.basis) or score.data
            rows = counts.per_sample()
            return PerSample(rows.correct[self.seen:], rows.total[self.seen:])

        if self.test.compared:
            served, best = new("served"), new("best")
            gain, s, b = values(served, best, self.test.steps)
            self.test.observe(gain, s, b)
        else:
            served = new(self.role)
            self.test.role = self.role
            _, s, _ = values(served, None, self.test.steps)
            self.test.observe(s, s, None)
        self.seen += served.samples
        self.done = (self.test.outcome is not None if self.test.compared
                     else self.test.samples >= self.minimum)
        return self.done


def _mean(cs: ConfidenceSequence) -> float | None:
    return cs.lo + (cs.hi - cs.lo) * cs._sum_x / cs.count if cs.count else None
