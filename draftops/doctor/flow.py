"""Run a doctor's plan step by step, writing its state after each, and end it cleanly however it ends.

A failed step (its error), Ctrl-C, SIGTERM or SIGHUP end the doctor at that step: the job it was
following is stopped (a tool's run must not outlive the doctor), every server it started is stopped
(unless the doctor finished and --keep-serving asked to keep the last), the state says where it
stopped and what is left running, and the report is written. ``--resume`` then continues from the
first step that did not finish; finished steps are never run again.
"""
from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable
from typing import Any

from draftops import records, tracking
from draftops.doctor import plan, report, steps
from draftops.doctor.state import State, resume_command
from draftops.errors import DoctorError, DraftopsError, ToolFailed
from draftops.history import RunRecord, now_iso
from draftops.link.host import Host
from draftops.runs.steps import Stopped, raise_stopped, signals, stop_followed, stop_servers, stopped_why
from draftops.terminal import clean

EXIT = {"healthy": 0, "fixed": 0, "unhealthy": 3, "not-fixed": 3, "failed": 1}


def exit_code(state: State) -> int:
    """0 healthy or fixed, 3 findings left, 1 a failed step, 128 + signal when stopped."""
    if state.status == "stopped":
        return 128 + int(state.why_signal or signal.SIGINT)
    return EXIT.get(state.status, 1)


def run(host: Host, state: State, say: Callable[[str], None]) -> State:
    """Run ``state``'s unfinished steps in order; returns the state as it ended (also written)."""
    def on_start(run_id: str) -> None:       # doctor.json names a job as soon as it runs
        running = next((s for s in state.steps if s.state == "running"), None)
        if running is not None:
            steps.ran(running, run_id)
            state.save()

    tracker = steps.Tracker(say, on_start)
    ctx = steps.Ctx(host, state, say, say, tracker)
    if any(s.state != "pending" for s in state.steps):
        state.resumed.append(now_iso())
    state.status, state.stopped_at, state.why, state.why_signal = "running", None, None, None
    try:
        with signals(raise_stopped):
            for step in state.steps:
                if step.finished:
                    say(f"✓ {plan.TITLES[step.name]} (done earlier: {', '.join(step.runs) or 'nothing run'})")
                    continue
                if not _one(ctx, step):
                    break
            else:
                state.status = verdict(state)
    finally:
        with signals(signal.SIG_IGN):        # the clean-up is bounded; a second signal does not cut it
            _clean_up(ctx)
    return state


def _one(ctx: steps.Ctx, step: Any) -> bool:
    """Run one step; False when the doctor ends here."""
    state, say = ctx.state, ctx.say
    say(f"▶ {plan.TITLES[step.name]}")
    step.earlier += [run for run in step.runs if run not in step.earlier]     # an attempt that did not finish
    step.state, step.started, step.ended, step.error, step.runs, step.outcome = "running", now_iso(), None, None, [], {}
    ctx.tracker.current = None
    state.save()
    try:
        steps.run_step(ctx, step)
        step.state = "done"
    except steps.Skip as why:
        step.state, step.outcome = "skipped", {"reason": str(why)}
        say(f"  skipped: {why}")
    except (KeyboardInterrupt, Stopped) as exc:
        step.state, state.status, state.stopped_at = "stopped", "stopped", step.name
        state.why, state.why_signal = stopped_why(exc)
    except (DraftopsError, OSError) as exc:
        text = _failure_text(exc, state)
        step.state, step.error, state.status, state.stopped_at, state.why = "failed", text, "failed", step.name, text
    step.ended = now_iso()
    try:
        state.save()
    except DoctorError as exc:      # a full disk: the doctor ends here, the file keeps the last step it took
        if state.status == "running":
            step.state, step.error, state.status, state.stopped_at, state.why = \
                "failed", str(exc), "failed", step.name, str(exc)
    return step.state in ("done", "skipped")


def _failure_text(exc: DraftopsError | OSError, state: State) -> str:
    """A step's failure in one paragraph. A job left queued past its bound is cancelled as the doctor
    ends (_clean_up: a check that started later would have nobody to read it), so the task's "it stays
    queued" would be untrue here: say what the doctor does instead, and how to try again."""
    if isinstance(exc, ToolFailed) and (note := exc.result.queued_note()) is not None:
        return (f"run {exc.result.run_id} did not start: {note}. The doctor cancels it as it ends; "
                f"`{resume_command(state.doctor_id, state.host)} --max-pending SECONDS` tries again with a longer "
                "bound, once the queue has room.")
    return clean(str(exc)) if isinstance(exc, DraftopsError) else f"{type(exc).__name__}: {exc}"


def verdict(state: State) -> str:
    """How a doctor that ran every step ends: healthy/unhealthy without --fix, fixed/not-fixed with it."""
    first = state.step(plan.CHECK).outcome
    if not state.args.fix:
        return "healthy" if first.get("status") == "MATCH" and not first.get("bad_findings") else "unhealthy"
    if state.step(plan.FIX).state == "skipped":
        return "healthy" if first.get("status") == "MATCH" and not first.get("bad_findings") else "not-fixed"
    again = state.step(plan.RECHECK).outcome
    if again.get("status") != "MATCH" or again.get("bad_findings"):    # a cause the rewrite cannot reach is left
        return "not-fixed"
    if state.has(plan.COMPARE):
        fixed = state.step(plan.COMPARE).outcome.get(plan.FIXED) or {}
        return "fixed" if fixed.get("within_tolerance") else "not-fixed"
    return "fixed"


def _clean_up(ctx: steps.Ctx) -> None:
    """Stop the job being followed and the servers started, say what is left, write state and report."""
    state, host = ctx.state, ctx.host
    finished = state.status not in ("running", "stopped", "failed")
    if state.status == "running":          # an exception that is no step's (a bug): say so
        state.status, state.why = "failed", "the doctor ended unexpectedly (see the traceback)"
    job = ctx.tracker.current
    if job and not finished:
        stop_followed(host, job, "the doctor", ctx.say, ctx.warn)
    state.left_running = stop_servers(state.servers, lambda entry: steps.stop_server(ctx, entry),
                                      lambda e: str(e["role"]), keep_last=finished and state.args.keep_serving)
    try:
        state.save()
    except DoctorError as exc:
        ctx.warn(str(exc))
    logged = _record(ctx)
    try:
        paths = report.write(state, host.project_root / "runs", mlflow=logged.url if logged else None)
        ctx.say(f"report: {paths['markdown']} (and {paths['html'].name}, {paths['json'].name})")
        tracking.attach(logged, [p for p in paths.values() if p.exists()], ctx.warn)
    except DoctorError as exc:
        ctx.warn(str(exc))


def _record(ctx: steps.Ctx) -> tracking.Logged | None:
    """The doctor itself is a row of the history: its status and every run it made (in MLflow, when
    logged: its steps' runs nested under it)."""
    state = ctx.state
    rec = RunRecord(run_id=state.doctor_id, kind="doctor", host=state.host, draft=state.args.draft,
                    settings=state.args.to_dict(),
                    metrics={"runs": state.runs(), "stopped_at": state.stopped_at,
                             "steps": {s.name: s.state for s in state.steps}}, verdict=state.status)
    return records.keep(ctx.host.project_root, f"doctor {state.doctor_id}",
                        lambda rev: dataclasses.replace(rec, git_rev=rev), ctx.warn)
