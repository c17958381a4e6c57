"""Two things Invoke's command-line parser does not do, taught to it once at start-up:

- a task of a collection typed as two words, the way users and the docs write it: `invoke bench
  compare`, `invoke serve stop`, `invoke patch-sglang apply` read as `bench.compare`, `serve.stop`,
  `patch-sglang.apply` (Invoke took `compare` for a task of its own: "No idea what 'compare' is!");
- a near miss named: `No idea what '--ckp' is! (did you mean '--ckpt'?)`, among the flags of the task
  being read (or the tasks, for a word that is no flag).

Both patch ``ParseMachine.handle`` (the one place Invoke reads a word), idempotently.
"""
from __future__ import annotations

import re
from typing import Any

from draftops.cmdline import did_you_mean

_UNKNOWN = re.compile(r"^No idea what '(.+)' is!$")


def _two_words(machine: Any, token: str) -> str | None:
    """``collection.token`` when the word before ``token`` named the collection and ``token`` is one
    of its tasks (not a flag, a flag's value or a positional argument of the task just named)."""
    previous = getattr(machine, "_draftops_previous", None)
    if previous is None or token.startswith("-") or machine.waiting_for_flag_value:
        return None
    context = machine.context
    if context is None or context.missing_positional_args or previous not in machine.contexts:
        return None
    joined = f"{previous}.{token}"
    return joined if joined in machine.contexts else None


def _suggestion(machine: Any, token: str, previous: str | None) -> str:
    """Among the flags of the task being read, or the tasks (after a collection's word: its tasks)."""
    if token.startswith("-"):
        context = machine.context or machine.initial
        known = [*context.flags, *context.inverse_flags] if context is not None else []
    elif previous is not None:
        known = [name.split(".", 1)[1] for name in machine.contexts if name.startswith(previous + ".")]
    else:
        known = list(machine.contexts)
    return did_you_mean(token, [k for k in known if len(k) > 2 or not token.startswith("--")])


def teach_parser() -> None:
    """Install the two-word tasks and the did-you-mean on Invoke's parser. Idempotent."""
    from invoke.exceptions import ParseError
    from invoke.parser.parser import ParseMachine

    original = ParseMachine.handle
    if getattr(original, "_draftops", False):
        return

    def handle(self: Any, token: str) -> None:
        joined = _two_words(self, token)
        previous, self._draftops_previous = getattr(self, "_draftops_previous", None), None
        if joined is not None:
            self.switch_to_context(joined)      # the collection's word named no task of its own
            return
        before = self.context
        try:
            original(self, token)
            if self.context is not before and token in self.contexts:
                self._draftops_previous = token        # the word that named the task now being read
        except ParseError as exc:
            unknown = _UNKNOWN.match(str(exc))
            if unknown is None:
                raise
            raise ParseError(f"{exc}{_suggestion(self, unknown.group(1), previous)}", exc.context) from None

    handle._draftops = True  # type: ignore[attr-defined]
    ParseMachine.handle = handle  # type: ignore[method-assign]
