"""The doctor's last step with --tune: `invoke tune` of the fixed draft (draftops/tune/), as a tune of its
own (its runs/<tune-id>/tune.{md,html,json} and history row), so the doctor's story ends with the fastest
settings found and confirmed. A signal that stops the tune stops the doctor at this step; a failed tune
fails it; either way the tune has stopped its own servers first."""
from __future__ import annotations

import os
import signal

from draftops.doctor.context import Ctx, host_cmd
from draftops.doctor.state import Step
from draftops.errors import DoctorError


def tune(ctx: Ctx, step: Step) -> None:
    from draftops.documents.tune import Args
    from draftops.serve.request import VLLM_DEFAULT_STEPS
    from draftops.tune import flow, plan
    from draftops.tune import state as tune_state
    a = ctx.args
    args = Args(draft=a.draft, data=a.data, profile=a.profile, port=a.port)
    doc, folder = tune_state.new(ctx.runs_dir, ctx.host.name, args, plan.steps(args, VLLM_DEFAULT_STEPS))
    doc.configured_k = VLLM_DEFAULT_STEPS
    step.runs.append(doc.tune_id)
    step.commands = [host_cmd(ctx, f"tune --draft {a.draft}")]
    ctx.state.save()
    with tune_state.held(folder):
        run = flow.start(ctx.host, doc, folder, lambda text: ctx.say("  " + text))
        flow.run(run)
    ended = run.doc
    step.outcome = {"tune_id": ended.tune_id, "status": ended.status,
                    "best": [b.model_dump(mode="json") for b in ended.best],
                    "engine_line": (ended.engine_args or {}).get("line"), "off_from": ended.off_from,
                    "median_error": ended.median_error, "left_running": ended.left_running}
    if ended.status == "stopped":          # the doctor stops here too, by the same signal
        os.kill(os.getpid(), int(ended.why_signal or signal.SIGINT))
    if ended.status != "done":
        raise DoctorError(f"tune {ended.tune_id} {ended.status} at step {ended.stopped_at}: {ended.why} "
                          f"(`{tune_state.resume_command(ended.tune_id, ended.host)}` continues it).")
