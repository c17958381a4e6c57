"""What every doctor step is given (``Ctx``: the host, the state, how to tell the user), the view that
tracks the job a step follows, and the small helpers the steps share."""
from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftops import cmdline
from draftops.capture import flow as capture_flow
from draftops.doctor import plan
from draftops.doctor.state import State
from draftops.link.host import Host
from draftops.runs.steps import Tracker as Tracker
from draftops.runs.steps import ran as ran
from draftops.serve import profiles
from draftops.serve.request import DEMO, DEMO_DRAFT, demo_dir

TOLERANCE = 0.10            # draftops.bench.compare.TOLERANCE: measured vs predicted accept length
STEPS_K = 3                 # the TTT steps test-drafter scores = vLLM's num_speculative_tokens default


class Skip(Exception):
    """A step with nothing to do (no fix to apply): recorded as skipped, with the reason."""


@dataclasses.dataclass
class Ctx:
    """What every step needs: the host, the doctor's state, where runs land, how to tell the user."""

    host: Host
    state: State
    say: Callable[[str], None]
    progress: Callable[[str], None]
    tracker: Tracker

    @property
    def args(self) -> plan.Args:
        return self.state.args

    @property
    def runs_dir(self) -> Path:
        return self.host.project_root / "runs"

    @property
    def demo(self) -> bool:
        return self.args.draft == DEMO

    def draft_path(self) -> str:
        """The draft on the host (the demo's draft for `demo`)."""
        return f"{demo_dir(self.host.state_dir)}/{DEMO_DRAFT}" if self.demo else self.args.draft

    def warn(self, text: str) -> None:
        self.say(f"warning: {text}")

    def done_outcome(self, name: str) -> dict[str, Any]:
        return self.state.step(name).outcome if self.state.has(name) else {}


def profile_of(ctx: Ctx) -> profiles.Profile:
    """The serve profile the doctor was asked for, its python as the host reads it."""
    return capture_flow.on_host(ctx.host, profiles.resolve(ctx.host.spec, ctx.args.profile))


def host_cmd(ctx: Ctx, text: str) -> str:
    """A reproducing command line (``text``: the task and its options, quoted), with the host when it
    is not the default (``cmdline.command``)."""
    return cmdline.command(*shlex.split(text), host=ctx.host.name)
