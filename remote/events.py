"""Progress and result events that remote jobs print on stdout for the local side to render.

A remote module stays a plain program (its log is readable as text); the lines that start with
``EVENT_PREFIX`` carry one JSON object each, which the local side turns into a progress bar.
"""
from __future__ import annotations

import json
import sys
import time
from typing import Any

EVENT_PREFIX = "@@draftops "


def emit(event: str, **fields: Any) -> None:
    """Print one machine-readable event line (flushed at once, so a live tail sees it)."""
    payload = {"event": event, "t": round(time.time(), 3), **fields}
    sys.stdout.write(EVENT_PREFIX + json.dumps(payload, default=str) + "\n")
    sys.stdout.flush()


def progress(done: int, total: int, what: str = "") -> None:
    """Report that ``done`` of ``total`` units of work are finished."""
    emit("progress", done=done, total=total, what=what)


def result(path: str, **fields: Any) -> None:
    """Announce the main output file of the job (relative to the run folder or absolute).

    The runner keeps the scalar fields of the last result event as the run's ``outcome``, and
    `invoke runs` shows its ``headline`` (else its ``status``): a task records its own headline
    with ``result(path, headline="412 tok/s", tokens_per_s=412)``."""
    emit("result", path=path, **fields)


def error(message: str, **fields: Any) -> None:
    """Announce why the tool stopped (one paragraph naming the file or field and the fix); the local
    side shows it, and the runner keeps it as the run's ``outcome.error`` for `invoke runs`."""
    emit("error", message=message, **fields)


def parse(line: str) -> dict[str, Any] | None:
    """Return the event in ``line``, or None when it is an ordinary log line."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        value = json.loads(line[len(EVENT_PREFIX):])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
