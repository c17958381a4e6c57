"""Two measurements of the same accept length held against each other.

The client's figure and the server's come from different counters (vLLM's client reads /metrics
around its own window; SGLang's reads the cumulative server-info value; the decode log averages
per interval). They should agree; when they differ by more than ``tolerance`` the measurement
itself is suspect (a window that includes warm-up, a server that restarted, a missed flush).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .numbers import finite

TOLERANCE = 0.10


@dataclass
class CrossCheck:
    a: float | None
    b: float | None
    a_source: str
    b_source: str
    rel_diff: float | None       # |a - b| / mean(a, b)
    agree: bool | None           # None when one side is missing
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def relative_difference(a: float, b: float) -> float:
    """|a - b| relative to their mean, so the order of the two does not matter."""
    mean = (abs(a) + abs(b)) / 2
    return abs(a - b) / mean if mean else 0.0


def cross_check(a: Any, b: Any, *, a_source: str, b_source: str, tolerance: float = TOLERANCE) -> CrossCheck:
    """Compare two accept lengths; a difference beyond ``tolerance`` is flagged."""
    fa, fb = finite(a), finite(b)
    if fa is None or fb is None:
        missing = " and ".join(s for s, v in ((a_source, fa), (b_source, fb)) if v is None)
        return CrossCheck(fa, fb, a_source, b_source, None, None,
                          f"no cross-check: {missing} gave no accept length")
    rel = relative_difference(fa, fb)
    agree = rel <= tolerance
    verb = "agree" if agree else "DISAGREE"
    return CrossCheck(fa, fb, a_source, b_source, rel, agree,
                      f"accept length {fa:.2f} ({a_source}) and {fb:.2f} ({b_source}) {verb}: "
                      f"{rel:.0%} apart (tolerance {tolerance:.0%})")
