"""The one error the benchmark parsers raise: input that cannot be read at all (a problem in one
record or one line is reported beside the good records instead, so nothing measured is lost)."""
from __future__ import annotations


class BenchParseError(Exception):
    """A file or snapshot that cannot be used; the message names it and says what to do."""
