"""The one rule that says whether run B is faster, slower or the same as run A (bench.compare, the
doctor and the nightly all call :func:`compare`), with an interval and a stated error rate.

Why this rule (docs/bench.md § Comparing two runs): a bench is a few repeats (blocks) of many
requests. Machine drift and a slow repeat move whole repeats, so the repeats, not the requests, are
the independent units: each repeat gives one log value, the two runs' means of those are compared
with a t interval whose variance is pooled over both runs' repeats (few repeats each, so pooling is
what gives the interval its degrees of freedom). Per-request samples set a floor under that variance
(the within-repeat noise they show, so three repeats that happen to agree cannot make a falsely narrow
interval); without them an assumed floor of :data:`NO_SAMPLES_FLOOR` per repeat stands in, stated in
the method. A repeat far off its run's others (more than :data:`OUTLIER_SDS` robust SDs, 10 with
fewer than five repeats: a stall, a dropped link) is set aside and named. The decision's error rate:
an identical pair is called faster or slower with probability at most ``alpha`` (two-sided interval);
a pair whose interval lies inside ±margin is ``same``; anything else is ``undecided``, with the
repeats per run that would likely decide. Pure standard library: the laptop side never imports
numpy (tests/test_dependencies.py).
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

ALPHA = 0.05                 # two-sided: a 95% interval
MARGIN = 0.05                # "same": the interval inside ×0.952–×1.05
OUTLIER_SDS = 5.0            # a repeat this many robust SDs off its run's median is set aside (5+ repeats)
OUTLIER_SDS_FEW = 10.0       # ... with 3 or 4: their MAD is the smallest deviations, too often near zero
NO_SAMPLES_FLOOR = 0.03      # assumed per-repeat noise (log scale) when no per-request samples exist
MAX_MORE = 50                # beyond this many repeats per run "more repeats" is not a plan
FASTER, SLOWER, SAME, UNDECIDED = "faster", "slower", "same", "undecided"
HIGHER, LOWER = "higher", "lower"
METHOD = ("t interval on the log ratio of the runs' mean log values per repeat (repeats as blocks, variance "
          "pooled over both runs' repeats")


@dataclass(frozen=True)
class Blocks:
    """One run's repeats of one metric: a value per repeat, and (with per-request samples) the
    within-repeat noise of each value's log (its standard error from the requests)."""

    values: Sequence[float | None]
    within: Sequence[float] | None = None     # None: no per-request samples


@dataclass
class Verdict:
    """Run B against run A on one metric."""

    metric: str
    ratio: float | None
    lo: float | None
    hi: float | None
    decision: str
    margin: float
    alpha: float
    method: str
    higher_is_better: bool = True
    repeats: tuple[int, int] = (0, 0)
    set_aside: list[str] = field(default_factory=list)
    more_repeats: int | None = None           # undecided: repeats per run that would likely decide
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "ci": [self.lo, self.hi], "decision": self.decision, "margin": self.margin,
                "alpha": self.alpha, "method": self.method, "repeats": list(self.repeats),
                "set_aside": self.set_aside, "more_repeats": self.more_repeats, "note": self.note}

    @property
    def decided(self) -> bool:
        return self.decision not in (UNDECIDED, "not compared")

    def interval_text(self) -> str:
        """``×0.75 (95% CI ×0.69–×0.81)``."""
        if self.ratio is None or self.lo is None or self.hi is None:
            return "no ratio"
        return f"×{self.ratio:.2f} ({level(self.alpha)} CI ×{self.lo:.2f}–×{self.hi:.2f})"

    def sentence(self) -> str:
        """``×0.75 (95% CI ×0.69–×0.81): slower``, with what ``same`` and ``undecided`` mean."""
        if self.ratio is None:
            return f"not compared: {self.note or 'a run has no values'}"
        text = f"{self.interval_text()}: {self.decision}"
        if self.decision == SAME:
            text += f" (within ±{self.margin:.0%})"
        elif self.decision == UNDECIDED:
            more = (f"about {self.more_repeats} repeats per run would likely decide it" if self.more_repeats
                    else f"more than {MAX_MORE} repeats per run would be needed")
            text += f" ({more})"
        if self.set_aside:
            text += f"; set aside: {', '.join(self.set_aside)}"
        return text


def level(alpha: float) -> str:
    """The interval's confidence as people write it: ``95%``, ``97.5%``."""
    return f"{round((1 - alpha) * 100, 2):g}%"


def not_compared(metric: str, why: str, higher_is_better: bool = True) -> Verdict:
    return Verdict(metric, None, None, None, "not compared", MARGIN, ALPHA, METHOD, higher_is_better, note=why)


# --- Student's t without scipy -------------------------------------------------------------------

