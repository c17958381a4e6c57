"""Why the draft-config rewriter refuses (nothing is written in any of these cases).

    DraftConfigError
    ├── ConfigFormatError   config.json missing, unreadable, or in no known EAGLE-3 format
    ├── InvalidLayerIds     ids out of range, repeated, or not matching the fc aux slots
    ├── ReportError         the drafter report has no fix to apply (MATCH, or no fix ids)
    └── WriteError          the checkpoint folder cannot take the backup or the new config

DraftConfigError derives from ``remote.exitcodes.ToolError``: ``exitcodes.main`` reports it.
"""
from __future__ import annotations

from ..exitcodes import ToolError


class DraftConfigError(ToolError):
    """Base class (exit REFUSED); the message is one paragraph naming the file/field and the fix."""


class ConfigFormatError(DraftConfigError):
    """config.json cannot be read as a flat or speculators EAGLE-3 config."""


class InvalidLayerIds(DraftConfigError):
    """The requested ids cannot work with this draft and target."""


class ReportError(DraftConfigError):
    """The drafter report cannot supply layer ids."""


class WriteError(DraftConfigError):
    """The backup or the new config could not be written."""
