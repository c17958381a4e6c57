"""The capture check's refusals: one paragraph each, naming the file, field or engine and the fix."""
from __future__ import annotations

from ..drafter.errors import DrafterError


class CaptureError(DrafterError):
    """Base of the capture check's errors (exit REFUSED)."""

    kind = "capture"


class DumpMismatchError(CaptureError):
    """The dumps cannot have been made by this target as served (tokens beyond its vocabulary or context)."""

    kind = "dump_mismatch"


class EngineError(CaptureError):
    """The engine instance did not start, died, hung, or left a hidden-state file incomplete."""

    kind = "engine"


class StorageError(CaptureError):
    """The folder the engine writes its hidden-state files to cannot hold them."""

    kind = "storage"
