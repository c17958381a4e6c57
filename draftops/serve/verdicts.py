"""The latest `invoke test-drafter` verdict and `invoke capture-check` measurement for a draft, from the
reports pulled into ``runs/`` here."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # pydantic: loaded only when serve or test-drafter looks for a report
    from draftops.documents.capture_check import CaptureCheck


@dataclass(frozen=True)
class Verdict:
    """One report's verdict about the draft at ``path``."""

    run_id: str
    status: str
    message: str
    configured_ids: list[int] | None
    serving_convention: str | None   # the engine whose reading was judged (the host's, else the format's)
    fix: list[int] | None
    diagnosis: str = ""  # what the engine feeds against what the draft was trained on (no figures)
    accept_served: float | None = None  # predicted accept length as configured
    accept_best: float | None = None  # ... with the layout the draft was trained on
    findings: tuple[tuple[str, str, str, str], ...] = ()  # (id, severity, text, fix) of the report's findings
    chat_formatted: bool | None = None  # the dumps open with the target's role markers (None: not known)

    @property
    def bad(self) -> list[tuple[str, str, str, str]]:
        """The findings that make serving pointless."""
        return [f for f in self.findings if f[1] == "bad"]

    @property
    def why(self) -> str:
        """The diagnosis; the whole message for a report older than the ``diagnosis`` field."""
        return self.diagnosis or self.message

    def stale(self, current_ids: list[int] | None) -> bool:
        """True when the config's ids changed since the report (e.g. after `draft-config`)."""
        return self.configured_ids != current_ids


def _norm(path: str) -> str:
    return path.rstrip("/") or "/"


def latest(runs_dir: Path, draft: str) -> Verdict | None:
    """The newest report whose checkpoint is ``draft`` (run ids sort by start time); a report that is
    unreadable or fails its model (``draftops.documents``) is passed over."""
    from draftops.documents import load  # pydantic: only when serve looks for a verdict
    from draftops.documents.drafter_report import REPORT_NAME, DrafterReport
    from draftops.errors import DocumentError

    if not runs_dir.is_dir():
        return None
    for run in sorted(runs_dir.iterdir(), reverse=True):
        path = run / REPORT_NAME
        if not path.is_file():
            continue
        try:
            doc = load(DrafterReport, path)
        except DocumentError:
            continue
        ckpt, verdict = doc.checkpoint.path, doc.verdict
        if ckpt is None or _norm(ckpt) != _norm(draft) or verdict.status is None:
            continue
        accept = doc.predicted_accept_length
        return Verdict(run.name, verdict.status, verdict.message, doc.checkpoint.configured_layer_ids,
                       verdict.advice_engine or verdict.serving_convention,   # the engine it was judged for
                       verdict.fix_layer_ids, verdict.diagnosis,
                       accept.served if accept else None, accept.best if accept else None,
                       tuple((f.id, f.severity, f.text, f.fix) for f in doc.findings),
                       doc.data.chat_format.chat_formatted if doc.data.chat_format else None)
    return None


def _capture_checks(runs_dir: Path) -> Iterator[tuple[str, CaptureCheck]]:
    """(run id, document) of every capture-check pulled into ``runs_dir``, newest first (run ids sort by
    start time); one that is unreadable or fails its model is passed over."""
    from draftops.documents import load
    from draftops.documents.capture_check import CaptureCheck
    from draftops.errors import DocumentError

    if not runs_dir.is_dir():
        return
    for run in sorted(runs_dir.iterdir(), reverse=True):
        path = run / "capture-check.json"
        if not path.is_file():
            continue
        try:
            yield run.name, load(CaptureCheck, path)
        except DocumentError:
            continue


def capture_check(runs_dir: Path, run_id: str | None = None,
                  dumps: tuple[str, str, str] | None = None) -> tuple[str, bool] | None:
    """The capture-check `test-drafter` reads, and whether it kept the engine's states (vLLM does, SGLang
    cannot: its run folder's ``engine-states/`` is then what `test-drafter` passes as ``--engine-states``):
    the run ``run_id`` names (not kept when its document is gone), else the newest whose every slot matched
    on these ``dumps`` (data, target, engine: what `test-drafter` can take the slot layers from); None
    when there is none."""
    data, target, engine = dumps or ("", "", "")
    for found, doc in _capture_checks(runs_dir):
        if found == run_id or (run_id is None and dumps is not None and doc.status == "MATCHED"
                               and _norm(doc.data.path) == _norm(data) and _norm(doc.target.path) == _norm(target)
                               and doc.engine.name == engine):
            return found, doc.engine_states is not None and doc.engine_states.path is not None
    return (run_id, False) if run_id is not None else None


def kept_engine_states(runs_dir: Path, run_id: str) -> bool:
    """Whether that capture-check kept the engine's states (:func:`capture_check`)."""
    found = capture_check(runs_dir, run_id)
    return bool(found and found[1])


@dataclass(frozen=True)
class Measured:
    """The latest `invoke capture-check` on a draft: what the engine feeds it, measured, not inferred."""

    run_id: str
    status: str                       # MATCH / MISMATCH / UNKNOWN (the draft's side)
    engine: str
    target: str
    configured_ids: list[int] | None  # the ids the config held when it was checked
    fed: list[int] | None             # boundaries the engine feeds
    trained: list[int | None]         # boundaries training fed
    fix_ids: list[int] | None         # in the engine's convention

    def stale(self, current_ids: list[int] | None) -> bool:
        return self.configured_ids != current_ids


def latest_capture(runs_dir: Path, draft: str, target: str, engine: str) -> Measured | None:
    """The newest capture-check of ``draft`` against ``target`` on ``engine`` pulled into ``runs_dir``."""
    for run_id, doc in _capture_checks(runs_dir):
        fed = doc.draft
        if (fed is None or _norm(fed.path) != _norm(draft) or _norm(doc.target.path) != _norm(target)
                or doc.engine.name != engine):
            continue
        return Measured(run_id, fed.status, doc.engine.name, doc.target.path, fed.ids, fed.fed_boundaries,
                        list(fed.trained_boundaries), fed.fix.ids if fed.fix else None)
    return None