def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta (Lentz), converged to 1e-12."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1, a - 1
    c, d = 1.0, 1 - qab * x / qap
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for aa in (m * (b - m) * x / ((qam + 2 * m) * (a + 2 * m)),
                   -(a + m) * (qab + m) * x / ((a + 2 * m) * (qap + 2 * m))):
            d = 1 + aa * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + aa / c if abs(1 + aa / c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < 1e-12:
            break
    return h


def _ibeta(a: float, b: float, x: float) -> float:
    if x <= 0 or x >= 1:
        return 0.0 if x <= 0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1 - front * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * _ibeta(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t > 0 else tail


@lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t, by bisection on :func:`t_cdf`."""
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-9:
            break
    return (lo + hi) / 2


# --- the rule ------------------------------------------------------------------------------------

def _logs(values: Sequence[float | None]) -> list[float]:
    return [math.log(v) for v in values if v is not None and math.isfinite(v) and v > 0]


def _kept(logs: list[float], floor: float, label: str) -> tuple[list[float], list[str]]:
    """The repeats kept and the one set aside (at most one per run, and only from three or more): the
    farthest from the run's median, when beyond OUTLIER_SDS robust SDs (1.4826 × MAD, never below the
    floor; OUTLIER_SDS_FEW for 3 or 4 repeats, whose MAD is too often near zero: tests/test_comparison_rule.py)."""
    if len(logs) < 3:
        return logs, []
    mid = statistics.median(logs)
    scale = max(1.4826 * statistics.median(abs(x - mid) for x in logs), floor)
    worst = max(range(len(logs)), key=lambda i: abs(logs[i] - mid))
    if abs(logs[worst] - mid) <= (OUTLIER_SDS if len(logs) >= 5 else OUTLIER_SDS_FEW) * scale:
        return logs, []
    off = math.exp(logs[worst] - mid)
    return logs[:worst] + logs[worst + 1:], [f"{label} repeat {worst + 1} (×{off:.2f} of its run's median)"]


def _floor(a: Blocks, b: Blocks, floor: float | None) -> tuple[float, str]:
    """The per-repeat noise floor and how the method names it."""
    if floor is not None:
        return floor, "no floor (exact per repeat)" if floor == 0 else f"floor {floor:.0%}"
    within = [w for blocks in (a, b) if blocks.within for w in blocks.within if math.isfinite(w)]
    if within and a.within and b.within:
        rms = math.sqrt(sum(w * w for w in within) / len(within))
        return rms, f"floor: the per-request samples' within-repeat noise ({rms:.1%})"
    return NO_SAMPLES_FLOOR, ("no per-request samples: repeat-level blocks only, with an assumed "
                              f"{NO_SAMPLES_FLOOR:.0%} per-repeat floor")


def _decide(lo: float, hi: float, margin: float, higher_is_better: bool) -> str:
    edge = math.log1p(margin)
    if -edge <= lo and hi <= edge:
        return SAME
    if lo > 0 or hi < 0:
        up = lo > 0
        if higher_is_better:
            return FASTER if up else SLOWER
        return SLOWER if up else FASTER
    return UNDECIDED


def _more(d: float, s: float, q: float, n: int, margin: float) -> int | None:
    """Repeats per run at which the interval would likely exclude 1 or fit inside ±margin, if the
    estimate and the spread stay as they are; None beyond MAX_MORE."""
    gaps = [g for g in (abs(d), math.log1p(margin) - abs(d)) if g > 0]
    if not gaps or s <= 0:
        return None
    need = math.ceil(2 * (q * s / max(gaps)) ** 2)
    return need if n < need <= MAX_MORE else None if need > MAX_MORE else n + 1


def compare(metric: str, a: Blocks, b: Blocks, *, higher_is_better: bool = True, alpha: float = ALPHA,
            margin: float = MARGIN, floor: float | None = None) -> Verdict:
    """Run B against run A on ``metric``; ``floor`` overrides the noise floor (0 for a value that is
    exact per repeat, such as a greedy accept length)."""
    la, lb = _logs(a.values), _logs(b.values)
    if not la or not lb:
        return not_compared(metric, "one of the runs has no value for it", higher_is_better)
    lowest, how = _floor(a, b, floor)
    la, out_a = _kept(la, lowest, "A")
    lb, out_b = _kept(lb, lowest, "B")
    df = len(la) + len(lb) - 2
    pooled = (sum((x - statistics.fmean(la)) ** 2 for x in la)
              + sum((x - statistics.fmean(lb)) ** 2 for x in lb)) / df if df > 0 else 0.0
    s = max(math.sqrt(pooled), lowest)
    d = statistics.fmean(lb) - statistics.fmean(la)
    q = t_quantile(1 - alpha / 2, max(df, 1))
    half = q * s * math.sqrt(1 / len(la) + 1 / len(lb))
    lo, hi = d - half, d + half
    decision = _decide(lo, hi, margin, higher_is_better)
    more = _more(d, s, q, max(len(la), len(lb)), margin) if decision == UNDECIDED else None
    method = f"{METHOD}, df {max(df, 1)}; {how})"
    return Verdict(metric, math.exp(d), math.exp(lo), math.exp(hi), decision, margin, alpha, method,
                   higher_is_better, (len(la), len(lb)), out_a + out_b, more)


#: where the tool runs the servers itself (the doctor), an undecided throughput comparison gets one
#: more look after at most MAX_EXTRA more repeats of run B: two looks, each at ALPHA / LOOKS
LOOKS = 2
MAX_EXTRA = 8


def look_alpha() -> float:
    """The level of each of the doctor's looks (:func:`sequential_alpha` over :data:`LOOKS`)."""
    return sequential_alpha(ALPHA, LOOKS)


def extra_repeats(first: Verdict) -> int:
    """How many more repeats of run B the first look asks for: none when it decided, else the repeats
    that would likely decide (:attr:`Verdict.more_repeats`), at most :data:`MAX_EXTRA`."""
    if first.decision != UNDECIDED:
        return 0
    wanted = first.more_repeats - first.repeats[1] if first.more_repeats else MAX_EXTRA
    return max(1, min(wanted, MAX_EXTRA))


def merged(b: Blocks, extra: Blocks) -> Blocks:
    """Run B's repeats and the extra ones as one run (the within-repeat noise only when both have it)."""
    within = list(b.within) + list(extra.within) if b.within is not None and extra.within is not None else None
    return Blocks(list(b.values) + list(extra.values), within)


def sequential_alpha(alpha: float, looks: int) -> float:
    """The level each look uses when a comparison may be looked at up to ``looks`` times (a first
    bench, then each batch of extra repeats): alpha split evenly (Bonferroni), so the chance of any
    wrong faster/slower over all the looks stays at most ``alpha`` however many are taken."""
    return alpha / max(1, looks)
