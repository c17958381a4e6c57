"""Each task's number options, declared once beside its ``@task``: their kind and the values they
may take, checked while Invoke reads the command line, so a bad value is a one-line error (exit 1)
before any task of the call runs or any host is touched.

Invoke types an option by its default (an option whose default is None arrives as text, an int
default is cast with ``int()`` and its ValueError escapes as a traceback); ``task(options=...)``
gives each declared option a cast of its own instead, through Invoke's ``klass`` hook."""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import invoke
from invoke.exceptions import ParseError


@dataclass(frozen=True)
class Number:
    """A whole number (``kind`` int) or a number (float) from ``low`` to ``high``; ``refusal``
    says what is wrong with a value out of range (and, as ``unreadable``, with text that is no
    number when that needs more than the plain "is not a whole number"). Both are formatted with
    ``flag``, ``text`` (as typed), ``value`` (as read), ``low`` and ``high``."""

    kind: type[int] | type[float] = int
    low: float = -math.inf
    high: float = math.inf
    inclusive: bool = True
    refusal: str = "{flag} must be {low} or more, not {value}."
    unreadable: str = ""

    def read(self, flag: str, text: str) -> int | float:
        """The option's value, or the ParseError Invoke prints as the one line it shows."""
        try:
            value = self.kind(text)
        except ValueError:
            wanted = "a whole number" if self.kind is int else "a number"
            raise self.error(self.unreadable or f"{{flag}} {{text!r}} is not {wanted}.", flag, text, math.nan) from None
        if not self.allows(value):
            raise self.error(self.refusal, flag, text, value)
        return value

    def allows(self, value: float) -> bool:
        if self.inclusive:
            return self.low <= value <= self.high
        return self.low < value < self.high

    def error(self, template: str, flag: str, text: str, value: float) -> ParseError:
        low, high = (int(b) if math.isfinite(b) and b == int(b) else b for b in (self.low, self.high))
        return ParseError("error: " + template.format(flag=flag, text=text, value=value, low=low, high=high))


WHOLE, NUMBER = Number(int), Number(float)
GRACE_S, MAX_GRACE_S = 10.0, 3600.0
#: slurmspec.MAX_PENDING_S (not imported: pydantic stays out of start-up; tests/test_max_pending.py holds them equal)
MAX_PENDING_S = 7 * 24 * 3600.0
_PENDING_TEXT = (f"{{flag}} {{text!r}} is not a number of seconds from 1 to {MAX_PENDING_S:.0f} (7 days): how long "
                 "a job may wait in the Slurm queue before the task stops waiting for it.")
MAX_PENDING = Number(float, 1.0, MAX_PENDING_S, refusal=_PENDING_TEXT, unreadable=_PENDING_TEXT)
MAX_PENDING_HELP = ("on a Slurm host: seconds this task's jobs may wait in the queue before it stops waiting and "
                    "says so (the job stays queued; serve cancels its server's); over hosts.yaml's slurm "
                    "max_pending, for this run only")


def grace_option(what: str) -> Number:
    """--grace of a stop: NaN, inf and negatives would crash or hang it."""
    text = (f"{{flag}} {{text!r}} is not a number of seconds from 0 to {MAX_GRACE_S:.0f} (default {GRACE_S:.0f}): "
            f"how long {what} gets between SIGTERM and SIGKILL.")
    return Number(float, 0, MAX_GRACE_S, refusal=text, unreadable=text)


class _Cast:
    """What Invoke calls to turn one option's text into its value (``Argument.kind``); its
    ``__name__`` is the placeholder `--help` shows (INT, NUMBER)."""

    def __init__(self, flag: str, spec: Number):
        self.flag, self.spec = flag, spec
        self.__name__ = "int" if spec.kind is int else "number"

    def __call__(self, text: Any) -> int | float:
        return self.spec.read(self.flag, str(text))


class Task(invoke.Task):
    """An Invoke task whose declared options (``options={name: Number}``) are read by their own cast,
    and whose options never take `-h` (help, for every task)."""

    def __init__(self, body: Callable[..., Any], options: Mapping[str, Number] | None = None, **kwargs: Any):
        super().__init__(body, **kwargs)
        self.options = dict(options or {})
        unknown = set(self.options) - set(self.argspec(body).parameters)
        if unknown:
            raise ValueError(f"task {self.name}: options {sorted(unknown)} are not parameters of it")

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        # `-h` is help, as users expect (`invoke doctor -h`), never an option's short flag; --host has
        # none (it used to be -h), so one host flag reads the same in every task
        opts: dict[str, Any] = super().arg_opts(name, default, taken_names | {"h"})
        if name == "host":
            opts["names"] = ["host"]
        spec = self.options.get(name)
        if spec is not None:
            opts["kind"] = _Cast("--" + name.replace("_", "-"), spec)
        return opts


def task(*args: Any, **kwargs: Any) -> Any:
    """``invoke.task`` with ``options={name: Number}``: the one place a task's numbers are checked."""
    return invoke.task(*args, klass=Task, **kwargs)
