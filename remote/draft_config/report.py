"""Take the layer-id fix from a drafter report (``remote/drafter`` JSON output).

The report's top-level ``verdict`` carries ``status`` ("MATCH" / "MISMATCH"), ``fix_layer_ids``
(SGLang output-of-layer convention, or null) and ``needs_capture_patch``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import jsonread
from .errors import ReportError


@dataclass
class ReportFix:
    path: str
    status: str
    ids: list[int]
    needs_capture_patch: bool
    ckpt: str | None = None  # the checkpoint the report evaluated (``checkpoint.path``)


def read_fix(path: Path) -> ReportFix:
    """The fix in the report at ``path``; a report without one is refused."""
    try:
        data = jsonread.load(path)
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
    evaluated = data.get("checkpoint")
    ckpt = evaluated.get("path") if isinstance(evaluated, dict) else None
    return ReportFix(path=str(path), status=status, ids=list(ids),
                     needs_capture_patch=bool(verdict.get("needs_capture_patch")),
                     ckpt=ckpt if isinstance(ckpt, str) else None)


def other_checkpoint_warning(fix: ReportFix, config: Path) -> str | None:
    """A warning when the report evaluated another folder than the one at ``config``: its fix holds
    for that draft, and for this one only if it is a copy (the seed loop fixes copies, and the
    flat-format twin, of the draft it evaluated). Links are resolved, so the folder, its
    config.json or a weight file name the same checkpoint."""
    if fix.ckpt is None:
        return None
    evaluated = Path(fix.ckpt)
    folder = evaluated if evaluated.is_dir() else evaluated.parent
    if folder.resolve() == config.parent.resolve():
        return None
    return (f"the report {fix.path} evaluated the draft at {fix.ckpt}, not this one ({config.parent}): "
            "its ids hold here only if this is a copy of that draft (same weights); otherwise restore the "
            "backup and run test-drafter on this draft")
