"""One capture check: a short-lived engine instance of a serve profile says which layer each dumped
slot holds. The task and the doctor's capture step run it here; each shows or records it its way."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from draftops.errors import ServeRefused
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.hostfiles import host_path
from draftops.runs.tools import JobView, ToolResult, run_tool
from draftops.serve import profiles
from draftops.serve.request import DEMO, DEMO_DRAFT, DEMO_TARGET, demo_dir

if TYPE_CHECKING:
    from draftops.documents.capture_check import CaptureCheck

DEMO_DATA = "data"
NAME = TASK = "capture-check"
SAMPLES = 24


@dataclass(frozen=True)
class Check:
    """What one check runs: the profile (its python as the host reads it), paths on the host."""

    profile: profiles.Profile
    data: str
    target: str
    draft: str | None = None
    samples: int = SAMPLES
    port: int | None = None

    def argv(self) -> list[str]:
        """``python -m remote.capture`` 's arguments."""
        settings = self.profile.settings
        args = ["check", "--out", jobs.RUN_DIR, "--engine", self.profile.engine, "--python", self.profile.python,
                "--target", self.target, "--data", self.data, "--samples", str(self.samples),
                "--tp", str(settings.tp or 1), "--extra-args", json.dumps(list(settings.extra_args))]
        if settings.context_length:
            args += ["--max-model-len", str(settings.context_length)]
        for flag, value in (("--draft", self.draft), ("--port", self.port)):
            if value is not None:
                args += [flag, str(value)]
        return args

    def given(self) -> dict[str, Any]:
        """The run's arguments as the job and the history keep them."""
        return {"data": self.data, "draft": self.draft, "target": self.target, "profile": self.profile.name,
                "samples": self.samples, "port": self.port}


def on_host(host: Host, profile: profiles.Profile) -> profiles.Profile:
    """The serve profile, its python as the host reads it (a profile's ``python: ~/...``)."""
    import dataclasses
    return dataclasses.replace(profile, python=host_path(host, profile.python))


def task_paths(host: Host, data: str | None, draft: str | None, target: str | None,
               chosen: profiles.Profile) -> tuple[str, str | None, str, bool]:
    """(data, draft, target, demo) on the host: `--draft demo` (or nothing at all) is the generated demo."""
    if draft == DEMO or (draft is None and data is None and target is None):
        if target not in (None, DEMO):
            raise ServeRefused(f"The demo's dumps belong to the demo target only; drop --target {target}.")
        root = demo_dir(host.state_dir)
        given = host_path(host, data)
        return given or f"{root}/{DEMO_DATA}", f"{root}/{DEMO_DRAFT}", f"{root}/{DEMO_TARGET}", True
    if data is None:
        raise ServeRefused("Say which dumps to check: --data DUMPS (the hidden-state folder on the host), or "
                           "--draft demo for the generated demo.")
    chosen_target = target or chosen.settings.target
    if not chosen_target:
        raise ServeRefused(f"No target model: serve profile {chosen.name!r} of host {chosen.host!r} has no "
                           "`target:`; pass --target PATH (the model the dumps were made with).")
    return host_path(host, data), host_path(host, draft), host_path(host, chosen_target), False


def run(host: Host, check: Check, view: JobView) -> ToolResult:
    """The check's job, followed into ``view``, pulled, its result read once (not checked: the caller
    shows or records a failed run first)."""
    return run_tool(host, "remote.capture", check.argv(), name=NAME, task=TASK, given=check.given(),
                    env=dict(check.profile.settings.env), view=view)


def read(done: ToolResult) -> CaptureCheck | None:
    """The check's capture-check.json as its model (None when the run left none)."""
    from draftops.documents.capture_check import CaptureCheck  # pydantic: imported when a run has ended
    return done.document(CaptureCheck)
