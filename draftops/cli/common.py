"""What every task shares: the project root, the connected host, friendly errors, the live job view.

Remote tools are run by ``draftops.runs.tools.run_tool`` (start, follow, pull, read the result); a task
passes it ``live(...)`` to show the job on its console."""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from invoke import Context
from invoke.exceptions import Exit

from draftops import cmdline, timing
from draftops.console import LiveJob, LogMode, console, escape
from draftops.errors import DraftopsError
from draftops.link.host import Host, open_host
from draftops.runs.sync import sync_once
from draftops.terminal import clean

if TYPE_CHECKING:
    from draftops.inventory import Inventory

F = TypeVar("F", bound=Callable[..., Any])
HOST_HELP = "host from hosts.yaml (default: $DRAFTOPS_HOST, then the inventory's `default`)"


def project_root(c: Context) -> Path:
    try:
        return Path(c.config.draftops.project_root)
    except AttributeError:
        return Path.cwd()


def friendly(func: F) -> F:
    """Turn draftops' errors into a one-paragraph message and exit code 1, without a traceback; the
    commands printed while the task runs are for its host (``cmdline.for_host``), and those in an
    error's text are rebuilt to paste as they are (``cmdline.commands_in``)."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        timing.at("task-start")      # with DRAFTOPS_TIMING=1: where start-up ends (benchmarks)
        host = kwargs.get("host")
        try:
            with cmdline.for_host(host if isinstance(host, str) else None):
                return func(*args, **kwargs)
        except DraftopsError as exc:
            text = cmdline.commands_in(clean(str(exc)), host if isinstance(host, str) else None)
            raise Exit(f"error: {text}", code=1) from None
        finally:
            timing.at("task-end")
    return wrapper  # type: ignore[return-value]


def connect(c: Context, host: str | None, inventory: Inventory | None = None, *,
            max_pending: float | None = None) -> Host:
    """The host for this invoke call (one connection, shared by chained tasks). ``max_pending``: the
    task's ``--max-pending`` (refused on a host without a scheduler); every task sets its own, so one
    task's bound never carries over to the next of a chain."""
    from draftops.runs.jobs import bound_pending
    root = project_root(c)
    with console.status(f"connecting to {host or 'default host'}…"):
        opened = open_host(host, root, inventory)
    bound_pending(opened, max_pending)
    return opened


def connect_each(c: Context, names: Sequence[str | None], *, max_pending: float | None = None,
                 check: Callable[[Host], None] | None = None) -> list[Host]:
    """The hosts of one task in order, each connected and its code synced; ``check`` sees the first
    before any other is opened (a refusal then costs no other connection). ``max_pending`` is the
    first host's (the one the task's jobs queue on)."""
    hosts: list[Host] = []
    for name in names:
        host = connect(c, name, max_pending=None if hosts else max_pending)
        report = sync_once(host)                # as ensure_code: the code each host runs is synced
        if report is not None and not report.noop:
            console.print(f"[dim]{report.said}[/]")
        if check is not None and not hosts:
            check(host)
        hosts.append(host)
    return hosts


def ensure_code(host: Host) -> None:
    """Sync once per invoke call before running synced code (a no-op sync costs one round trip)."""
    report = sync_once(host)
    if report is not None and not report.noop:
        console.print(f"[dim]{report.said}[/]")


def warn(text: str) -> None:
    """One yellow warning line; ``text`` may hold host text (cleaned and escaped here)."""
    console.print(f"[yellow]warning: {escape(cmdline.commands_in(text))}[/]")


def live(log: LogMode = "print", note: str = "", announce: bool = True, on_detach: str = "") -> LiveJob:
    """How a task shows the job it follows: the live tail on the task's console (see ``LiveJob``)."""
    return LiveJob(console, log, note, announce, on_detach)


def adopt_callwide_host(argv: list[str]) -> None:
    """Make one ``--host X`` apply to every task of the call.

    Invoke parses flags per task, so ``invoke sync test-drafter --host gpu`` would otherwise sync to
    the default host and evaluate on ``gpu``. When the command line names exactly one host, it becomes
    the call's default (an explicit $DRAFTOPS_HOST still wins for tasks that name none).
    """
    import os
    cmdline.start()      # the user's own $DRAFTOPS_HOST, before it is set here
    named = {argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--host"}
    named |= {arg.split("=", 1)[1] for arg in argv if arg.startswith("--host=")}
    if len(named) == 1 and "DRAFTOPS_HOST" not in os.environ:
        os.environ["DRAFTOPS_HOST"] = named.pop()


def honest_option_help() -> None:
    """Invoke's ``--help`` shows a value placeholder only for str and int options, so a float option
    (`--tolerance`, `--grace`) read as a flag that takes no value; give every option that takes a
    value its placeholder (NUMBER for a float). Idempotent."""
    from invoke.parser.context import ParserContext

    original = ParserContext.help_for
    if getattr(original, "_draftops", False):
        return

    def help_for(self: ParserContext, flag: str) -> tuple[str, str]:
        names, text = original(self, flag)
        arg = self.flags.get(flag)
        if arg is None or arg.kind in (bool, str, int):
            return names, text
        value = {float: "NUMBER"}.get(arg.kind, getattr(arg.kind, "__name__", "VALUE").upper())
        spec = [f"{n} [{value}]" if arg.optional else f"{n} {value}" if len(n.strip("-")) == 1
                else f"{n}[={value}]" if arg.optional else f"{n}={value}" for n in names.split(", ")]
        return ", ".join(spec), text

    help_for._draftops = True  # type: ignore[attr-defined]
    ParserContext.help_for = help_for  # type: ignore[method-assign]


def first_paragraph_as_summary(tasks: Iterable[Any]) -> None:
    """`invoke --list` shows a task's first docstring line, which cut summaries wrapped in the
    source mid-sentence ("... follow it to its"): make each task's first line its whole first
    paragraph, so the list reads a complete sentence (`--help TASK` shows the same text)."""
    for task_ in tasks:
        doc = inspect.cleandoc(task_.__doc__ or "")
        first, _, rest = doc.partition("\n\n")
        task_.__doc__ = " ".join(first.split()) + (f"\n\n{rest}" if rest else "")
