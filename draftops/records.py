"""What each kind of run puts in the history (``draftops.history``): pure conversions from a run's
own output (a drafter report, a bench result) to a ``RunRecord``, so every task records the same
fields the same way and ``bench compare`` can find a prediction by draft digest and step count.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from draftops.history import RunRecord, now_iso
from remote.bench.numbers import finite

if TYPE_CHECKING:                 # the models load pydantic; the task modules import this one at listing time
    from draftops.bench.compare import Comparison
    from draftops.bench.result import BenchResult
    from draftops.documents.drafter_report import DrafterReport


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
        "configured_layer_ids": checkpoint.configured_layer_ids if checkpoint else None,
        "fix_layer_ids": verdict.fix_layer_ids if verdict else None,
        "fix_layer_ids_vllm": verdict.fix_layer_ids_vllm if verdict else None,
        "needs_capture_patch": verdict.needs_capture_patch if verdict else None,
        "serving_convention": verdict.serving_convention if verdict else None,
        "format": checkpoint.format if checkpoint else None,
    }


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
