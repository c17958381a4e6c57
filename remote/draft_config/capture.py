"""Warn when the host's SGLang would not capture the new ids: reuses the patcher's survey."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..eagle import convention
from ..sglang_patch import shapes
from ..sglang_patch.errors import PatchError
from ..sglang_patch.locate import locate
from ..sglang_patch.state import StateStore, default_state_dir
from ..sglang_patch.survey import survey
from ..sglang_patch.targets import ARCHITECTURES, MODEL, RUNNER
from .target import TargetInfo

_READY = (shapes.NATIVE, shapes.PATCHED)
FIX = "run `python -m remote.sglang_patch apply` (`invoke patch-sglang.apply`) before serving"


@dataclass
class CaptureStatus:
    """Whether the host's SGLang captures what a draft's ids ask for (SGLang convention ids)."""

    summary: dict[str, Any] | None       # version, dir, {file: state}; None when SGLang was not found
    embedding: list[str] = field(default_factory=list)   # model files that would not capture id -1
    graph: list[str] = field(default_factory=list)       # runners that replace the ids in graph mode
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary, "embedding": self.embedding, "graph": self.graph,
                "error": self.error}


def capture_status(ids: list[int] | None, target: TargetInfo | None) -> CaptureStatus:
    """Ask the patcher's survey about the SGLang this python imports. ``ids=None``: the draft has no
    ids, so SGLang captures its defaults and only the survey summary matters."""
    try:
        install = locate()
        rows = survey(install, StateStore(default_state_dir(), install.version))
    except PatchError as exc:
        return CaptureStatus(None, error=f"could not read the host's SGLang capture status: {exc}")
    status = CaptureStatus({"version": install.version, "dir": str(install.root),
                            "files": {r.target.rel: r.state for r in rows}})
    if ids is None:
        return status
    models = sorted({ARCHITECTURES[a] for a in (target.architectures if target else [])
                     if a in ARCHITECTURES})
    relevant = [r for r in rows
                if r.target.kind == MODEL and (not models or r.target.model in models)]
    if any(v < 0 for v in ids):
        for row in relevant:
            if row.state not in _READY:
                status.embedding.append(
                    f"ids include -1 (the embedding) but SGLang {install.version}'s "
                    f"{row.target.rel} is {row.state} ({row.detail}): {FIX}")
    defaults = convention.default_boundaries(target.num_hidden_layers) if target else None
    if defaults is None or convention.to_boundaries(convention.SGLANG, ids) != defaults:
        for row in rows:
            if row.target.kind == RUNNER and row.state == shapes.NEEDS_PATCH:
                status.graph.append(
                    f"SGLang {install.version} replaces configured ids by the defaults "
                    f"in CUDA-graph mode ({row.target.rel} is needs-patch): {FIX}, "
                    "or serve with --disable-cuda-graph")
    return status


def sglang_warnings(ids: list[int], target: TargetInfo | None) -> tuple[dict[str, Any] | None,
                                                                         list[str]]:
    """(summary of the host's SGLang, warnings) for serving ``ids`` (SGLang convention)."""
    status = capture_status(ids, target)
    if status.error:
        return None, [status.error]
    return status.summary, status.embedding + status.graph

