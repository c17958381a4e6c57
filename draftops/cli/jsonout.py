"""`--json` on the tasks a script reads (test-drafter, capture-check, bench, bench.compare, doctor, runs):
one JSON document on stdout, everything a person reads on stderr, so `invoke test-drafter --json | jq`
works and a CI log still shows the story. One mechanism for every task: the task is wrapped with
:func:`json_output` and calls :func:`answer` with its document once it has one; the wrapper prints
the envelope whatever happened (a refusal or a failed run is an envelope too, with its exit code).

The envelope (``draftops.task-output/1``): ``task``, ``run_id`` (None where the task ran none),
``exit_code`` (the task's own), ``error`` (the one paragraph a failure printed, else None) and
``result``: the task's document as it wrote it (report.json, capture-check.json, bench-result.json,
compare.json, doctor.json; `runs`: the rows listed)."""
from __future__ import annotations

import functools
import json
import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from invoke.exceptions import Exit

from draftops.terminal import clean

F = TypeVar("F", bound=Callable[..., Any])
SCHEMA = "draftops.task-output/1"
JSON_HELP = "print one JSON document on stdout (the text a person reads goes to stderr); see docs/architecture.md"


@dataclass
class Answer:
    task: str
    run_id: str | None = None
    result: Any = None
    exit_code: int = 0
    error: str | None = None

    def document(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "task": self.task, "run_id": self.run_id, "exit_code": self.exit_code,
                "error": self.error, "result": finite(self.result)}


_asked: list[Answer] = []       # the --json task running now (tasks of one call run one after another)


def answer(result: Any, run_id: str | None = None) -> None:
    """The running task's document (a no-op without --json): call it as soon as the document exists,
    before a check that may still end the task with a non-zero exit."""
    if _asked:
        _asked[-1].result = result
        _asked[-1].run_id = run_id if run_id is not None else _asked[-1].run_id


def finite(value: Any) -> Any:
    """``value`` as strict JSON can hold it: NaN and infinity become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


@contextmanager
def human_to_stderr() -> Iterator[None]:
    """While a --json task runs, the task's console writes to stderr (its live views too)."""
    from draftops.console import console, real_console
    shown = real_console(console)
    saved = shown.file
    shown.file = sys.stderr
    try:
        yield
    finally:
        shown.file = saved


def json_output(name: str) -> Callable[[F], F]:
    """Give the task (which declares ``json: bool = False``) the --json behaviour described above.
    Put it between ``@task`` and ``@friendly``, so a draftops error is an Exit by the time it is seen."""
    def wrap(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("json"):
                return func(*args, **kwargs)
            asked = Answer(name)
            _asked.append(asked)
            try:
                with human_to_stderr():
                    return func(*args, **kwargs)
            except Exit as exc:
                asked.exit_code = exc.code
                asked.error = clean(str(exc.message)) if exc.message else None
                raise
            except BaseException as exc:
                asked.exit_code, asked.error = 1, f"{type(exc).__name__}: {clean(str(exc))}"
                raise
            finally:
                _asked.pop()
                sys.stdout.write(json.dumps(asked.document(), indent=2, allow_nan=False, ensure_ascii=False) + "\n")
                sys.stdout.flush()
        return wrapper  # type: ignore[return-value]
    return wrap
