"""The one error the benchmark parsers raise: input that cannot be read at all (a problem in one
record or one line is reported beside the good records instead, so nothing measured is lost). A
``remote.exitcodes.ToolError``: a tool that lets it through exits REFUSED with its paragraph."""
from __future__ import annotations

from ..exitcodes import ToolError


class BenchParseError(ToolError):
    """A file or snapshot that cannot be used; the message names it and says what to do."""
