"""Regression detection across nights: pure functions over the nightly history rows.

The rule is draftops.comparison's, the one bench.compare and the doctor use, with the nights as blocks:
* baseline = the previous ``window`` nights of the same host and setup (failed nights and missing values
  left out; one night far off the others, a stall, is set aside as the rule sets aside a repeat);
* the night's ratio to the baseline (geometric mean) with a 95% interval whose width comes from the
  night-to-night spread of the window (pooled, t quantile; never narrower than a 1% floor);
* REGRESSION when the whole interval lies beyond the threshold in the bad direction; SUSPICIOUS when the
  interval straddles the threshold but the estimate is beyond it; IMPROVED when the whole interval lies
  beyond it in the good direction; UNCHANGED otherwise; INSUFFICIENT DATA with fewer than ``min_nights``
  earlier nights; NOT MEASURED when this night has no value (the step failed: an infrastructure or
  step failure, reported apart from performance). A one-night drop beyond the interval is a
  regression: the interval already holds the nights' own spread.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from draftops import comparison

REGRESSION = "REGRESSION"
SUSPICIOUS = "SUSPICIOUS"
IMPROVED = "IMPROVED"
UNCHANGED = "UNCHANGED"
INSUFFICIENT = "INSUFFICIENT DATA"
NOT_MEASURED = "NOT MEASURED"
VERDICTS = (REGRESSION, SUSPICIOUS, IMPROVED, UNCHANGED, INSUFFICIENT, NOT_MEASURED)
NIGHT_FLOOR = 0.01          # the interval never assumes nights closer than 1% (log scale)


@dataclass(frozen=True)
class MetricVerdict:
    """One metric on one night against its baseline window."""

    metric: str
    verdict: str
    current: float | None
    baseline: float | None = None
    change_pct: float | None = None        # signed: (current - baseline) / |baseline|
    noise_pct: float | None = None         # the nights' spread (pooled SD of the log values, %)
    limit_pct: float | None = None         # the threshold the interval is held against
    nights: int = 0                        # baseline nights used
    lower_is_better: bool = False
    ci_pct: tuple[float, float] | None = None   # the change's 95% interval, %
    set_aside: tuple[str, ...] = ()        # a baseline night the rule left out

    def interval_text(self) -> str:
        """``-20.0% (95% CI -23.1% to -16.8%)``, the change with its interval."""
        if self.change_pct is None:
            return "—"
        if self.ci_pct is None:
            return f"{self.change_pct:+.1f}%"
        return f"{self.change_pct:+.1f}% (95% CI {self.ci_pct[0]:+.1f}% to {self.ci_pct[1]:+.1f}%)"

    @property
    def severity(self) -> int:
        return VERDICTS.index(self.verdict)


def value(metrics: Mapping[str, object], name: str) -> float | None:
    """A finite number, or None (missing, null, NaN, inf, text, bool)."""
    raw = metrics.get(name)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return None
    return float(raw) if math.isfinite(raw) else None


def _pct(ratio: float | None) -> float:
    return 0.0 if ratio is None else (ratio - 1) * 100


def _without_rule(metric: str, current: float, window: Sequence[float], threshold: float,
                  lower_better: bool) -> MetricVerdict:
    """Zero or negative values (no log ratio): unchanged when equal to the baseline's median, else suspicious."""
    base = statistics.median(window)
    change = 0.0 if current == base else math.copysign(math.inf, current - base) if base == 0 else \
        (current - base) / abs(base) * 100
    verdict = UNCHANGED if change == 0 else SUSPICIOUS
    return MetricVerdict(metric, verdict, current, base, change, None, threshold, len(window), lower_better)


def _interval(metric: str, current: float, window: Sequence[float], threshold: float,
              lower_better: bool) -> MetricVerdict:
    """The night against its window by draftops.comparison, the interval held against the threshold."""
    if current <= 0 or min(window) <= 0:
        return _without_rule(metric, current, window, threshold, lower_better)
    got = comparison.compare(metric, comparison.Blocks(list(window)), comparison.Blocks([current]),
                             higher_is_better=not lower_better, margin=threshold / 100, floor=NIGHT_FLOOR)
    ratio, lo, hi = got.ratio or 1.0, got.lo or 1.0, got.hi or 1.0
    edge = math.log1p(threshold / 100)
    bad = (lambda r: math.log(r) > edge) if lower_better else (lambda r: math.log(r) < -edge)
    good = (lambda r: math.log(r) < -edge) if lower_better else (lambda r: math.log(r) > edge)
    if bad(lo) and bad(hi):
        verdict = REGRESSION
    elif good(lo) and good(hi):
        verdict = IMPROVED
    elif bad(ratio):
        verdict = SUSPICIOUS
    else:
        verdict = UNCHANGED
    logs = [math.log(v) for v in window]
    spread = statistics.stdev(logs) * 100 if len(logs) > 1 else None
    return MetricVerdict(metric, verdict, current, current / ratio, _pct(ratio), spread, threshold, got.repeats[0],
                         lower_better, (_pct(lo), _pct(hi)), tuple(s.replace("A repeat", "baseline night")
                                                                  for s in got.set_aside))


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
    return _interval(metric, current, earlier[-window:], threshold, lower_better)


def judge_all(nights: Sequence[Mapping[str, object]], *, threshold: Callable[[str], float],
              lower_better: Callable[[str], bool], window: int, min_nights: int) -> list[MetricVerdict]:
    """Every numeric metric the current night or its window holds, worst verdict first."""
    names = sorted({k for n in nights[-(window + 1):] for k in n if value(n, k) is not None})
    verdicts = [judge(m, nights, threshold=threshold(m), lower_better=lower_better(m), window=window,
                      min_nights=min_nights) for m in names]
    return sorted(verdicts, key=lambda v: (v.severity, v.metric))


def counts(verdicts: Sequence[MetricVerdict]) -> dict[str, int]:
    return {v: sum(1 for x in verdicts if x.verdict == v) for v in VERDICTS}
