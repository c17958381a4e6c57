"""Before a tool that needs the ML stack imports it: one paragraph instead of a traceback.

The host's ml-env python runs ``remote.drafter``, ``remote.drafter.launch`` and ``remote.capture``;
where it has no torch (a host whose ``python:`` is a bare system interpreter, an ml-env never set
up) their first ``import torch`` would die with a traceback deep in the tool (exit 1, read as a
failed check). :func:`require` is called by their ``__main__`` before those imports: it refuses with
exit REFUSED and an ``error`` event of kind ``StackMissing`` naming this interpreter and what it
lacks, which the local side completes with the host's name and the command that sets the ml-env up.
Stdlib only (it runs where torch is missing).
"""
from __future__ import annotations

import importlib.util
import sys

from . import exitcodes

#: what every ML tool imports at its start
STACK = ("torch", "safetensors")
KIND = "StackMissing"


def missing(names: tuple[str, ...] = STACK) -> list[str]:
    """The packages of ``names`` this interpreter cannot find (found, not imported: torch takes seconds)."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):       # a broken package (a stray __init__, no __spec__)
            found = False
        if not found:
            out.append(name)
    return out


class StackMissing(exitcodes.ToolError):
    """This interpreter lacks the ML stack: its ``error`` event names the python and what it lacks."""

    kind = KIND

    def __init__(self, message: str, *, python: str, lacking: list[str]) -> None:
        super().__init__(message)
        self.python = python
        self.lacking = lacking

    def event_fields(self) -> dict[str, object]:
        return {**super().event_fields(), "python": self.python, "missing": self.lacking}


def require(tool: str, names: tuple[str, ...] = STACK) -> None:
    """Exit REFUSED with one paragraph when this interpreter lacks any of ``names``."""
    lacking = missing(names)
    if not lacking:
        return
    message = (f"The python running {tool} ({sys.executable}, Python {sys.version.split()[0]}) cannot import "
               f"{' or '.join(lacking)}: this interpreter is not an ml-env that can run the evaluator.")
    # the one envelope: the paragraph on stderr and the ``error`` event, written by exitcodes
    ending = exitcodes.refused(StackMissing(message, python=sys.executable, lacking=lacking), f"{tool} refused")
    sys.exit(ending.code)
