"""The doctor's check steps: capture-check, test-drafter (before and after the fix) and the fix itself
(patch-sglang.apply where needed, draft-config --from-report), each the tool runs and history rows of
the single tasks."""
from __future__ import annotations

import dataclasses
import shlex
from typing import TYPE_CHECKING, Any

from draftops import history, records
from draftops.capture import flow as capture_flow
from draftops.doctor import plan
from draftops.doctor.context import STEPS_K, Ctx, Skip, host_cmd, profile_of, ran
from draftops.doctor.state import Step
from draftops.drafter import flow as drafter_flow
from draftops.drafter.asked import Asked
from draftops.drafter.demo import ensure_demo
from draftops.errors import DoctorError, ServeRefused
from draftops.runs import jobs
from draftops.runs.tools import run_tool
from draftops.serve import profiles
from draftops.serve.request import DEMO_TARGET, demo_dir
from draftops.terminal import clean

if TYPE_CHECKING:
    from draftops.documents.drafter_report import DrafterReport


def capture(ctx: Ctx, step: Step) -> None:
    """`invoke capture-check`: a short-lived engine instance says which layer each dumped slot holds."""
    host, args = ctx.host, ctx.args
    chosen = profile_of(ctx)
    root = demo_dir(host.state_dir)
    if ctx.demo:
        ensure_demo(host, ctx.tracker)
        data, target = f"{root}/data", f"{root}/{DEMO_TARGET}"
    else:
        data, target = str(args.data), args.target or chosen.settings.target or ""
        if not target:
            raise ServeRefused(f"No target model for the capture check: serve profile {chosen.name!r} of host "
                               f"{host.name!r} has no `target:`; set it, or run the doctor with --no-capture.")
    done = capture_flow.run(host, capture_flow.Check(chosen, data, target, ctx.draft_path()), ctx.tracker)
    ran(step, done.run_id)
    done.check()
    doc = capture_flow.read(done)
    step.outcome = {"run_id": done.run_id, "status": doc.status if doc else None,
                    "message": doc.headline if doc else None}
    step.commands = [host_cmd(ctx, f"capture-check --draft {shlex.quote(args.draft)}"
                               + (f" --data {shlex.quote(args.data)}" if args.data else ""))]


def check(ctx: Ctx, step: Step) -> None:
    """`invoke test-drafter`: the draft against its dumps, outside any server; its findings and fix. The
    task's own flow, given this doctor's capture-check run (if it ran one) instead of a look-up."""
    args = ctx.args
    asked = Asked(ckpt=None if ctx.demo else args.draft, data=None if ctx.demo else str(args.data), steps=STEPS_K,
                  measured=ctx.done_outcome(plan.CAPTURE).get("run_id"))
    found = drafter_flow.test_drafter([ctx.host], asked, ctx.tracker, ctx.warn, find_capture=False)
    done, report = found.done, found.report
    ran(step, done.run_id)
    done.check()
    if report is None:
        raise DoctorError(f"test-drafter run {done.run_id} left no report.json; see `invoke logs {done.run_id}`.")
    step.outcome = drafter_outcome(report, done.run_id)
    flags = "" if ctx.demo else f" --ckpt {shlex.quote(ctx.args.draft)} --data {shlex.quote(str(ctx.args.data))}"
    step.commands = [host_cmd(ctx, f"test-drafter{flags}")]
    ctx.progress(f"  {report.verdict.status}: {accept_words(report)}; {len(report.findings)} finding(s)")


def accept_words(report: DrafterReport) -> str:
    """The predicted accept lengths in words, only those the report holds: a MATCH (or a recheck)
    has no other layout to fix to, and "3.43 as configured, — with the fix" read as a broken line."""
    served, best = (_fmt(report.predicted_accept_length, role) for role in ("served", "best"))
    if served == "—" and best == "—":
        return "no predicted accept length"
    words = f"predicted accept length {served} as configured"
    return words + (f", {best} with the fix" if best not in ("—", served) and report.verdict.status != "MATCH"
                    else "")


def _fmt(accept: Any, role: str) -> str:
    value = getattr(accept, role, None) if accept is not None else None
    return f"{value:.2f}" if isinstance(value, (int, float)) else "—"


def drafter_outcome(report: DrafterReport, run_id: str) -> dict[str, Any]:
    """What the doctor's report tells of a test-drafter run: what training fed (the dumped slots),
    what the configured ids feed, the verdict, the findings, the prediction, the fix."""
    verdict, accept = report.verdict, report.predicted_accept_length

    def per_step(evaluation: Any) -> list[Any] | None:
        if evaluation is None:
            return None
        counts = (evaluation.verifier if report.metrics.basis == "verifier" else None) or evaluation.data
        return list(counts.cond_acc) if counts is not None and counts.cond_acc is not None else None

    return {
        "run_id": run_id, "status": verdict.status, "message": verdict.message, "fixable": report.fixable,
        "fix_layer_ids": verdict.fix_layer_ids, "fix_layer_ids_vllm": verdict.fix_layer_ids_vllm,
        "needs_capture_patch": verdict.needs_capture_patch, "serving_convention": verdict.serving_convention,
        "advice_engine": verdict.advice_engine,
        "served_slots": verdict.served_slots,
        "configured_layer_ids": report.checkpoint.configured_layer_ids, "format": report.checkpoint.format,
        "checkpoint": report.checkpoint.path, "data": report.data.path, "samples": report.data.samples,
        "samples_total": report.sequential.samples_total if report.sequential else None,
        "trained_slots": [{"slot": s.slot, "layer_id": s.layer_id, "role": s.role} for s in report.slot_norms],
        "predicted": {"steps": accept.steps if accept else None, "served": accept.served if accept else None,
                      "best": accept.best if accept else None},
        "predicted_cond": {"served": per_step(report.metrics.served), "best": per_step(report.metrics.best)},
        "findings": [{"id": f.id, "severity": f.severity, "text": f.text, "fix": f.fix} for f in report.findings],
        "bad_findings": [f.id for f in report.findings if f.severity == "bad"],
    }


