"""What each kind of run puts in the history (``draftops.history``): pure conversions from a run's
own output (a drafter report, a serve run) to a ``RunRecord``, so every task records the same
fields the same way and ``bench compare`` can find a prediction by draft digest and step count. A
bench run's and a comparison's rows are built next to their models (``draftops.bench.result``,
``draftops.bench.compare``), which this module does not import.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftops import history
from draftops.errors import DraftopsError, HistoryError
from draftops.history import RunRecord, now_iso
from remote.bench.numbers import finite


def keep(root: Path, what: str, build: Callable[[str | None], RunRecord], warn: Callable[[str], None]) -> None:
    """Record one run (``build`` gets the project's git revision) in the project's local history.

    Recording never fails the task it follows: a record that cannot be built or written is one
    ``warn`` line naming ``what`` was not recorded and why; the run's own files stay in runs/<id>/."""
    try:
        history.for_project(root).record(build(history.project_revision(root)))
    except (DraftopsError, OSError) as exc:
        why = str(exc) if isinstance(exc, HistoryError) else f"{type(exc).__name__}: {exc}"
        warn(f"{what} was not recorded in the local history: {why}")


def _get(doc: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc


def test_drafter_record(run_id: str, host: str, final: dict[str, Any], report: dict[str, Any] | None,
                        args: dict[str, Any], *, git_rev: str | None, config_digest: str | None) -> RunRecord:
    """A test-drafter run: its settings, predicted accept lengths and fix, and the verdict
    (MATCH / MISMATCH / UNKNOWN, or the job state when there is no report)."""
    accept = _get(report, "predicted_accept_length") or {}
    verdict = _get(report, "verdict") or {}
    steps = accept.get("steps") if isinstance(accept, dict) else None
    metrics: dict[str, Any] = {
        "steps": steps if isinstance(steps, int) else args.get("steps"),
        "basis": accept.get("basis"),
        "predicted_served": finite(accept.get("served")),
        "predicted_best": finite(accept.get("best")),
        "predicted_value": finite(accept.get("value")),
        "predicted_walk_served": finite(_get(accept, "walk", "served")),
        "predicted_walk_best": finite(_get(accept, "walk", "best")),
        "configured_layer_ids": _get(report, "checkpoint", "configured_layer_ids"),
        "fix_layer_ids": verdict.get("fix_layer_ids"),
        "fix_layer_ids_vllm": verdict.get("fix_layer_ids_vllm"),
        "needs_capture_patch": verdict.get("needs_capture_patch"),
        "serving_convention": verdict.get("serving_convention"),
        "format": _get(report, "checkpoint", "format"),
        "exit_code": final.get("exit_code"),
    }
    state = final.get("state")
    status = verdict.get("status") if isinstance(verdict, dict) else None
    metrics["state"] = state
    return RunRecord(
        run_id=run_id, kind="test-drafter", host=host,
        time=final.get("ended") or final.get("started") or now_iso(), git_rev=git_rev,
        target=_get(report, "verifier", "path") or args.get("verifier"),
        draft=_get(report, "checkpoint", "path") or args.get("ckpt"), draft_digest=config_digest,
        settings={**{k: v for k, v in args.items() if v is not None},
                  "data": _get(report, "data", "path") or args.get("data"),
                  "device": _get(report, "run", "device") or args.get("device"),
                  "torch": _get(report, "run", "torch")},
        metrics=metrics,
        verdict=(status or "no-report") if state == "succeeded" else "failed")


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
