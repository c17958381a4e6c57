"""``draftops.drafter-report/1``: the report ``invoke test-drafter`` pulls home as ``runs/<id>/report.json``.

Written by ``remote/drafter/report.py`` (the table in docs/drafter.md); read here once, then by the
report's tables (``draftops.report``), the history row (``draftops.records``), serve's verdict check
(``draftops.serve.verdicts``) and the nightly metrics. Only the fields the local side reads are
named; each may be absent (older reports of the same version lack the added ones), and those the
tool writes as null are optional here too.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field

from draftops.documents import Document, Part

REPORT_NAME = "report.json"


class ExpectedAcc(Part):
    """``verdict.expected_acc``: the training-reported step-0 accuracy against the served layout's."""

    expected: float | None = None
    served: float | None = None
    best: float | None = None
    flagged: bool = False


class ExpectedAccept(Part):
    """``verdict.expected_accept``: a user's accept length, converted to 1 + accepted/drafts, against the prediction."""

    given: float | None = None
    source: str | None = None
    source_definition: str | None = None
    value: float | None = None
    predicted: float | None = None
    flagged: bool = False


class Comparison(Part):
    """``verdict.comparison``: the paired served-vs-best test."""

    samples: int | None = None
    alpha: float = 0.05
    gain: float | None = None
    gain_ci: list[float | None] = [None, None]
    samples_better: int | None = None
    samples_worse: int | None = None
    sign_test_p: float | None = None
    margin: float | None = None
    tolerance: float | None = None
    outcome: str | None = None


class VerdictPart(Part):
    """``verdict``: the status, what to say about it and the fix."""

    status: str | None = None
    message: str = ""
    diagnosis: str = ""             # added: the message's first part, without the figures
    advice: str = ""                # added: its last part, what to do
    fix_layer_ids: list[int] | None = None
    fix_layer_ids_vllm: list[int] | None = None
    needs_capture_patch: bool | None = None
    serving_convention: str | None = None
    advice_engine: str | None = None
    served_slots: list[int] | None = None
    expected_acc: ExpectedAcc | None = None
    expected_accept: ExpectedAccept | None = None   # added
    comparison: Comparison | None = None
    findings: list[str] = []        # added: the ids of the report's findings, bad ones first


class SlotNorm(Part):
    slot: int
    layer_id: int | None = None
    role: str | None = None
    rms: float | None  # None: overflowed (the report warns which)


class Layout(Part):
    slots: list[int] | None = None
    layer_ids: list[int] | None = None
    acc: float | None = None
    tags: list[str] = []


class TopK(Part):
    """``topk``: per depth (row) and j = 1..k (column), P(target within the draft's top j | the
    prefix within the top k), with the counts behind it (added)."""

    k: int = 0
    correct: list[list[int]] = []
    total: list[int] = []
    acc: list[list[float | None]] = []


class Counts(Part):
    """Accuracies on one basis (data or verifier targets)."""

    full_acc: list[float | None] | None = None
    cond_acc: list[float | None] | None = None
    cond_total: list[int] | None = None      # rows each cond_acc_k counts (those right up to step k-1)
    top5_acc_0: float | None = None
    topk: TopK | None = None                 # added: the per-depth top-k profile (trees)


class Evaluation(Part):
    """``metrics.served`` / ``metrics.best``: one layout evaluated on all samples."""

    layer_ids: list[int] | None = None
    data: Counts | None = None
    verifier: Counts | None = None


class MetricsPart(Part):
    steps: int = 0
    basis: str = "data"
    states: str = "dumps"                # added: whose states the figures came from
    served: Evaluation | None = None
    best: Evaluation | None = None


class EngineLayout(Part):
    """One layout scored on the engine's own states (``engine_states.layouts[]``)."""

    role: str                            # served / trained / best
    states: str = "engine"
    layer_ids: list[int] = []
    layer_ids_vllm: list[int] = []
    step0_acc: float | None = None
    accept_length: float | None = None


class SkippedFile(Part):
    """A file the evaluation read but could not score (NaN/inf states), and why."""

    path: str
    reason: str = ""


class EngineStatesPart(Part):
    """``engine_states`` (added): the draft scored on the states a capture check kept."""

    path: str
    samples: int = 0
    skipped: list[SkippedFile] = []
    basis: str = "data"
    steps: int = 0
    slots: int = 0
    layouts: list[EngineLayout] = []


class Walk(Part):
    served: float | None = None
    best: float | None = None


class Accept(Part):
    """``predicted_accept_length``: what a server should reach, as configured and with the best layout."""

    steps: int | None = None
    basis: str | None = None
    served: float | None = None
    best: float | None = None
    value: float | None = None
    walk: Walk = Walk()
    definition: str | None = None       # added: what the figures count (remote/eagle/acceptlength.py)
    ci: AcceptCi | None = None          # added: the sequential verdict's intervals


