"""Per position, predicted against measured: where a served draft parts from test-drafter.

An accept length says *that* a server falls short of the prediction; the step where the two part
says *where* (issue 24): at step 0 the draft already gets other hidden states than in training (the
input wiring: layer ids, the capture), while a step 0 that agrees and a later step that falls short
points at what only later steps use (the TTT/attention path, the num-steps settings).

Both sides are conditional acceptances, P(step k right | steps < k right): test-drafter's
``cond_acc_k`` (teacher-forced, on its basis) and the server's per-position counts made conditional
(``draftops.bench.result.build_per_position``, whose ``definition`` the table quotes). This module
knows no comparison: ``draftops.bench.compare`` hands it the numbers and turns its verdict into a
finding.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from draftops.bench.result import PerPosition

#: two conditional acceptances (probabilities) part when they differ by more than this
POSITION_TOLERANCE = 0.10
#: a measured position is judged only when at least this many drafts got to it (fewer: noise)
MIN_REACHED = 20


@dataclass
class StepRow:
    step: int
    predicted: float | None       # the prediction's own layout (served ids, or the fix now served)
    trained: float | None         # the best (trained) layout's, shown when the prediction is for other ids
    measured: float | None
    reached: float | None         # drafts that got to this position
    verdict: str                  # agree | low | high | too few drafts | not judged | no figure


@dataclass
class Part:
    """Where measured and predicted first differ by more than the tolerance (None: they do not)."""

    step: int
    direction: str                # low | high
    measured: float
    predicted: float


@dataclass
class PositionTable:
    """One run's per-position comparison, with its verdict as (severity, code, text)."""

    run_id: str
    prediction_run: str
    role: str                     # served | best: which layout ``predicted`` is for
    available: bool
    definition: str | None
    note: str | None
    source: str | None
    tolerance: float = POSITION_TOLERANCE
    rows: list[StepRow] = field(default_factory=list)
    part: Part | None = None
    trained_part: Part | None = None
    finding: tuple[str, str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _at(values: list[Any] | None, k: int) -> Any:
    return values[k] if values is not None and k < len(values) else None


def _few(count: float | None) -> bool:
    return count is not None and count < MIN_REACHED


def _first_part(predicted: list[float | None], rows: list[int] | None, measured: PerPosition,
                tol: float) -> Part | None:
    """The first judged step where the two differ by more than ``tol``. A step too few drafts reached,
    or whose prediction counts too few rows, ends the search: every later step has fewer still."""
    for k, (pred, meas) in enumerate(zip(predicted, measured.conditional, strict=False)):
        if _few(_at(measured.reached, k)) or _few(_at(rows, k)):
            return None
        if pred is not None and meas is not None and abs(meas - pred) > tol:
            return Part(k, "low" if meas < pred else "high", meas, pred)
    return None


def _verdict(k: int, pred: float | None, meas: float | None, counts: tuple[float | None, int | None],
             part: Part | None, tol: float) -> str:
    reached, rows = counts
    if _few(reached):
        return "too few drafts"
    if _few(rows):
        return "too few rows predicted"
    if meas is None or pred is None:
        return "no figure"
    if part is not None and k > part.step:
        return "not judged"
    if abs(meas - pred) <= tol:
        return "agree"
    return "low" if meas < pred else "high"


def _rows(predicted: list[float | None], rows: list[int] | None, trained: list[float | None] | None,
          measured: PerPosition, part: Part | None, tol: float) -> list[StepRow]:
    out = []
    for k in range(max(len(predicted), len(measured.conditional))):
        pred, meas, reached = _at(predicted, k), _at(measured.conditional, k), _at(measured.reached, k)
        out.append(StepRow(k, pred, _at(trained, k), meas, reached,
                           _verdict(k, pred, meas, (reached, _at(rows, k)), part, tol)))
    return out


def _f(x: float) -> str:
    return f"{x:.2f}"


WIRING = ("the input wiring: the server feeds the draft other hidden states than training (the layer ids as "
          "the engine reads them, the capture of each layer, an embedding slot)")
LATER = ("the TTT/attention path or the num-steps settings: the first step gets the states training used, the "
         "later steps do not continue as in training (the draft's attention and position handling as the "
         "engine builds it, more speculative steps than the draft was trained for)")


def _part_text(label: str, part: Part, source: str, tol: float) -> tuple[str, str, str]:
    said = (f"{label} per position: measured and predicted conditional acceptance part at step {part.step} "
            f"(measured {_f(part.measured)}, predicted {_f(part.predicted)} by {source}, tolerance ±{tol:.2f})")
    if part.direction == "high":
        return ("info", "positions-above", f"{said}: the server accepts more there than the evaluation predicts; "
                "the benchmark's text is easier to draft than the evaluation data.")
    if part.step == 0:
        return "warn", "positions-input", f"{said}: step 0 is low, so suspect {WIRING}."
    return ("warn", "positions-later", f"{said}, after agreeing at steps 0..{part.step - 1}: step 0 is right and "
            f"a later step low, so suspect {LATER}.")


def _agree_text(label: str, table: PositionTable, source: str) -> tuple[str, str, str]:
    judged = [r.step for r in table.rows if r.verdict == "agree"]
    steps = f"steps 0..{judged[-1]}" if len(judged) > 1 else "step 0"
    said = (f"{label} per position: measured conditional acceptance is within ±{table.tolerance:.2f} of the "
            f"prediction by {source} at {steps}")
    if table.trained_part is not None and table.trained_part.step == 0:
        t = table.trained_part
        return ("info", "positions-config",
                f"{said}, and parts from the trained layout's at step 0 (measured {_f(t.measured)}, trained layout "
                f"{_f(t.predicted)}): the server runs the served ids faithfully, and those ids feed the draft "
                "other hidden states than training; the config is what is wrong.")
    return "good", "positions-agree", f"{said}: no position parts from the prediction."


def compare_positions(label: str, run_id: str, measured: PerPosition, predicted: list[float | None],
                      *, prediction_run: str, role: str, trained: list[float | None] | None = None,
                      predicted_rows: list[int] | None = None, trained_rows: list[int] | None = None,
                      tol: float = POSITION_TOLERANCE) -> PositionTable:
    """Hold one run's measured per-position acceptance against the prediction's per-step one
    (``trained``: the best layout's, for a prediction about ids test-drafter called wrong; ``*_rows``:
    the rows each predicted step counts, when the history has them)."""
    table = PositionTable(run_id=run_id, prediction_run=prediction_run, role=role, available=measured.available,
                          definition=measured.definition, note=measured.note, source=measured.source,
                          tolerance=tol)
    if not measured.available:
        table.rows = [StepRow(k, p, _at(trained, k), None, None, "no figure") for k, p in enumerate(predicted)]
        return table
    table.part = _first_part(predicted, predicted_rows, measured, tol)
    table.trained_part = _first_part(trained, trained_rows, measured, tol) if trained else None
    table.rows = _rows(predicted, predicted_rows, trained, measured, table.part, tol)
    layout = "the served ids" if role == "served" else "the layer ids now served"
    source = f"test-drafter run {prediction_run} for {layout}"
    if table.part is not None:
        table.finding = _part_text(label, table.part, source, tol)
    elif any(r.verdict == "agree" for r in table.rows):
        table.finding = _agree_text(label, table, source)
    return table
