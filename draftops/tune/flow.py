"""Run a tune's steps in order within its budget, writing tune.json after each, and end it cleanly
however it ends (the doctor's rule, draftops/doctor/flow.py).

The budget is the tune's clock: every step's seconds, over resumes too. Before a step starts its cost
is estimated (this tune's own server starts and benches once it has some); a confirming step that
does not fit is skipped and said, and the answer is given from what was measured. A failed step,
Ctrl-C, SIGTERM or SIGHUP end the tune at that step: the job it was following and every server it
started are stopped (signals ignored meanwhile: each stop is bounded), tune.json says where it stopped
and what is left running, the report and a history row are written, and ``--resume`` continues.
"""
from __future__ import annotations

import dataclasses
import signal
import time
from collections.abc import Callable
from typing import Any

from draftops import records
from draftops.documents.tune import Step
from draftops.errors import DraftopsError, TuneError
from draftops.history import RunRecord, now_iso
from draftops.runs.steps import Stopped, raise_stopped, signals, stop_followed, stop_servers, stopped_why
from draftops.terminal import clean
from draftops.tune import answer, plan, report, serving, state, steps
from draftops.tune.context import Ctx, Tracker, ran


def exit_code(ctx: Ctx) -> int:
    doc = ctx.doc
    if doc.status == "stopped":
        return 128 + int(doc.why_signal or signal.SIGINT)
    return 0 if doc.status == "done" else 1


def _benches_of(ctx: Ctx, step: Step) -> int:
    if step.name.startswith("confirm-"):
        return len(step.concurrencies or ctx.doc.args.concurrency)
    return len(ctx.doc.args.concurrency)


def _run_step(ctx: Ctx, step: Step, seen: dict[str, float]) -> None:
    k = plan.k_of(step.name)
    if step.name == plan.PROFILE:
        steps.profile(ctx, step, seen)
    elif step.name == plan.PREDICT:
        steps.do_predict(ctx, step)
    elif step.name == plan.ANSWER:
        answer.answer(ctx, step)
    elif step.name.startswith("confirm-"):
        steps.confirm(ctx, step, seen)
    elif k is not None:
        serving.measure(ctx, step, k, ctx.doc.args.concurrency, seen)
    else:
        raise TuneError(f"tune.json names a step {step.name!r} this draftops does not know; start a new tune.")


def run(ctx: Ctx) -> int:
    """Run the unfinished steps; returns the exit code (0 done, 1 failed, 128 + signal)."""
    doc = ctx.doc
    if any(s.state != "pending" for s in doc.steps):
        doc.resumed.append(now_iso())
    doc.status, doc.stopped_at, doc.why, doc.why_signal = "running", None, None, None
    for entry in doc.servers:           # an attempt killed by SIGKILL could not stop its own
        if entry.get("state") not in ("stopped", "not-ours"):
            ctx.say(f"stopping run {entry.get('run_id')}, a server an earlier attempt left")
            serving.stop_server(ctx, entry)
    seen: dict[str, float] = {}
    try:
        with signals(raise_stopped):
            i = 0
            while i < len(doc.steps):      # predict adds the confirming steps after itself
                step = doc.steps[i]
                i += 1
                if step.state in ("done", "skipped"):
                    ctx.say(f"✓ {step.name} (done earlier: {', '.join(step.runs) or 'nothing run'})")
                    continue
                if not _one(ctx, step, seen):
                    break
            else:
                doc.status = "done"
    finally:
        with signals(signal.SIG_IGN):
            _clean_up(ctx)
    return exit_code(ctx)


def _over_budget(ctx: Ctx, step: Step, seen: dict[str, float]) -> str | None:
    """Why ``step`` does not fit what is left of the budget (None: it does). Only a confirming step is
    skipped: the others are what every answer rests on."""
    left = ctx.doc.args.budget_s - ctx.doc.spent_s
    need = plan.estimate_s(step.name, _benches_of(ctx, step), seen)
    if step.name.startswith("measure-") and left <= 0:
        more = state.resume_command(ctx.doc.tune_id, ctx.doc.host, "--budget-s", f"{ctx.doc.spent_s + 3 * need:.0f}")
        raise TuneError(f"the budget of {ctx.doc.args.budget_s:.0f} s is spent ({ctx.doc.spent_s:.0f} s counted) "
                        f"before step {step.name}, which every answer rests on; "
                        f"`{more}` continues with more")
    if step.name.startswith("confirm-") and need > left:
        return (f"the budget has {max(left, 0):.0f} s left of {ctx.doc.args.budget_s:.0f} s, and this step needs "
                f"about {need:.0f} s (a server start and {_benches_of(ctx, step)} bench(es)); --budget-s more "
                "confirms it")
    return None


