"""JSON from a file someone else wrote, where nesting too deep for the parser is bad input.

``json.loads`` raises ``RecursionError`` (a RuntimeError) on a document nested about a thousand
levels deep, so a config of ``[[[[...]]]]`` escaped every ``except ValueError`` and was reported as
an internal error. :func:`loads` turns it into a ``ValueError`` the callers already report as "not
valid JSON", naming their file.
"""
from __future__ import annotations

import json
from typing import Any


class TooDeep(ValueError):
    """The document nests deeper than the parser can follow."""


def loads(raw: str | bytes) -> Any:
    """``json.loads(raw)``; a document nested too deep is :class:`TooDeep`, never a RecursionError."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise TooDeep("its arrays or objects are nested too deep to read (thousands of levels; a "
                      "config nests a few)") from None
