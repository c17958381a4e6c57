"""Each doctor step, composed of the library calls the single tasks make (test-drafter's tool run and
record, draft-config's and patch-sglang's tools, serve's checks and lifecycle, bench's session, the
comparison), never a subprocess `invoke`. A step fills its ``Step``: the history runs it made, what
it found (``outcome``: what the report tells) and the commands that reproduce it."""
from __future__ import annotations

from collections.abc import Callable

from draftops.doctor import plan
from draftops.doctor.checking import capture, check, fix, recheck
from draftops.doctor.comparing import compare
from draftops.doctor.context import Ctx, Skip, Tracker, ran
from draftops.doctor.serving import reusable_baseline, served, stop_server
from draftops.doctor.state import Step
from draftops.doctor.tuning import tune

__all__ = ["Ctx", "Skip", "Tracker", "ran", "reusable_baseline", "run_step", "stop_server"]

STEP_FUNCS: dict[str, Callable[[Ctx, Step], None]] = {
    plan.CAPTURE: capture, plan.CHECK: check, plan.FIX: fix, plan.RECHECK: recheck, plan.COMPARE: compare,
    plan.TUNE: tune,
}


def run_step(ctx: Ctx, step: Step) -> None:
    """Run one step by its name."""
    if step.name in plan.SERVED_STEPS:
        served_steps = [s.name for s in ctx.state.steps if s.name in plan.SERVED_STEPS]
        if step.name == plan.FIXED and not ctx.state.step(plan.FIX).outcome.get("run_id"):
            raise Skip("nothing was fixed: the draft as served is the draft")
        served(ctx, step, step.name, is_last=step.name == served_steps[-1])
        return
    STEP_FUNCS[step.name](ctx, step)
