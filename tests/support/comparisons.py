"""A comparison of two bench runs with the predictions the history holds."""
from __future__ import annotations

from draftops.bench import compare as comparing
from draftops.history import History


def compare(hist: History, a, b) -> comparing.Comparison:
    """``bench.compare`` of runs ``a`` and ``b`` against the predictions ``hist`` holds for each."""
    return comparing.compare(a, b, {r.run_id: comparing.find_prediction(hist, r) for r in (a, b)})
