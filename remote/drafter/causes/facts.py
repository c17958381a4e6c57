"""What the cause checks may read: the options, the loaded context and the passes' results, in one
object, so a new check needs no new plumbing through evaluation.py and report.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..measures import Measure

if TYPE_CHECKING:  # only types: the checks must not import the evaluator (it imports them)
    from ..context import EvalContext
    from ..options import EvalOptions
    from ..verdict.results import Results


@dataclass
class Facts:
    """One evaluation's inputs and measurements, as the cause checks see them."""

    opts: EvalOptions
    ctx: EvalContext
    res: Results
    extra: dict[str, Any]  # measurements a check asked the passes to make, keyed by measures.py's keys

    def measured(self, measure: Measure) -> Any:
        """One measurement (declared in measures.py), or None when the passes did not make it."""
        return self.extra.get(measure.key)
