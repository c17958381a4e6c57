"""The capture-check that measured these dumps: its slot layers replace data_config.json's claims, and
the engine states it kept (vLLM) score the draft on every boundary too."""
from __future__ import annotations

from dataclasses import dataclass

from draftops.errors import JobError
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.serve.request import DEMO_TARGET, demo_dir
from draftops.serve.verdicts import capture_check


@dataclass(frozen=True)
class Capture:
    """A capture-check run the evaluator reads (its folder on the host) and whether it kept engine states."""

    run_id: str
    kept_states: bool


def capture(host: Host, data: str | None, verifier: str | None, engine: str | None, *, run_id: str | None,
            find: bool) -> Capture | None:
    """The capture-check run the evaluator reads: ``run_id`` when the caller names one (the doctor's own
    capture step), else with ``find`` the newest of these dumps and target on the engine the host serves
    with whose run folder the host still holds (``data`` None: the demo's); None when there is none."""
    runs_dir = host.project_root / "runs"
    dumps = _dumps(demo_dir(host.state_dir), data, verifier, engine) if find and not run_id else None
    found = capture_check(runs_dir, run_id or None, dumps) if run_id or dumps else None
    if found is None:
        return None
    if not run_id:
        try:
            jobs.status(host, found[0])     # the host still holds its folder: the evaluator reads it there
        except JobError:
            return None
    return Capture(*found)


def _dumps(demo: str, data: str | None, verifier: str | None, engine: str | None) -> tuple[str, str, str] | None:
    """(data, target, engine) of the capture-check to look for (``data`` None: the demo's)."""
    data, target = (data, verifier) if data else (f"{demo}/data", verifier or f"{demo}/{DEMO_TARGET}")
    if engine is None or target is None or data is None:
        return None
    return data, target, engine
