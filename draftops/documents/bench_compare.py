"""``draftops.bench-compare/1``: ``compare.json``, what ``invoke bench.compare`` concluded.

Written by ``draftops/bench/compare.py`` (``Comparison.to_dict``, its schema string is ``SCHEMA`` here);
read here once by the nightly run (``draftops.nightly.results``: a night's findings include the
comparison's). The model names what a reader uses: the two runs, the speed-up and the findings; the
rest (verdicts, samples, rows, per-position tables) is kept as written.
"""
from __future__ import annotations

from draftops.documents import Document, Part

SCHEMA = "draftops.bench-compare/1"


class CompareFinding(Part):
    """``findings[]``: one conclusion, as the compare table shows it (✗ ! ✓ ·)."""

    severity: str                  # bad | warn | good | info
    code: str
    text: str


class BenchCompare(Document):
    SCHEMA = SCHEMA
    TASK = "invoke bench.compare"

    a: str | None = None           # the runs compared: a (the baseline, or the older) and b
    b: str | None = None
    speedup: float | None = None
    findings: list[CompareFinding]
