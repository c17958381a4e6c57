"""The capture-check that measured these dumps: its slot layers replace data_config.json's claims, and
the engine states it kept (vLLM) score the draft on every boundary too."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


def capture(host: Host, data: str | None, verifier: str | None, engine: str | None, *, run_id: str | None,
            find: bool) -> Capture | None:
    """The capture-check run the evaluator reads: ``run_id`` when the caller names one (the doctor's own
    capture step), else with ``find`` the newest of these dumps and target on the engine the host serves
    with whose run folder the host still holds (``data`` None: the demo's); None when there is none."""
    runs_dir = host.project_root / "runs"
    found = run_id or (_newest(runs_dir, demo_dir(host.state_dir), data, verifier, engine) if find else None)
    if found is None:
        return None
    kept = kept_engine_states(runs_dir, found)
    return Capture(found, kept) if run_id or _held(host, found) else None


def _newest(runs_dir: Path, demo: str, data: str | None, verifier: str | None, engine: str | None) -> str | None:
    data, target = (data, verifier) if data else (f"{demo}/data", verifier or f"{demo}/{DEMO_TARGET}")
    if engine is None or target is None:
        return None
    return capture_for_dumps(runs_dir, data, target, engine)


def _held(host: Host, run_id: str) -> bool:
    """Whether the host still holds that run's folder (the evaluator reads it there)."""
    try:
        jobs.status(host, run_id)
    except JobError:
        return False
    return True
