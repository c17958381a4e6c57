"""The one builder of every `invoke …` command draftops prints: the program as this process was
started, each word shell-quoted, and ``--host NAME`` when the command is for a host other than the
default, so that a printed command pastes and runs from where the user stands (the venv not
activated, another folder, another host).

Why one function: a hint built by hand said ``invoke …`` while the user had typed
``.venv/bin/invoke …`` (``command not found`` when pasted), left a folder named ``my draft;id``
unquoted (pasting it ran ``id``) and dropped ``--host`` (pasted, it ran on ``local``). Text made where
this module cannot be imported (``remote/`` tools, the host agent) writes plain `` `invoke …` `` in
backticks; :func:`commands_in` rebuilds those with the same rules before they are shown.

Floor 1: the standard library only. The default host is what the user's environment
(``$DRAFTOPS_HOST`` as it was when the process started, before ``--host`` was adopted call-wide)
or the last loaded inventory says; the host a command is for defaults to the one of the running
task (:func:`for_host`, set by ``cli.common.friendly``).
"""
from __future__ import annotations

import contextlib
import difflib
import functools
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

HOST_ENV_VAR = "DRAFTOPS_HOST"          # inventory.HOST_ENV_VAR (not imported: this is floor 1)
BUILTIN_DEFAULT = "local"
#: Invoke's core options that change what a pasted command finds (where tasks.py is, which
#: collection, which config file): kept in front of the task, as they were typed
_KEPT_CORE = {"-r", "--search-root", "-c", "--collection", "-f", "--config"}
#: Invoke's core options that take a value (their value is no task name)
_VALUED_CORE = _KEPT_CORE | {"-D", "--list-depth", "-F", "--list-format", "--hide",
                             "--print-completion-script", "-T", "--command-timeout"}
_NAMES = ("invoke", "inv")
_QUOTED = re.compile(r"`(invoke|inv) ([^`\n]+)`")


@dataclass(frozen=True)
class Start:
    """How this process was started: its argv, the folder it was started in, and the user's
    $DRAFTOPS_HOST (before `--host` was made call-wide)."""

    argv: tuple[str, ...]
    cwd: str
    env_host: str | None


@functools.cache
def start() -> Start:
    """Taken once, at the first call (``tasks.py`` calls it before anything changes the env)."""
    return Start(tuple(sys.argv), os.getcwd(), os.environ.get(HOST_ENV_VAR) or None)


_state: dict[str, str | None] = {"inventory_default": None, "task_host": None}


def note_inventory_default(name: str) -> None:
    """The ``default:`` of the inventory just loaded (``inventory.load_inventory``)."""
    _state["inventory_default"] = name


def default_host() -> str:
    """The host a command without ``--host`` runs on, pasted in the user's shell."""
    return start().env_host or _state["inventory_default"] or BUILTIN_DEFAULT


@contextlib.contextmanager
def for_host(name: str | None) -> Iterator[None]:
    """Commands built inside are for host ``name`` (None: the call's host, as the env says)."""
    before = _state["task_host"]
    _state["task_host"] = name
    try:
        yield
    finally:
        _state["task_host"] = before


def task_host() -> str:
    """The host of the running task: named on its command line, adopted call-wide, or the default."""
    return _state["task_host"] or os.environ.get(HOST_ENV_VAR) or default_host()


def _same_file(a: str | None, b: str) -> bool:
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False


def _in_start_dir(path: str) -> str:
    return path if os.path.isabs(path) else os.path.join(start().cwd, path)


def _script_program(typed: str) -> list[str]:
    """Invoke started as a script: as typed when PATH finds another (or no) invoke, else its name."""
    name = Path(typed).name
    if _same_file(shutil.which(name), _in_start_dir(typed)):
        return [name]
    return [typed]


def _own_program() -> list[str]:
    """Started some other way (a test, a script importing draftops): this interpreter's own
    `invoke` script, else ``python -m invoke``."""
    script = Path(sys.executable).parent / "invoke"
    if script.is_file():
        return _script_program(str(script))
    return [sys.executable, "-m", "invoke"]


def _core_options(argv: Sequence[str]) -> list[str]:
    """The kept core options typed before the first task (``-r DIR``, ``--collection=X``)."""
    kept: list[str] = []
    words = iter(argv)
    for word in words:
        flag = word.split("=", 1)[0]
        if not word.startswith("-"):
            break
        takes_value = flag in _VALUED_CORE and "=" not in word
        value = next(words, None) if takes_value else None
        if flag in _KEPT_CORE:
            kept += [word] + ([value] if value is not None else [])
    return kept


@functools.cache
def program() -> tuple[str, ...]:
    """The words that start draftops the way this process was started, runnable from its folder."""
    argv = start().argv
    first = argv[0] if argv else ""
    if Path(first).name in _NAMES:
        return (*_script_program(first), *_core_options(argv[1:]))
    if Path(first).name == "__main__.py" and Path(first).parent.name == "invoke":
        return (sys.executable, "-m", "invoke", *_core_options(argv[1:]))
    return tuple(_own_program())


def quote(words: Sequence[object]) -> str:
    """Words as one shell line, each quoted where it needs it (the one quoting function)."""
    return shlex.join(str(word) for word in words)


def command(*words: object, host: str | None = None) -> str:
    """``invoke TASK WORDS…`` as the user pastes it: this process's program, every word quoted, and
    ``--host NAME`` when ``host`` (default: the running task's) is not the default host."""
    shown = [str(word) for word in words]
    target = host or task_host()
    if target != default_host() and "--host" not in shown and not any(w.startswith("--host=") for w in shown):
        shown += ["--host", target]
    return quote([*program(), *shown])


def _rebuilt(match: re.Match[str], host: str | None) -> str:
    try:
        words = shlex.split(match.group(2))
    except ValueError:
        return match.group(0)
    if not words or words[0].startswith("-"):      # core options first: built here already
        return match.group(0)
    return f"`{command(*words, host=host)}`"


def commands_in(text: str, host: str | None = None) -> str:
    """``text`` with each `` `invoke …` `` in it rebuilt by :func:`command` (text written where this
    module cannot be imported: the host's tools and agent)."""
    if "invoke" not in text and "inv " not in text:
        return text
    return _QUOTED.sub(lambda m: _rebuilt(m, host), text)


def did_you_mean(typed: str, known: Sequence[str]) -> str:
    """`` (did you mean 'blackwell'?)`` for a near miss among ``known``, else nothing."""
    close = difflib.get_close_matches(typed, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
