"""The capture-check that measured these dumps: its slot layers replace data_config.json's claims, and
the engine states it kept (vLLM) score the draft on every boundary too."""
from __future__ import annotations

from dataclasses import dataclass

from draftops.errors import JobError
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.serve.request import DEMO_TARGET, demo_dir
from draftops.serve.verdicts import capture_for_dumps, kept_engine_states


@dataclass(frozen=True)
class Capture:
    """A capture-check run the evaluator reads (its folder on the host) and whether it kept engine states."""

    run_id: str
    kept_states: bool


def newest(host: Host, data: str | None, verifier: str | None, engine: str | None) -> str | None:
    """The newest capture-check of these dumps and target on the engine the host serves with whose run
    folder the host still holds (``data`` None: the demo's), else None."""
    root = demo_dir(host.state_dir)
    data, target = (data, verifier) if data else (f"{root}/data", verifier or f"{root}/{DEMO_TARGET}")
    if engine is None or target is None:
        return None
    run = capture_for_dumps(host.project_root / "runs", data, target, engine)
    if run is None:
        return None
    try:
        jobs.status(host, run)
    except JobError:
        return None
    return run


def of_run(host: Host, run_id: str | None) -> Capture | None:
    """That capture-check run as the evaluator reads it (None: none)."""
    if not run_id:
        return None
    return Capture(run_id, kept_engine_states(host.project_root / "runs", run_id))
