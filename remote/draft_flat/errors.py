"""Why a flat copy is refused (nothing is written in any case): one paragraph naming the file or field
and the fix. ``FlatCopyError`` derives from ``remote.exitcodes.ToolError``: ``exitcodes.main`` reports it."""
from __future__ import annotations

from ..exitcodes import ToolError


class FlatCopyError(ToolError):
    """Base class (exit REFUSED)."""


class NotConvertible(FlatCopyError):
    """The draft cannot be served by SGLang as trained, whatever its format (a forward SGLang lacks)."""


class OutputError(FlatCopyError):
    """``--dest`` exists, or its folder cannot take the copy."""
