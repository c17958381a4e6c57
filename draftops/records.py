"""What each kind of run puts in the history (``draftops.history``): pure conversions from a run's
own output (a drafter report, a serve run) to a ``RunRecord``, so every task records the same
fields the same way and ``bench compare`` can find a prediction by draft digest and step count. A
bench run's and a comparison's rows are built next to their models (``draftops.bench.result``,
``draftops.bench.compare``), which this module does not import.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftops import history, tracking
from draftops.errors import DraftopsError, HistoryError
from draftops.history import RunRecord, now_iso
from remote.bench.numbers import finite


def keep(root: Path, what: str, build: Callable[[str | None], RunRecord],
         warn: Callable[[str], None]) -> tracking.Logged | None:
    """Record one run (``build`` gets the project's git revision) in the project's local history, and
    log it to MLflow when ``MLFLOW_TRACKING_URI`` is set (``draftops.tracking``: bounded, never fails
    the run); returns where it was logged, None when it was not.

    Recording never fails the task it follows: a record that cannot be built or written is one
    ``warn`` line naming ``what`` was not recorded and why; the run's own files stay in runs/<id>/."""
    try:
        rec = build(history.project_revision(root))
        history.for_project(root).record(rec)
    except (DraftopsError, OSError) as exc:
        why = str(exc) if isinstance(exc, HistoryError) else f"{type(exc).__name__}: {exc}"
        warn(f"{what} was not recorded in the local history: {why}")
        return None
    return tracking.log(root, rec, warn)


if TYPE_CHECKING:                 # the model loads pydantic; the task modules import this one at listing time
    from draftops.documents.capture_check import CaptureCheck
    from draftops.documents.drafter_report import DrafterReport, MethodPrediction


def test_drafter_record(run_id: str, host: str, final: dict[str, Any], report: DrafterReport | None,
                        args: dict[str, Any], *, git_rev: str | None, config_digest: str | None) -> RunRecord:
    """A test-drafter run: its settings, predicted accept lengths and fix, and the verdict
    (MATCH / MISMATCH / UNKNOWN, or the job state when there is no report)."""
    state = final.get("state")
    status = report.verdict.status if report else None
    return RunRecord(
        run_id=run_id, kind="test-drafter", host=host,
        time=final.get("ended") or final.get("started") or now_iso(), git_rev=git_rev,
        target=(report.verifier.path if report and report.verifier else None) or args.get("verifier"),
        draft=(report.checkpoint.path if report else None) or args.get("ckpt"), draft_digest=config_digest,
        settings={**{k: v for k, v in args.items() if v is not None},
                  "data": (report.data.path if report else None) or args.get("data"),
                  "device": (report.run.device if report else None) or args.get("device"),
                  "torch": report.run.torch if report else None},
        metrics={**_drafter_metrics(report, args), "exit_code": final.get("exit_code"), "state": state},
        verdict=(status or "no-report") if state == "succeeded" else "failed")


def _drafter_metrics(report: DrafterReport | None, args: dict[str, Any]) -> dict[str, Any]:
    """The report's predictions, fix and format as the history keeps them (all None without a report)."""
    accept = report.predicted_accept_length if report else None
    verdict = report.verdict if report else None
    checkpoint = report.checkpoint if report else None
    return {
        "steps": accept.steps if accept and accept.steps is not None else args.get("steps"),
        "basis": accept.basis if accept else None,
        "predicted_served": accept.served if accept else None,
        "predicted_best": accept.best if accept else None,
        "predicted_value": accept.value if accept else None,
        "predicted_walk_served": accept.walk.served if accept else None,
        "predicted_walk_best": accept.walk.best if accept else None,
        "predicted_cond_served": _step_counts(report, "served", "cond_acc"),
        "predicted_cond_best": _step_counts(report, "best", "cond_acc"),
        "predicted_cond_rows_served": _step_counts(report, "served", "cond_total"),
        "predicted_cond_rows_best": _step_counts(report, "best", "cond_total"),
        "configured_layer_ids": checkpoint.configured_layer_ids if checkpoint else None,
        "fix_layer_ids": verdict.fix_layer_ids if verdict else None,
        "fix_layer_ids_vllm": verdict.fix_layer_ids_vllm if verdict else None,
        "needs_capture_patch": verdict.needs_capture_patch if verdict else None,
        "serving_convention": verdict.serving_convention if verdict else None,
        "format": checkpoint.format if checkpoint else None,
        "chat_formatted": report.data.chat_format.chat_formatted if report and report.data.chat_format else None,
        "findings": [f.id for f in report.findings] if report else [],
        "predicted_at_temperature": _at_temperature(report),
    }


def _at_temperature(report: DrafterReport | None) -> dict[str, dict[str, Any]] | None:
    """``--temperature``'s predictions as ``bench compare`` holds a bench at that temperature against
    them: per temperature, the layout role and each draft method's accept length, interval and
    conditional acceptance per step (None when the run made none); keyed by the temperature, so the
    MLflow run gets one metric per temperature and method."""
    part = report.temperature if report else None
    if part is None or not part.predictions:
        return None
    return {f"{p.temperature:g}": {"temperature": p.temperature, "role": part.role,
                                   **{m: {"accept_length": p.method(m).accept_length, "ci": p.method(m).ci,
                                          "cond_acc": p.method(m).cond_acc, "rows": p.method(m).rows,
                                          "per_round": _per_round(p.method(m))}
                                      for m in ("greedy", "probabilistic")}} for p in part.predictions}


def _per_round(fig: MethodPrediction) -> dict[str, Any] | None:
    """A greedy draft's tokens per round on the dumps' text (what a server reports), or None."""
    return fig.per_round.model_dump() if fig.per_round is not None else None


def _step_counts(report: DrafterReport | None, role: str, name: str) -> list[Any] | None:
    """The layout's predicted conditional acceptance per TTT step (``cond_acc``) or the rows each
    counts (``cond_total``), on the basis its accept length was predicted on, so ``bench compare``
    can tell at which position a server parts from the prediction (remote/drafter/report.py takes
    the same counts: the verifier's, the data's without a verifier)."""
    if report is None:
        return None
    evaluation = report.metrics.served if role == "served" else report.metrics.best
    if evaluation is None:
        return None
    counts = (evaluation.verifier if report.metrics.basis == "verifier" else None) or evaluation.data
    values = getattr(counts, name) if counts is not None else None
    return list(values) if values is not None else None


def serve_record(run_id: str, host: str, *, engine: str, engine_version: str | None, target: str,
                 draft: str | None, draft_digest: str | None, asked: dict[str, Any],
                 effective: dict[str, Any], state: str, ready_s: float | None, git_rev: str | None,
                 replaced_exit_s: float | None = None) -> RunRecord:
    """A serve run: what was asked for, what the engine runs with, and whether it came up
    (``ready`` / ``failed``); a baseline server has no draft. ``replaced_exit_s``: with --replace,
    how long the server it replaced took to exit."""
    metrics: dict[str, Any] = {"ready_s": finite(ready_s), "effective": effective}
    if replaced_exit_s is not None:
        metrics["replaced_exit_s"] = finite(replaced_exit_s)
    return RunRecord(run_id=run_id, kind="serve", host=host, git_rev=git_rev, engine=engine,
                     engine_version=engine_version, target=target, draft=draft, draft_digest=draft_digest,
                     settings={k: v for k, v in asked.items() if v is not None}, metrics=metrics, verdict=state)


def capture_check_record(run_id: str, host: str, final: dict[str, Any], doc: CaptureCheck | None,
                         given: dict[str, Any], *, git_rev: str | None) -> RunRecord:
    """A capture-check run: the engine, the slots it matched and each slot's relative error (per
    slot, in the dumps' order); the verdict is the check's status (MATCHED, PARTIAL, ...) or the
    job state when there is no result."""
    state = final.get("state")
    metrics: dict[str, Any] = {"exit_code": final.get("exit_code"), "state": state}
    if doc is not None:
        metrics.update({"slots": len(doc.slots), "matched": sum(1 for s in doc.slots if s.matched),
                        "relative_error": [finite(s.relative_error) for s in doc.slots],
                        "slot_layer_ids": [s.vllm_id for s in doc.slots], "samples": doc.data.samples,
                        "seconds": {k: finite(v) for k, v in doc.seconds.items()}})
    return RunRecord(
        run_id=run_id, kind="capture-check", host=host, time=final.get("ended") or final.get("started") or now_iso(),
        git_rev=git_rev, engine=doc.engine.name if doc else None, engine_version=doc.engine.version if doc else None,
        target=doc.target.path if doc else given.get("target"), draft=given.get("draft"),
        settings={k: v for k, v in given.items() if v is not None}, metrics=metrics,
        verdict=(doc.status if doc else "no-report") if state == "succeeded" else "failed")
