"""rich output for the task layer: live log tails with a progress bar, and the common tables.

The library modules never print; they return data, and these functions show it.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from collections import deque
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Literal, cast

from draftops import jobs, timing
from draftops.terminal import clean

if TYPE_CHECKING:   # rich is imported on first output: `invoke --list` never needs it
    from rich.console import Console, Group
    from rich.progress import Progress

    from draftops.host import Host
    from draftops.sync import SyncReport

LogMode = Literal["print", "window", "hide"]
WINDOW_LINES = 8            # log lines a "window" tail shows under the progress bar



class _Deferred:
    """A rich Console made on first use (importing rich costs more than listing the tasks does)."""

    def __init__(self, **options: Any):
        self._options = options
        self._console: Console | None = None

    def real(self) -> Console:
        if self._console is None:
            started = time.monotonic()
            from rich.console import Console

            self._console = Console(**self._options)
            timing.took("rich import", time.monotonic() - started)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)

    def __enter__(self) -> Console:
        return self.real().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.real().__exit__(*exc)


def _real(shown: Console) -> Console:
    """The rich Console behind ``console`` (rich's own objects want the class itself)."""
    return shown.real() if isinstance(shown, _Deferred) else shown


console = cast("Console", _Deferred(highlight=False))
err_console = cast("Console", _Deferred(stderr=True, highlight=False))   # notes that must not mix with piped output
STATE_STYLE = {"succeeded": "green", "running": "cyan", "starting": "cyan", "failed": "red",
               "killed": "yellow", "dead": "red bold"}


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def show_sync(report: SyncReport, verbose: bool = False) -> None:
    verb = "would send" if report.dry_run else "sent"
    if report.noop:
        console.print(f"[green]sync[/] {report.host}: up to date ({report.unchanged} files unchanged, "
                      f"{report.seconds:.2f}s)")
        return
    console.print(f"[green]sync[/] {report.host}: {verb} {len(report.upload)} file(s) "
                  f"({human_bytes(report.bytes_changed)} changed, {human_bytes(report.bytes_sent)} on the wire), "
                  f"deleted {len(report.delete)}, {report.unchanged} unchanged, {report.seconds:.2f}s")
    if report.busy_runs:
        console.print(f"[yellow]warning[/]: changed the code under running run(s) "
                      f"{escape(', '.join(report.busy_runs))} (--force); they may mix old and new code")
    if report.dry_run or verbose:
        for rel in report.upload[:50]:
            console.print(f"  [cyan]+[/] {escape(rel)}")
        for rel in report.delete[:50]:
            console.print(f"  [red]-[/] {escape(rel)}")
        hidden = max(0, len(report.upload) - 50) + max(0, len(report.delete) - 50)
        if hidden:
            console.print(f"  … and {hidden} more")


def escape(text: str) -> str:
    """rich's markup escape, importing rich only when something is shown."""
    from rich.markup import escape as rich_escape

    return rich_escape(text)


def safe(value: Any) -> str:
    """Host-supplied text ready for rich markup: terminal escapes stripped, brackets escaped."""
    return escape(clean("" if value is None else str(value)))


def state_text(state: str | None, orphaned: bool = False) -> str:
    state = state or "?"
    extra = " (runner gone)" if orphaned else ""
    return f"[{STATE_STYLE.get(state, 'white')}]{safe(state)}{extra}[/]"


def describe_run(row: dict[str, Any]) -> str:
    """What a run was, as the user would type it: ``test-drafter --steps 3 --ckpt /x``."""
    parts = [str(row.get("task") or row.get("name") or "?")]
    for key, value in (row.get("args") or {}).items():
        flag = "--" + str(key).replace("_", "-")
        parts.append(flag if value is True else f"{flag} {shlex.quote(str(value))}")
    return " ".join(parts)


def headline(row: dict[str, Any]) -> str:
    """A run's outcome in a few words: the headline (or status) of its last result event, or its error."""
    outcome = row.get("outcome") or {}
    text = str(outcome.get("headline") or outcome.get("status") or "")
    if outcome.get("error"):
        error = str(outcome["error"]).strip().splitlines()[0] if str(outcome["error"]).strip() else ""
        text = (text + "; " if text else "") + "error: " + (error[:77] + "..." if len(error) > 80 else error)
    return text


def show_runs(rows: Iterable[dict[str, Any]], host: str) -> None:
    """The runs as a table whose ids are always whole (a list, when the terminal is too narrow)."""
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    rows = list(rows)
    id_width = max([len(str(row["id"])) for row in rows] + [2])
    if console.width < id_width + 64:           # room for the other columns, or a list
        console.print(f"runs on {safe(host)}")
        for row in rows:
            console.print(safe(row["id"]), soft_wrap=True)          # whole, even wider than the screen
            console.print(Padding(Text.from_markup(
                f"{state_text(row.get('state'), bool(row.get('orphaned')))}  exit {safe(row.get('exit_code', '-'))}"
                f"  {safe(describe_run(row))}  {safe(headline(row))}".rstrip()), (0, 0, 0, 2)))
        return
    table = Table(title=f"runs on {safe(host)}", title_justify="left")
    table.add_column("id", no_wrap=True, min_width=id_width)
    for col in ("state", "exit", "started", "run", "outcome"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(safe(row["id"]), state_text(row.get("state"), bool(row.get("orphaned"))),
                      safe(row.get("exit_code", "")), safe(row.get("started") or row.get("created") or ""),
                      safe(describe_run(row)), safe(headline(row)))
    console.print(table)


class _LiveView:
    """What a live tail shows: the progress bar, and in window mode the last lines of the log."""

    def __init__(self, progress: Progress, window: deque[str] | None):
        self.progress, self.window = progress, window

    def __rich__(self) -> Group:
        from rich.console import Group
        from rich.text import Text

        parts: list[Any] = []
        if self.progress.tasks:
            parts.append(self.progress.get_renderable())
        if self.window:
            parts.append(Text("\n".join(tuple(self.window)), style="dim", no_wrap=True, overflow="ellipsis"))
        return Group(*parts)


def follow_live(host: Host, run_id: str, offset: int = 0, quiet: bool = False, lines: int | None = None,
                log: LogMode | None = None) -> dict[str, Any]:
    """Tail a job's log with a progress bar until it ends; Ctrl-C detaches and says how to re-attach.

    ``log`` says what happens to the log lines: "print" keeps them on screen, "window" shows the last
    few under the bar while the job runs and clears them when it ends (for tasks that show their
    result themselves, so it is not shown twice), "hide" (or ``quiet``) shows none."""
    from rich.live import Live
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

    mode: LogMode = log or ("hide" if quiet else "print")
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                        TimeElapsedColumn(), console=_real(console), auto_refresh=False)
    window: deque[str] = deque(maxlen=WINDOW_LINES)
    live = Live(_LiveView(progress, window if mode == "window" else None), console=_real(console), transient=True,
                refresh_per_second=8, redirect_stdout=False, redirect_stderr=False)
    bar: dict[str, Any] = {}

    def on_text(line: str) -> None:
        if mode == "print":
            console.print(line, markup=False, highlight=False, soft_wrap=True)
        elif mode == "window":
            window.append(line)

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") != "progress":
            return
        what = clean(str(event.get("what") or run_id))
        total = event.get("total") if isinstance(event.get("total"), (int, float)) else None
        done = event.get("done") if isinstance(event.get("done"), (int, float)) else 0
        if "id" not in bar:
            bar["id"] = progress.add_task(what, total=total or None)
        progress.update(bar["id"], completed=done, total=total or None, description=what)

    try:
        with live:
            final = jobs.follow(host, run_id, on_text, on_event, offset, lines)
    except KeyboardInterrupt:
        console.print(f"\n[yellow]detached[/]: job {safe(run_id)} keeps running on {safe(host.name)}. Re-attach "
                      f"with `invoke logs {safe(run_id)} --follow --host {safe(host.name)}`; stop it with "
                      f"`invoke kill {safe(run_id)} --host {safe(host.name)}`.")
        # Leave at once: the job runs on without us, and closing the SSH link gracefully at exit can
        # wait forever on a lock paramiko's reader held when the interrupt landed (seen under load).
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(130)
    console.print(f"job {safe(run_id)}: {state_text(final.get('state'))}"
                  + (f" (exit {safe(final['exit_code'])})" if final.get("exit_code") is not None else ""))
    return final
