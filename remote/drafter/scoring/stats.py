"""Is the best layout really better than the served one?  A paired comparison over samples.

Both layouts are scored on the same samples, so the comparison is paired.  The unit is the
sample, not the token: the tokens of one sequence share its topic, style and hidden-state drift,
so counting them as independent trials would overstate the evidence.  The quantity compared is
what serving feels, the predicted accept length ``1 + sum_k full_acc_k`` (every TTT step, since a
miss at step k ends the chain), and its gain ``best - served``.

* Effect and its uncertainty: a paired bootstrap over samples (resample whole samples with
  replacement, recompute both accept lengths on each resample): percentile CI at level ``alpha``.
* Significance: the CI excludes 0 *and* an exact two-sided sign test over the per-sample gains
  (how many samples the best layout serves better vs worse) gives p < ``alpha``.  The sign test
  keeps a handful of samples from looking conclusive (it needs at least 6 untied samples for
  p < 0.05), which a percentile bootstrap alone would not.
* "The same": the best layout raises the predicted accept length by less than ``tolerance`` (a
  fraction, 1% by default) of the served layout's: less than that is no serving difference, and
  near-interchangeable neighbour layers (a draft normalising its inputs barely tells layer l from
  l+1) gain about that much.  Outcome ``same`` then, whether or not that small gain is significant
  (``gain_ci`` shows how large it could be); ``better`` when it gains the margin or more and the gain
  is significant; ``inconclusive`` when it gains that much but the samples do not establish it.
  The layout scan's samples are part of the compared set, so a layout that won the scan by noise
  starts a little ahead; with many more samples than the scan that head start is small, and the
  margin absorbs it.

Deterministic: the bootstrap uses a fixed seed.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch

RESAMPLES = 2000
SEED = 0
SAME, BETTER, INCONCLUSIVE = "same", "better", "inconclusive"


@dataclass(frozen=True)
class PerSample:
    """Chain-correct counts ``correct[i, k]`` and scored rows ``total[i, k]`` of sample i at step k."""

    correct: torch.Tensor  # [n, K] int64
    total: torch.Tensor  # [n, K] int64

    @property
    def samples(self) -> int:
        return int(self.correct.shape[0])


@dataclass(frozen=True)
class Comparison:
    """The paired comparison of the best layout against the served one (report: verdict.comparison)."""

    method: str
    samples: int  # samples compared (those with at least one scored row)
    alpha: float
    tolerance: float  # "the same": a gain below this fraction of the served accept length
    margin: float  # tolerance * served accept length, in tokens per verify
    resamples: int
    steps: int
    served_accept_length: float
    best_accept_length: float
    gain: float  # best - served predicted accept length (tokens per verify)
    gain_ci: list[float]
    step_gain: list[float]  # best - served full_acc_k
    step_gain_ci: list[list[float]]
    samples_better: int
    samples_worse: int
    samples_tied: int
    sign_test_p: float
    significant: bool
    outcome: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare(served: PerSample, best: PerSample, alpha: float, tolerance: float,
            resamples: int = RESAMPLES, seed: int = SEED) -> Comparison:
    """Paired comparison of ``best`` against ``served`` (same samples, same order, same masks)."""
    if served.total.shape != best.total.shape or not torch.equal(served.total, best.total):
        raise ValueError("served and best were not scored on the same rows")
    keep = served.total[:, 0] > 0
    c_served, c_best = served.correct[keep].double(), best.correct[keep].double()
    total = served.total[keep].double()
    n, steps = total.shape
    totals = total.sum(0)
    step_gain = _ratio(c_best.sum(0) - c_served.sum(0), totals)
    served_al = 1.0 + float(_ratio(c_served.sum(0), totals).sum())
    best_al = 1.0 + float(_ratio(c_best.sum(0), totals).sum())
    per_sample = (_ratio(c_best - c_served, totals[None, :])).sum(1)  # each sample's share of the gain
    better = int((per_sample > 1e-12).sum())
    worse = int((per_sample < -1e-12).sum())
    p = sign_test(better, worse)
    draws = _bootstrap(c_best - c_served, total, resamples, seed)  # [R, K] step gains
    lo_q, hi_q = alpha / 2, 1 - alpha / 2
    gain_draws = draws.sum(1)
    gain_ci = [_quantile(gain_draws, lo_q), _quantile(gain_draws, hi_q)]
    step_ci = [[_quantile(draws[:, k], lo_q), _quantile(draws[:, k], hi_q)] for k in range(steps)]
    gain = float(step_gain.sum())
    significant = n > 0 and gain_ci[0] > 0 and p < alpha
    margin = tolerance * served_al
    if n == 0 or gain < margin:
        outcome = SAME
    else:
        outcome = BETTER if significant else INCONCLUSIVE
    return Comparison(
        method="paired over samples: bootstrap percentile CI of the accept-length gain "
               "(whole samples resampled) and an exact two-sided sign test on per-sample gains",
        samples=n, alpha=alpha, tolerance=tolerance, margin=margin, resamples=resamples, steps=steps,
        served_accept_length=served_al, best_accept_length=best_al, gain=gain, gain_ci=gain_ci,
        step_gain=[float(x) for x in step_gain], step_gain_ci=step_ci, samples_better=better,
        samples_worse=worse, samples_tied=n - better - worse, sign_test_p=p, significant=significant,
        outcome=outcome)


def sign_test(wins: int, losses: int) -> float:
    """Exact two-sided sign test p-value (ties already dropped): 2 P(X >= max) for X ~ Bin(n, 1/2)."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = max(wins, losses)
    log_half = n * math.log(0.5)
    logs = [math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1) + log_half
            for j in range(k, n + 1)]
    top = max(logs)
    tail = math.exp(top) * sum(math.exp(v - top) for v in logs)
    return min(1.0, 2.0 * tail)


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / den.clamp(min=1), torch.zeros_like(num))


def _bootstrap(diff: torch.Tensor, total: torch.Tensor, resamples: int, seed: int) -> torch.Tensor:
    """[resamples, K] step gains on samples drawn with replacement (chunked: bounded memory)."""
    n, steps = diff.shape
    if n == 0:
        return torch.zeros(max(resamples, 1), steps, dtype=torch.float64)
    gen = torch.Generator().manual_seed(seed)
    chunk = max(1, min(resamples, 4_000_000 // n))
    out = []
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        idx = torch.randint(0, n, (b, n), generator=gen)
        weights = torch.zeros(b, n, dtype=torch.float64).scatter_add_(
            1, idx, torch.ones(b, n, dtype=torch.float64))
        out.append(_ratio(weights @ diff, weights @ total))
    return torch.cat(out)


def _quantile(values: torch.Tensor, q: float) -> float:
    return float(torch.quantile(values, q))
