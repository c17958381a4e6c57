"""The one exit-code table of the remote tools, and the guard that keeps a crash inside it.

Every tool the local side starts on the host (``remote.drafter``, ``remote.sglang_patch``,
``remote.draft_config``, ``remote.envcheck``, ``remote.serve``, ``remote.bench.runner``) ends with
one of these codes, and ``draftops/runs/tools.py`` reads a finished run by them. Stdlib only: it runs
with the host's ml-env python.

    code  name          meaning
    0     OK            the tool did its work (a MISMATCH verdict is a finding, not a failure)
    1     CHECK_FAILED  it ran to the end and a check it makes failed (a verify, a bench run)
    2     USAGE         bad command line (argparse's own code)
    3     REFUSED       refused with a one-paragraph message that names the file or field and
                        the fix (an ``error`` event on stdout, the paragraph on stderr);
                        nothing was changed
    4     INTERNAL      a bug in the tool (a traceback on stderr, an ``error`` event)
    75    BUSY          another run holds the lock the tool needs (an engine install on the same
                        venv); nothing was changed; try again when it ends (EX_TEMPFAIL)
    127   NO_PYTHON     the shell found no interpreter (the job's command line says which)

Python itself exits 1 on an uncaught exception, which would read as CHECK_FAILED: a tool's
``__main__`` runs its ``main`` through :func:`run`, which turns a crash into INTERNAL.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import NoReturn

from . import events

OK = 0
CHECK_FAILED = 1
USAGE = 2
REFUSED = 3
INTERNAL = 4
BUSY = 75
NO_PYTHON = 127

MEANING = {OK: "ok", CHECK_FAILED: "check failed", USAGE: "usage error", REFUSED: "refused",
           INTERNAL: "internal error", BUSY: "busy: another run holds its lock", NO_PYTHON: "no python"}


def meaning(code: int | None) -> str:
    """What ``code`` means in the table (``exit N`` for codes outside it, such as a signal's)."""
    if code is None:
        return "no exit code"
    return MEANING.get(code, f"exit {code}")


def internal_error(tool: str, exc: BaseException) -> str:
    """Report a crash the tool's own main caught: traceback on stderr, an ``error`` event; returns
    the message (for the tool's result file)."""
    import traceback  # only for a crash: every quick host tool imports this module
    traceback.print_exc()
    message = f"internal error in {tool}: {exc!r}"
    events.error(message, kind="InternalError", exit_code=INTERNAL)
    return message


def run(tool: str, main: Callable[[], int]) -> NoReturn:
    """``sys.exit(main())``, with an uncaught exception turned into INTERNAL and an ``error`` event
    (argparse's exit and Ctrl-C pass through as they are)."""
    try:
        code = main()
    except Exception as exc:  # noqa: BLE001 - the table's INTERNAL, not Python's 1
        internal_error(tool, exc)
        code = INTERNAL
    sys.exit(code)