class AcceptCi(Part):
    """``predicted_accept_length.ci`` (added): the sequential verdict's interval for each accept length."""

    level: float | None = None
    served: list[float] | None = None
    best: list[float] | None = None


class PositionBucket(Part):
    """One bucket of ``accuracy_by_position.buckets``: token positions ``from``..``to`` of the samples."""

    start: int | None = Field(None, alias="from")
    end: int | None = Field(None, alias="to")
    total: int | None = None
    acc: float | None = None


class ByPosition(Part):
    """``accuracy_by_position`` (added): the served layout's step-0 accuracy by position bucket."""

    layout: str | None = None
    basis: str | None = None
    longest: int | None = None
    buckets: list[PositionBucket] = []


class SequentialPart(Part):
    """``sequential`` (added; null for ``--full``): how many samples the sequential verdict read, and why it stopped."""

    seed: int | None = None
    samples_total: int | None = None
    samples_scored: int | None = None
    samples_read: int | None = None
    scan_samples: int | None = None
    alpha: float | None = None
    decided_by: str | None = None
    outcome: str | None = None
    gain_ci: list[float] | None = None


class PerRound(Part):
    """Tokens per verify round of a greedy-draft server over the dumps' text (``greedy.per_round``)."""

    accept_length: float | None = None
    ci: list[float] | None = None
    rounds: int | None = None
    samples: int | None = None


class MethodPrediction(Part):
    """One draft sampling method's accept length at one temperature (``temperature.predictions[].greedy``)."""

    accept_length: float | None = None
    ci: list[float] | None = None
    cond_acc: list[float | None] = []
    rows: list[int] = []
    samples: int | None = None
    per_round: PerRound | None = None       # greedy only


class TemperaturePrediction(Part):
    temperature: float
    greedy: MethodPrediction = MethodPrediction()
    probabilistic: MethodPrediction = MethodPrediction()

    def method(self, name: str) -> MethodPrediction:
        return self.probabilistic if name == "probabilistic" else self.greedy


class TemperaturePart(Part):
    """``temperature`` (added; null without ``--temperature``): the accept length predicted at each
    sampling temperature asked for, for a greedy and a probabilistic draft (remote/drafter/scoring/temperature.py)."""

    steps: int | None = None
    role: str | None = None             # the layout predicted for: "served", else "best"
    level: float | None = None
    greedy_at_zero: float | None = None
    predictions: list[TemperaturePrediction] = []

    def at(self, temperature: float) -> TemperaturePrediction | None:
        return next((p for p in self.predictions if abs(p.temperature - temperature) < 1e-9), None)


class Checkpoint(Part):
    path: str | None = None
    format: str | None = None
    config_path: str | None = None
    config_digest: str | None = None
    configured_layer_ids: list[int] | None = None


class VerifierPart(Part):
    path: str | None = None


class ChatFormat(Part):
    """``data.chat_format``: the target's chat template against where the dumps' sequences open."""

    status: str | None = None
    chat_formatted: bool | None = None


class DataPart(Part):
    path: str | None = None
    chat_format: ChatFormat | None = None   # added
    samples: int | None = None
    layout_scan_samples: int | None = None


class RunPart(Part):
    device: str | None = None
    torch: str | None = None


class Finding(Part):
    """``findings[]``: one named cause of low acceptance in this draft, with its evidence and fix."""

    id: str
    severity: str = "warn"          # "bad" (serving is pointless) or "warn"
    text: str = ""
    evidence: dict[str, Any] = {}
    fix: str = ""


class DrafterReport(Document):
    """The whole report; a part that is absent reads as its empty default."""

    SCHEMA = "draftops.drafter-report/1"
    TASK = "invoke test-drafter"

    verdict: VerdictPart = VerdictPart()
    findings: list[Finding] = []    # added
    slot_norms: list[SlotNorm] = []
    layouts: list[Layout] = []
    metrics: MetricsPart = MetricsPart()
    engine_states: EngineStatesPart | None = None    # added
    sequential: SequentialPart | None = None    # added
    temperature: TemperaturePart | None = None    # added
    predicted_accept_length: Accept | None = None
    accuracy_by_position: ByPosition | None = None    # added
    checkpoint: Checkpoint = Checkpoint()
    verifier: VerifierPart | None = None
    data: DataPart = DataPart()
    run: RunPart = RunPart()
    warnings: list[str] = []

    @property
    def fixable(self) -> bool:
        """A verdict other than MATCH that names the ids to write (draft-config refuses one without)."""
        return self.verdict.status != "MATCH" and bool(self.verdict.fix_layer_ids)