# --- the fix -----------------------------------------------------------------------------------------

def fix(ctx: Ctx, step: Step) -> None:
    """`invoke draft-config --from-report` (a backup of the config first), and `patch-sglang.apply` where
    SGLang serves and the fix needs the embedding captured."""
    found = ctx.done_outcome(plan.CHECK)
    if not found.get("fixable"):
        raise Skip(f"test-drafter said {found.get('status')}: no layer ids to rewrite")
    host = ctx.host
    engine = profiles.serving_engine(host.spec)
    if found.get("needs_capture_patch") and engine != "vllm":
        patched = run_tool(host, "remote.sglang_patch", ["apply", "--out", jobs.RUN_DIR], name="patch-sglang-apply",
                           view=ctx.tracker, env={"DRAFTOPS_STATE_DIR": host.state_dir})
        ran(step, patched.run_id)
        _record_plain(ctx, patched.run_id, "patch-sglang", patched.final, {"action": "apply"})
        patched.check()
        step.commands.append(host_cmd(ctx, "patch-sglang.apply"))
    check_run = str(found["run_id"])
    ckpt = ctx.draft_path()
    tool_args = ["--ckpt", ckpt, "--out", jobs.RUN_DIR, "--from-report", f"{host.runs_dir}/{check_run}/report.json"]
    tool_args += ["--engine", engine] if engine == "vllm" else ["--sglang-status"]
    if ctx.demo:
        tool_args += ["--target", f"{demo_dir(host.state_dir)}/{DEMO_TARGET}"]
    elif ctx.args.target:
        tool_args += ["--target", ctx.args.target]
    done = run_tool(host, "remote.draft_config", tool_args, name="draft-config", view=ctx.tracker,
                    env={"DRAFTOPS_STATE_DIR": host.state_dir})
    ran(step, done.run_id)
    from draftops.documents.draft_config import DraftConfigResult
    result = done.document(DraftConfigResult) if done.ok else None
    outcome = {"config": result.config, "old_ids": result.old_ids, "written_ids": result.written_ids,
               "backup": result.backup, "changed": result.changed, "warnings": list(result.warnings)} if result else {}
    _record_plain(ctx, done.run_id, "draft-config", done.final, {"ckpt": ckpt, "from_report": check_run},
                  draft=ckpt, verdict="changed" if outcome.get("changed") else None)
    done.check()
    if outcome and not outcome.get("changed"):      # a resumed fix: an earlier attempt may have written it
        outcome.update(_earlier_change(ctx, step) or {})
    step.outcome = {**outcome, "run_id": done.run_id}
    step.commands.append(host_cmd(ctx, f"draft-config --ckpt {shlex.quote(ctx.args.draft)} --from-report {check_run}"))
    ctx.progress(f"  {clean(str(outcome.get('old_ids')))} → {clean(str(outcome.get('written_ids')))}; backup "
                 f"{clean(str(outcome.get('backup')))}")


def _earlier_change(ctx: Ctx, step: Step) -> dict[str, Any] | None:
    """What an earlier, interrupted attempt of the fix changed (its draft-config run's own result on the
    host): a resumed fix finds the config already rewritten, and must still report the original ids
    and the backup, not ``[0, 2, 4] → [0, 2, 4]; backup None``."""
    from draftops.documents import parse
    from draftops.documents.draft_config import DraftConfigResult
    from draftops.errors import DraftopsError
    from remote.jsonread import loads
    for run_id in reversed(step.earlier):
        where = f"{ctx.host.runs_dir}/{run_id}/draft_config.json"
        try:
            doc = parse(DraftConfigResult, loads(ctx.host.agent.read(where, cap=1 << 20).data), where)
        except (DraftopsError, ValueError):
            continue                # not a draft-config run, or it left no whole result
        if doc.changed:
            return {"old_ids": doc.old_ids, "backup": doc.backup, "changed": True, "changed_by": run_id}
    return None


def _record_plain(ctx: Ctx, run_id: str, kind: str, final: dict[str, Any], settings: dict[str, Any], *,
                  draft: str | None = None, verdict: str | None = None) -> None:
    """A run of a tool without a history row of its own (draft-config, patch-sglang), so every doctor
    step is a run in the history."""
    state = final.get("state")
    rec = history.RunRecord(run_id=run_id, kind=kind, host=ctx.host.name, draft=draft, settings=settings,
                            time=final.get("ended") or history.now_iso(),
                            metrics={"exit_code": final.get("exit_code"), "state": state},
                            verdict=(verdict or "succeeded") if state == "succeeded" else "failed")
    records.keep(ctx.host.project_root, f"run {run_id}",
                 lambda rev: dataclasses.replace(rec, git_rev=rev), ctx.warn)


def recheck(ctx: Ctx, step: Step) -> None:
    if not ctx.state.step(plan.FIX).outcome.get("run_id"):
        raise Skip("nothing was fixed, so nothing to check again")
    check(ctx, step)
