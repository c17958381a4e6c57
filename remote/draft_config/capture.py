"""Warn when the host's SGLang would not capture the new ids: reuses the patcher's survey."""
from __future__ import annotations

from typing import Any

from ..sglang_patch import shapes
from ..sglang_patch.errors import PatchError
from ..sglang_patch.locate import locate
from ..sglang_patch.state import StateStore, default_state_dir
from ..sglang_patch.survey import survey
from ..sglang_patch.targets import ARCHITECTURES, MODEL, RUNNER
from .target import TargetInfo

_READY = (shapes.NATIVE, shapes.PATCHED)


def sglang_warnings(ids: list[int], target: TargetInfo | None) -> tuple[dict[str, Any] | None,
                                                                         list[str]]:
    """(summary of the host's SGLang, warnings) for serving ``ids`` (SGLang convention)."""
    try:
        install = locate()
        rows = survey(install, StateStore(default_state_dir(), install.version))
    except PatchError as exc:
        return None, [f"could not read the host's SGLang capture status: {exc}"]
    summary = {"version": install.version, "dir": str(install.root),
               "files": {r.target.rel: r.state for r in rows}}
    models = sorted({ARCHITECTURES[a] for a in (target.architectures if target else [])
                     if a in ARCHITECTURES})
    relevant = [r for r in rows
                if r.target.kind == MODEL and (not models or r.target.model in models)]
    fix = "run `python -m remote.sglang_patch apply` (invoke patch-sglang apply) before serving"
    warnings = []
    if any(v < 0 for v in ids):
        for row in relevant:
            if row.state not in _READY:
                warnings.append(f"ids include -1 (the embedding) but SGLang {install.version}'s "
                                f"{row.target.rel} is {row.state} ({row.detail}): {fix}")
    defaults = _default_loop_indices(target)
    if defaults is None or sorted(v + 1 for v in ids) != defaults:
        for row in rows:
            if row.target.kind == RUNNER and row.state == shapes.NEEDS_PATCH:
                warnings.append(f"SGLang {install.version} replaces configured ids by the defaults "
                                f"in CUDA-graph mode ({row.target.rel} is needs-patch): {fix}, "
                                "or serve with --disable-cuda-graph")
    return summary, warnings


def _default_loop_indices(target: TargetInfo | None) -> list[int] | None:
    if target is None:
        return None
    n = target.num_hidden_layers
    return [2, n // 2, n - 3]

