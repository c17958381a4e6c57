"""Take the layer-id fix from a drafter report (``remote/drafter`` JSON output).

The report's top-level ``verdict`` carries ``status`` ("MATCH" / "MISMATCH"), ``fix_layer_ids``
(SGLang output-of-layer convention, or null) and ``needs_capture_patch``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .errors import ReportError


@dataclass
class ReportFix:
    path: str
    status: str
    ids: list[int]
    needs_capture_patch: bool


def read_fix(path: Path) -> ReportFix:
    """The fix in the report at ``path``; a report without one is refused."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"Cannot read the drafter report {path} ({exc}).") from exc
    verdict = data.get("verdict") if isinstance(data, dict) else None
    if not isinstance(verdict, dict):
        raise ReportError(
            f"{path} has no top-level `verdict` object; pass the JSON report written by "
            "remote/drafter, or give the ids with --layer-ids."
        )
    status = str(verdict.get("status"))
    ids = verdict.get("fix_layer_ids")
    if status == "MATCH":
        raise ReportError(
            f"The drafter report {path} says MATCH: the draft's configured layer ids already "
            "reproduce its training, so there is nothing to rewrite."
        )
    if ids is None:
        raise ReportError(
            f"The drafter report {path} says {status} but verdict.fix_layer_ids is null: the "
            "drafter found no layer set that reproduces the training. Inspect the report; no "
            "config was changed."
        )
    if not isinstance(ids, list) or not ids or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in ids):
        raise ReportError(
            f"{path}: verdict.fix_layer_ids is {ids!r}, not a non-empty list of integers."
        )
    return ReportFix(path=str(path), status=status, ids=list(ids),
                     needs_capture_patch=bool(verdict.get("needs_capture_patch")))
