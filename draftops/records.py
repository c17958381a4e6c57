"""What each kind of run puts in the history (``draftops.history``): pure conversions from a run's
own output (a drafter report, a bench result) to a ``RunRecord``, so every task records the same
fields the same way and ``bench compare`` can find a prediction by draft digest and step count.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftops import history
from draftops.errors import DraftopsError, HistoryError
from draftops.history import RunRecord, now_iso
from remote.bench.numbers import finite

if TYPE_CHECKING:                 # the bench models load pydantic; test-drafter's hook does not need them
    from draftops.bench.compare import Comparison
    from draftops.bench.result import BenchResult


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


def bench_record(result: BenchResult, git_rev: str | None) -> RunRecord:
    """A bench run: engine, target, draft digest, settings and headline metrics; the verdict is its
    status (succeeded / failed)."""
    accept = result.accept_length.value if result.accept_length else None
    return RunRecord(
        run_id=result.run_id, kind="bench", host=result.host.name, time=result.time, git_rev=git_rev,
        engine=result.engine.name, engine_version=result.engine.version, target=result.target,
        draft=result.draft.path if result.draft else None,
        draft_digest=result.draft.digest if result.draft else None,
        settings={"mode": result.mode, **result.settings.model_dump(),
                  "speculative": result.speculative.model_dump() if result.speculative else None},
        metrics={"output_throughput": result.metrics.output_throughput.median,
                 "ttft_median_ms": result.metrics.ttft_median_ms.median,
                 "tpot_median_ms": result.metrics.tpot_median_ms.median, "accept_length": accept,
                 "steps": result.steps},
        verdict=result.status)


def compare_record(cmp: Comparison, run_id: str, git_rev: str | None) -> RunRecord:
    """A bench comparison: which two runs, the speedup, the findings; the verdict is the headline
    finding's code (wiring-suspect, config-wrong, draft-limit, spec-slower, ...)."""
    b = cmp.b
    return RunRecord(
        run_id=run_id, kind="compare", host=b.host.name, git_rev=git_rev, engine=b.engine.name,
        engine_version=b.engine.version, target=b.target, draft=b.draft.path if b.draft else None,
        draft_digest=b.draft.digest if b.draft else None,
        settings={"a": cmp.a.run_id, "b": b.run_id, "tolerance": cmp.tolerance},
        metrics={"speedup": cmp.speedup,
                 "accept_length_a": cmp.a.accept_length.value if cmp.a.accept_length else None,
                 "accept_length_b": b.accept_length.value if b.accept_length else None,
                 "findings": [f.code for f in cmp.findings]},
        verdict=cmp.headline.code if cmp.headline else "nothing")
