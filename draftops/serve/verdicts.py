"""The latest `invoke test-drafter` verdict for a draft, from the reports pulled into ``runs/`` here."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote import jsonread
from remote.bench.numbers import finite


@dataclass(frozen=True)
class Verdict:
    """One report's verdict about the draft at ``path``."""

    run_id: str
    status: str
    message: str
    configured_ids: list[int] | None
    serving_convention: str | None
    fix: list[int] | None
    diagnosis: str = ""  # what the engine feeds against what the draft was trained on (no figures)
    accept_served: float | None = None  # predicted accept length as configured
    accept_best: float | None = None  # ... with the layout the draft was trained on

    @property
    def why(self) -> str:
        """The diagnosis; the whole message for a report older than the ``diagnosis`` field."""
        return self.diagnosis or self.message

    def stale(self, current_ids: list[int] | None) -> bool:
        """True when the config's ids changed since the report (e.g. after `draft-config`)."""
        return self.configured_ids != current_ids


def serving_engine(spec: Any) -> str | None:
    """The engine the host serves with (its serve profiles' engine; vLLM-CPU on `local`), for advice
    that differs by engine; None when its profiles name both engines (or none resolves)."""
    from draftops.serve import profiles

    names = list(spec.serve or {}) or [None]
    engines = {profiles.engine_of(spec, spec.serve[n]) if n else profiles.resolve(spec).engine for n in names}
    return engines.pop() if len(engines) == 1 else None


def _norm(path: str) -> str:
    return path.rstrip("/") or "/"


def latest(runs_dir: Path, draft: str) -> Verdict | None:
    """The newest report whose checkpoint is ``draft`` (run ids sort by start time)."""
    if not runs_dir.is_dir():
        return None
    for run in sorted(runs_dir.iterdir(), reverse=True):
        path = run / "report.json"
        if not path.is_file():
            continue
        try:
            doc = jsonread.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict):
            continue
        ckpt = (doc.get("checkpoint") or {}).get("path")
        verdict = doc.get("verdict") or {}
        if not isinstance(ckpt, str) or _norm(ckpt) != _norm(draft) or "status" not in verdict:
            continue
        accept = doc.get("predicted_accept_length")
        accept = accept if isinstance(accept, dict) else {}
        return Verdict(run.name, str(verdict["status"]), str(verdict.get("message") or ""),
                       (doc.get("checkpoint") or {}).get("configured_layer_ids"),
                       verdict.get("serving_convention"), verdict.get("fix_layer_ids"),
                       str(verdict.get("diagnosis") or ""), finite(accept.get("served")), finite(accept.get("best")))
    return None
