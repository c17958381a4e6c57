"""Regression detection across nights: pure functions over the nightly history rows.

The rule (orchestration.md §4.4-4.5: PyTorch HUD's two-point rule, SGLang's previous-runs baseline):
* baseline = the median of the previous ``window`` nights of the same host and setup (failed nights
  and missing values left out), so one odd night does not move it;
* noise = the baseline's spread, 1.4826 × MAD as a percentage of the baseline (a robust standard
  deviation); a move counts only beyond ``max(threshold, 3 × noise)``;
* REGRESSION when the move is beyond that limit in the bad direction on this night and on the night
  before it (each against its own baseline); SUSPICIOUS when only this night; IMPROVED beyond the
  limit in the good direction; UNCHANGED within it; INSUFFICIENT DATA with fewer than ``min_nights``
  earlier nights; NOT MEASURED when this night has no value (the step failed: an infrastructure or
  step failure, reported apart from performance).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

REGRESSION = "REGRESSION"
SUSPICIOUS = "SUSPICIOUS"
IMPROVED = "IMPROVED"
UNCHANGED = "UNCHANGED"
INSUFFICIENT = "INSUFFICIENT DATA"
NOT_MEASURED = "NOT MEASURED"
VERDICTS = (REGRESSION, SUSPICIOUS, IMPROVED, UNCHANGED, INSUFFICIENT, NOT_MEASURED)
MAD_TO_SIGMA = 1.4826
NOISE_SIGMAS = 3.0


@dataclass(frozen=True)
class MetricVerdict:
    """One metric on one night against its baseline window."""

    metric: str
    verdict: str
    current: float | None
    baseline: float | None = None
    change_pct: float | None = None        # signed: (current - baseline) / |baseline|
    noise_pct: float | None = None
    limit_pct: float | None = None         # max(threshold, 3 × noise)
    nights: int = 0                        # baseline nights used
    lower_is_better: bool = False

    @property
    def severity(self) -> int:
        return VERDICTS.index(self.verdict)


def value(metrics: Mapping[str, object], name: str) -> float | None:
    """A finite number, or None (missing, null, NaN, inf, text, bool)."""
    raw = metrics.get(name)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    return float(raw) if math.isfinite(raw) else None


def _baseline(series: Sequence[float]) -> tuple[float, float]:
    """(median, noise %) of the window."""
    base = statistics.median(series)
    mad = statistics.median(abs(v - base) for v in series)
    noise = MAD_TO_SIGMA * mad / abs(base) * 100 if base else 0.0
    return base, noise


def _move(current: float, window: Sequence[float], threshold: float, lower_better: bool
          ) -> tuple[int, float, float, float, float]:
    """(-1 bad / 0 within / +1 good, baseline, change %, noise %, limit %) of one night."""
    base, noise = _baseline(window)
    if base == 0:
        change = 0.0 if current == 0 else math.copysign(math.inf, current)
    else:
        change = (current - base) / abs(base) * 100
    limit = max(threshold, NOISE_SIGMAS * noise)
    worse = change > limit if lower_better else change < -limit
    better = change < -limit if lower_better else change > limit
    return (-1 if worse else 1 if better else 0), base, change, noise, limit


def judge(metric: str, nights: Sequence[Mapping[str, object]], *, threshold: float, lower_better: bool,
          window: int, min_nights: int) -> MetricVerdict:
    """``nights``: metric mappings of the successful nights, oldest first, this night last."""
    if not nights:
        raise ValueError("judge needs at least the current night")
    series = [value(n, metric) for n in nights]
    current = series[-1]
    if current is None:
        return MetricVerdict(metric, NOT_MEASURED, None, lower_is_better=lower_better)
    earlier = [v for v in series[:-1] if v is not None]
    if len(earlier) < min_nights:
        return MetricVerdict(metric, INSUFFICIENT, current, nights=len(earlier), lower_is_better=lower_better)
    base_window = earlier[-window:]
    direction, base, change, noise, limit = _move(current, base_window, threshold, lower_better)
    verdict = UNCHANGED if direction == 0 else IMPROVED if direction > 0 else SUSPICIOUS
    if direction < 0:
        before = earlier[:-1]                  # the previous night, against its own baseline window
        if len(before) >= min_nights and series[-2] is not None:
            if _move(earlier[-1], before[-window:], threshold, lower_better)[0] < 0:
                verdict = REGRESSION
    return MetricVerdict(metric, verdict, current, base, change, noise, limit, len(base_window), lower_better)


def judge_all(nights: Sequence[Mapping[str, object]], *, threshold: Callable[[str], float],
              lower_better: Callable[[str], bool], window: int, min_nights: int) -> list[MetricVerdict]:
    """Every numeric metric the current night or its window holds, worst verdict first."""
    names = sorted({k for n in nights[-(window + 1):] for k in n if value(n, k) is not None})
    verdicts = [judge(m, nights, threshold=threshold(m), lower_better=lower_better(m), window=window,
                      min_nights=min_nights) for m in names]
    return sorted(verdicts, key=lambda v: (v.severity, v.metric))


def counts(verdicts: Sequence[MetricVerdict]) -> dict[str, int]:
    return {v: sum(1 for x in verdicts if x.verdict == v) for v in VERDICTS}