def _one(ctx: Ctx, step: Step, seen: dict[str, float]) -> bool:
    """Run one step; False when the tune ends here."""
    doc = ctx.doc
    try:
        skip = _over_budget(ctx, step, seen)
    except TuneError as exc:
        step.state, step.error, doc.status, doc.stopped_at, doc.why = "failed", str(exc), "failed", step.name, str(exc)
        ctx.save()
        return False
    if skip is not None:
        step.state, step.outcome = "skipped", {"reason": skip}
        ctx.say(f"▷ {step.name} skipped: {skip}")
        ctx.save()
        return True
    ctx.say(f"▶ {step.name}")
    step.earlier += [r for r in step.runs if r not in step.earlier]
    step.state, step.started, step.ended, step.error, step.runs = "running", now_iso(), None, None, []
    step.outcome = {}
    ctx.tracker.current = None
    ctx.save()
    t0 = time.monotonic()
    try:
        _run_step(ctx, step, seen)
        step.state = "done"
    except (KeyboardInterrupt, Stopped) as exc:
        step.state, doc.status, doc.stopped_at = "stopped", "stopped", step.name
        doc.why, doc.why_signal = stopped_why(exc)
    except (DraftopsError, OSError, ValueError) as exc:
        text = clean(str(exc)) if isinstance(exc, DraftopsError) else f"{type(exc).__name__}: {exc}"
        step.state, step.error, doc.status, doc.stopped_at, doc.why = "failed", text, "failed", step.name, text
    step.seconds = round(time.monotonic() - t0, 1)
    doc.spent_s = round(doc.spent_s + step.seconds, 1)
    if step.name == plan.PROFILE:
        seen["profile"] = step.seconds
    step.ended = now_iso()
    try:
        ctx.save()
    except TuneError as exc:
        if doc.status == "running":
            step.state, step.error, doc.status = "failed", str(exc), "failed"
            doc.stopped_at, doc.why = step.name, str(exc)
    return step.state in ("done", "skipped")


def _clean_up(ctx: Ctx) -> None:
    """Stop the job being followed and every server started, say what is left, write state and report."""
    doc, host = ctx.doc, ctx.host
    if doc.status == "running":
        doc.status, doc.why = "failed", "the tune ended unexpectedly (see the traceback)"
    job = ctx.tracker.current
    if job and doc.status != "done":
        stop_followed(host, job, "the tune", ctx.say, ctx.warn)
    doc.left_running = stop_servers(doc.servers, lambda entry: serving.stop_server(ctx, entry),
                                    lambda e: f"K={e.get('k')}")
    try:
        ctx.save()
    except TuneError as exc:
        ctx.warn(str(exc))
    _record(ctx)
    try:
        paths = report.write(ctx.doc, ctx.folder)
        ctx.say(f"report: {paths['markdown']} (and {paths['html'].name}, {paths['json'].name})")
    except (DraftopsError, OSError) as exc:
        ctx.warn(f"the report could not be written: {clean(str(exc))}")


def _record(ctx: Ctx) -> None:
    """The tune is a row of the history: its status, the best per concurrency, every run it made."""
    doc = ctx.doc
    best = {str(b.concurrency): {"k": b.k, "predicted_tok_s": b.predicted_tok_s, "measured_tok_s": b.measured_tok_s}
            for b in doc.best}
    rec = RunRecord(run_id=doc.tune_id, kind="tune", host=doc.host, engine=doc.engine, draft=doc.args.draft,
                    settings=doc.args.model_dump(mode="json"),
                    metrics={"runs": doc.runs(), "best": best, "median_error": doc.median_error,
                             "off_from": doc.off_from, "spent_s": doc.spent_s, "stopped_at": doc.stopped_at},
                    verdict=doc.status)
    records.keep(ctx.host.project_root, f"tune {doc.tune_id}", lambda rev: dataclasses.replace(rec, git_rev=rev),
                 ctx.warn)


def start(ctx_host: Any, doc: Any, folder: Any, say: Callable[[str], None]) -> Ctx:
    """The context a run works in; tune.json names a job as soon as it starts."""
    holder: dict[str, Ctx] = {}

    def on_start(run_id: str) -> None:
        ctx = holder["ctx"]
        running = next((s for s in ctx.doc.steps if s.state == "running"), None)
        if running is not None:
            ran(running, run_id)
            ctx.save()

    ctx = Ctx(ctx_host, doc, folder, say, Tracker(say, on_start))
    holder["ctx"] = ctx
    return ctx
