"""The one exit-code table of the remote tools, and the guard that keeps a crash inside it.

Every tool the local side starts on the host (``remote.drafter``, ``remote.sglang_patch``,
``remote.draft_config``, ``remote.draft_flat``, ``remote.envcheck``, ``remote.serve``, ``remote.bench.runner``, and the
quick ones: ``remote.bench.probe``, ``remote.bench.demo_prompts``, ``remote.drafter.demo_spec``)
ends with one of these codes, and ``draftops/runs/tools.py`` reads a finished run by them. Stdlib only: it runs
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

Python itself exits 1 on an uncaught exception, which would read as CHECK_FAILED. So the envelope
of every tool is written here, once: a tool parses its own arguments and hands the work to
:func:`main`, which turns a :class:`ToolError` into its exit code (REFUSED unless the error says
otherwise), its paragraph on stderr and one ``error`` event, and a crash into INTERNAL with the
traceback on stderr (the job's log); a tool's ``__main__`` runs through :func:`run`, which also
catches a crash outside the work (argument checks, writing the result) and lets Ctrl-C and SIGTERM
unwind the tool (its ``finally`` blocks and temporary-file clean-ups run) before it dies by that
signal, as it did before.
"""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, NoReturn

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


class ToolError(Exception):
    """Base of every error a remote tool reports instead of a traceback (each tool's
    ``errors.py`` derives its own tree from it): the message is one paragraph naming the file or
    field and the fix, and nothing was changed."""

    #: the tool's exit code for this error
    exit_code = REFUSED
    #: the ``error`` event's kind; None: the class's name
    kind: str | None = None
    #: stderr says ``<heading>: <message>``; False: the message alone (a check's own finding)
    headed = True

    def __init__(self, message: str = "", *, kind: str | None = None, exit_code: int | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        if exit_code is not None:
            self.exit_code = exit_code

    def event_fields(self) -> dict[str, Any]:
        """The ``error`` event's fields besides its message and exit code."""
        return {"kind": self.kind or type(self).__name__}


class Ending(NamedTuple):
    """How one tool's work ended: its exit code and, when it failed, why (for its result file)."""

    code: int
    error: str | None = None
    error_type: str | None = None     # the ToolError's class name, or "InternalError"


def main(tool: str, body: Callable[[], int], *, heading: str = "error",
         finish: Callable[[Ending], None] | None = None) -> int:
    """The envelope of ``tool``'s work: ``body()``'s exit code, a ToolError as its code with its
    paragraph (after ``heading: `` on stderr) and one ``error`` event, a crash as INTERNAL;
    ``finish`` then sees how it ended (to write the tool's result file either way)."""
    ending = _ended(tool, body, heading)
    if finish is not None:
        finish(ending)
    return ending.code



def main_with_result(tool: str, steps: Sequence[Callable[[], object]], payload: dict[str, Any], out: Any,
                     file: str, fields: Callable[[dict[str, Any]], dict[str, Any]] = lambda payload: {},
                     **start: Any) -> int:
    """:func:`main` for a tool whose result is one JSON ``payload`` (draft-config, draft-flat): a
    ``start`` event with ``start``'s fields, then ``steps``, in order, fill it (OK when all ran);
    whatever happened (a refusal, a bug) the payload is written with its ``ok``, ``error`` and
    ``error_type`` as ``out/file`` (``out`` a Path, or None: not written), announced in a ``result``
    event with ``fields(payload)``, and a ``done`` event ends the output."""
    events.emit("start", tool=tool, **start)

    def body() -> int:
        for step in steps:
            step()
        payload["ok"] = True
        return OK

    def finish(ending: Ending) -> None:
        if ending.error is not None:
            payload.update(error=ending.error, error_type=ending.error_type)
        if out is not None:
            from .fileio import write_json
            path = write_json(out / file, payload)
            events.result(str(path), ok=payload["ok"], **fields(payload))
        events.emit("done", ok=payload["ok"], exit_code=ending.code)

    return main(tool, body, heading=f"{tool} refused", finish=finish)

def _ended(tool: str, body: Callable[[], int], heading: str) -> Ending:
    try:
        return Ending(body())
    except ToolError as exc:
        return refused(exc, heading)
    except Exception as exc:  # noqa: BLE001 - the table's INTERNAL, not Python's 1
        return Ending(INTERNAL, internal_error(tool, exc), "InternalError")


def refused(exc: ToolError, heading: str = "error") -> Ending:
    """Report ``exc``: its paragraph on stderr and as an ``error`` event; how the tool ended."""
    message = str(exc)
    print(f"{heading}: {message}" if exc.headed else message, file=sys.stderr)
    events.error(message, **exc.event_fields(), exit_code=exc.exit_code)
    return Ending(exc.exit_code, message, type(exc).__name__)


class Stopped(BaseException):
    """SIGTERM, raised where the tool is so that it unwinds as Ctrl-C does (not an Exception: no
    ``except Exception`` of a tool swallows it)."""


def run(tool: str, entry: Callable[[], int]) -> NoReturn:
    """A tool's ``__main__``: ``sys.exit(main(tool, entry))``. Ctrl-C and SIGTERM unwind the tool,
    then it dies by that signal (the exit status a killed job always had), saying so in one line."""
    signal.signal(signal.SIGTERM, _stop)
    try:
        code = main(tool, entry)
    except KeyboardInterrupt:
        _die(tool, signal.SIGINT)
    except Stopped:
        _die(tool, signal.SIGTERM)
    sys.exit(code)


def _stop(signum: int, frame: Any) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)    # a second TERM must not cut the clean-ups short
    raise Stopped()


def _die(tool: str, signum: signal.Signals) -> NoReturn:
    """End by ``signum`` itself, as an unhandled one would, once the output is out."""
    print(f"{tool}: stopped by {signum.name}", file=sys.stderr)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    sys.exit(128 + signum)      # not reached: the signal ends the process
