"""Per-file state of an SGLang install: code shape combined with the state folder's records.

Row states (the ``state`` field of patch.json):

``native``       embedding capture (-1) works without the patch
``patched``      draftops' patch is in place and the file has the sha256 draftops wrote
``needs-patch``  a known shape that the patch fixes
``unsupported``  this SGLang cannot capture configured ids for the model (file or setter absent,
                 setter without ids), or the code matches no known shape (``known_shape`` false)
``modified``     carries draftops code but not the bytes draftops wrote: someone edited it
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..fileio import sha256_bytes
from . import shapes
from .edits import Source
from .locate import SglangInstall
from .shapes import Analysis
from .state import Record, StateStore
from .targets import MODEL, RUNNER, TARGETS, Target
from .template import PATCH_VERSION


@dataclass
class FileRow:
    """One target file as found on disk."""

    target: Target
    path: Path
    analysis: Analysis
    data: bytes | None
    record: Record | None
    state: str
    detail: str

    @property
    def known_shape(self) -> bool:
        return self.analysis.state != shapes.UNKNOWN

    @property
    def sha256(self) -> str | None:
        return None if self.data is None else sha256_bytes(self.data)

    def to_json(self) -> dict[str, Any]:
        """The row as written to patch.json."""
        return {
            "file": self.target.rel,
            "model": self.target.model,
            "serves": self.target.serves,
            "state": self.state,
            "sha256": self.sha256,
            "detail": self.detail,
            "known_shape": self.known_shape,
            "parts": {p.name: p.state for p in self.analysis.parts},
            "backup": self.record.backup if self.record else None,
        }


def survey(install: SglangInstall, store: StateStore) -> list[FileRow]:
    """Analyse every target file of ``install``."""
    runner_sources: dict[str, Source | str] = {}
    for target in TARGETS:
        path = install.path(target.rel)
        if target.kind == RUNNER and path.exists():
            runner_sources[target.rel] = _parse(path, install.version)
    passes_ids = any(shapes.passes_configured_ids(src) for src in runner_sources.values()
                     if isinstance(src, Source))
    return [_row(install, store, target, runner_sources, passes_ids) for target in TARGETS]


def _parse(path: Path, version: str) -> Source | str:
    """The parsed file, or why it cannot be read or parsed (a broken install, a hand edit)."""
    try:
        return Source(path.read_bytes(), str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        where = f" line {exc.lineno}" if isinstance(exc, SyntaxError) and exc.lineno else ""
        return (f"cannot be read or parsed ({type(exc).__name__}{where}: {exc}); reinstall sglang "
                f"(pip install --force-reinstall --no-deps sglang=={version}) or fix the file")


def _row(install: SglangInstall, store: StateStore, target: Target,
         runner_sources: dict[str, Source | str], passes_ids: bool) -> FileRow:
    path = install.path(target.rel)
    record = store.record(target.rel)
    if not path.exists():
        if target.kind == MODEL:
            analysis = shapes.missing(f"not in SGLang {install.version}")
        else:
            absent = shapes.Part("cuda_graph", shapes.NATIVE,
                                 f"not in SGLang {install.version} (nothing to patch)")
            analysis = Analysis(parts=[absent], marker_versions=[])
        return FileRow(target, path, analysis, None, record, _public(analysis.state),
                       analysis.detail)
    src = runner_sources.get(target.rel) or _parse(path, install.version)
    if isinstance(src, str):
        broken = Analysis(parts=[shapes.Part("file", shapes.UNKNOWN, src)], marker_versions=[])
        return FileRow(target, path, broken, None, record, shapes.UNSUPPORTED, src)
    data = src.data
    analysis = (shapes.analyze_model(src) if target.kind == MODEL
                else shapes.analyze_runner(src, passes_ids))
    state, detail = _public(analysis.state), analysis.detail
    if analysis.state == shapes.UNKNOWN:
        detail = f"unrecognised code shape: {detail}"
    sha = sha256_bytes(data)
    if analysis.marker_versions:
        if record is None:
            detail += (f"; no saved original under {store.dir} (revert impossible with this "
                       "state folder)")
        elif record.patched_sha256 != sha:
            state = shapes.MODIFIED
            detail = (f"carries draftops code but its sha256 {sha[:12]} is not the "
                      f"{(record.patched_sha256 or '?')[:12]} draftops wrote: edited since")
        others = [v for v in analysis.marker_versions if v != PATCH_VERSION]
        if others:
            detail += f"; carries sglang-patch v{others} markers"
    return FileRow(target, path, analysis, data, record, state, detail)


def _public(state: str) -> str:
    return shapes.UNSUPPORTED if state == shapes.UNKNOWN else state
