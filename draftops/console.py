"""rich output for the task layer: live log tails with a progress bar, and the common tables.

The library modules never print; they return data, and these functions show it on the Console
they are given (the tasks pass ``console``; tests pass ``Console(file=StringIO())``). Nothing here
starts or follows a job: ``draftops.runs.tools`` does, and tells a :class:`LiveJob` what to show.
"""
from __future__ import annotations

import os
import shlex
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Literal, cast

from draftops import cmdline, timing
from draftops.runs.tools import JobView
from draftops.terminal import clean, markup_safe

if TYPE_CHECKING:   # rich is imported on first output: `invoke --list` never needs it
    from rich.console import Console, Group
    from rich.progress import Progress

    from draftops.runs.sync import SyncReport

LogMode = Literal["print", "window", "hide", "steps"]
WINDOW_LINES = 8            # log lines a "window" tail shows under the progress bar
HEARTBEAT_S = 30.0          # "steps" off a terminal: a line this often while only chatter arrives
PIPED_S = 5.0               # "window"/"hide" off a terminal: the latest progress or log line this often
#: the lines an install job (`env.setup`, `env.setup --engine`) prints as its own steps, and pip's
#: errors; everything else (pip's hundreds of Collecting/Downloading lines) is chatter
INSTALL_STEPS = ("creating venv ", "installing ", "removing ", "no requirements to install", "env ready",
                 "engine ", "another engine install", "ERROR", "error", "Traceback", "draftops:")


def install_step(line: str) -> bool:
    """Whether an install job's log line is one of its steps (shown), not pip's chatter (counted)."""
    text = line.strip()
    return text.startswith(INSTALL_STEPS) or " --version" in text



class _Deferred:
    """A rich Console made on first use (importing rich costs more than listing the tasks does)."""

    def __init__(self, **options: Any):
        self._options = options
        self._console: Console | None = None

    def real(self) -> Console:
        if self._console is None:
            started = time.monotonic()
            from rich.console import Console

            self._console = _text_unwrapped_when_piped(Console)(**self._options)
            timing.took("rich import", time.monotonic() - started)
        return self._console

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)

    def __enter__(self) -> Console:
        return self.real().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.real().__exit__(*exc)


def _text_unwrapped_when_piped(base: type[Console]) -> type[Console]:
    """A Console whose text lines are never broken at its width when it is not a terminal (a CI log,
    `| tee`, where rich assumes 80 columns): a printed command or run id stays whole on one line.
    Tables and panels still fit the width (a panel's lines would be cut, not wrapped, otherwise)."""

    class Piped(base):  # type: ignore[valid-type,misc]
        def print(self, *objects: Any, soft_wrap: bool | None = None, **options: Any) -> None:
            if soft_wrap is None and not self.is_terminal and all(isinstance(o, str) for o in objects):
                soft_wrap = True
            super().print(*objects, soft_wrap=soft_wrap, **options)

    return Piped


def _real(shown: Console) -> Console:
    """The rich Console behind ``console`` (rich's own objects want the class itself)."""
    return shown.real() if isinstance(shown, _Deferred) else shown


console = cast("Console", _Deferred(highlight=False))
err_console = cast("Console", _Deferred(stderr=True, highlight=False))   # notes that must not mix with piped output
STATE_STYLE = {"succeeded": "green", "running": "cyan", "starting": "cyan", "failed": "red",
               "killed": "yellow", "dead": "red bold", "stopped": "green"}
#: how a job that was told to stop (SIGTERM from `invoke kill`, `serve.stop`) ends when it exits as
#: asked: with 0, or by the TERM itself (-15 from Python's returncode, 143 from a shell)
_STOPPED_EXITS = (0, -15, 143)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def show_sync(report: SyncReport, out: Console, verbose: bool = False) -> None:
    verb = "would send" if report.dry_run else "sent"
    if report.noop:
        out.print(f"[green]sync[/] {report.host}: up to date ({report.unchanged} files unchanged, "
                      f"{report.seconds:.2f}s)")
        return
    out.print(f"[green]sync[/] {report.host}: {verb} {len(report.upload)} file(s) "
                  f"({human_bytes(report.bytes_changed)} changed, {human_bytes(report.bytes_sent)} on the wire), "
                  f"deleted {len(report.delete)}, {report.unchanged} unchanged, {report.seconds:.2f}s")
    if report.busy_runs:
        out.print(f"[yellow]warning[/]: changed the code under running run(s) "
                      f"{escape(', '.join(report.busy_runs))} (--force); they may mix old and new code")
    if report.dry_run or verbose:
        for rel in report.upload[:50]:
            out.print(f"  [cyan]+[/] {_file_name(rel)}")
        for rel in report.delete[:50]:
            out.print(f"  [red]-[/] {_file_name(rel)}")
        hidden = max(0, len(report.upload) - 50) + max(0, len(report.delete) - 50)
        if hidden:
            out.print(f"  … and {hidden} more")


def _file_name(rel: str) -> str:
    """A synced path for one line of the list: the names to delete come from the host, and any name
    may hold an escape sequence or a newline, so one that is not printable is shown quoted, with its
    control characters as escapes (``'new\\nline'``), never sent to the terminal as they are."""
    return safe(rel if rel.isprintable() else repr(rel))


def escape(text: str) -> str:
    """Text ready for rich markup: terminal escapes and control characters removed (text shown is
    mostly from a host: a version, a path, a registry entry), then rich's brackets escaped. Importing
    rich only when something is shown. A `` `invoke …` `` in it (a hint written on the host, or in a
    library message) is rebuilt to paste as printed (``cmdline.commands_in``)."""
    return markup_safe(cmdline.commands_in(text))


def safe(value: Any) -> str:
    """Host-supplied text ready for rich markup: terminal escapes stripped, brackets escaped."""
    return escape(clean("" if value is None else str(value)))


def state_text(state: str | None, orphaned: bool = False) -> str:
    state = state or "?"
    extra = " (runner gone)" if orphaned else ""
    return f"[{STATE_STYLE.get(state, 'white')}]{safe(state)}{extra}[/]"


def slurm_text(row: dict[str, Any]) -> str:
    """A Slurm run's job in words (empty for other runs): ``Slurm job 12 PENDING (reason: Resources)``,
    ``RUNNING on node7``, ``TIMEOUT: stopped by Slurm at its time limit``."""
    facts = row.get("slurm")
    if not isinstance(facts, dict) or not facts.get("job_id"):
        return ""
    state = str(facts.get("state") or "?")
    text = f"Slurm job {facts['job_id']} {state}"
    if state == "PENDING":
        text += f" (reason: {facts.get('reason') or 'none given'})"
    elif facts.get("node"):
        text += f" on {facts['node']}"
    if state not in ("PENDING", "RUNNING", "COMPLETED") and facts.get("words"):
        text += f": {facts['words']}"
    if isinstance(facts.get("queued_s"), (int, float)):
        text += f", queued {float(facts['queued_s']):.0f} s"
    return text


def state_cell(row: dict[str, Any]) -> str:
    """The state column of `invoke runs` (markup): the state, and a Slurm run's job in words."""
    text = state_text(shown_state(row), bool(row.get("orphaned")))
    slurm = slurm_text(row)
    return f"{text} [dim]{safe(slurm)}[/]" if slurm else text


def shown_state(row: dict[str, Any]) -> str | None:
    """The state as people read it: a job the runner recorded as killed that exited cleanly when told
    to stop (a server `serve.stop` stopped) is "stopped", not "killed exit 0"; one that needed
    SIGKILL, or died of something else, stays "killed"."""
    state = row.get("state")
    if state == "killed" and row.get("exit_code") in _STOPPED_EXITS and row.get("signal") in (None, 15):
        return "stopped"
    return state if isinstance(state, str) or state is None else str(state)


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


def show_runs(rows: Iterable[dict[str, Any]], host: str, out: Console) -> None:
    """The runs as a table whose ids are always whole (a list, when the terminal is too narrow)."""
    from rich.padding import Padding
    from rich.table import Table
    from rich.text import Text

    rows = list(rows)
    id_width = max([len(str(row["id"])) for row in rows] + [2])
    if out.width < id_width + 64:           # room for the other columns, or a list
        out.print(f"runs on {safe(host)}")
        for row in rows:
            out.print(safe(row["id"]), soft_wrap=True)          # whole, even wider than the screen
            out.print(Padding(Text.from_markup(
                f"{state_cell(row)}  exit {safe(row.get('exit_code', '-'))}"
                f"  {safe(describe_run(row))}  {safe(headline(row))}".rstrip()), (0, 0, 0, 2)))
        return
    table = Table(title=f"runs on {safe(host)}", title_justify="left")
    table.add_column("id", no_wrap=True, min_width=id_width)
    for col in ("state", "exit", "started", "run", "outcome"):
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(safe(row["id"]), state_cell(row),
                      safe(row.get("exit_code", "")), safe(row.get("started") or row.get("created") or ""),
                      safe(describe_run(row)), safe(headline(row)))
    out.print(table)


def show_not_shown(total: int | None, shown: int, out: Console) -> None:
    """A dim line saying how many earlier runs a bounded listing left out, and how to see them."""
    if total is not None and total > shown:
        out.print(f"[dim]({total - shown} earlier run(s) not shown: `--last N` or `--all`)[/]")


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


class LiveJob(JobView):
    """A followed job on ``out``: its log with a progress bar; Ctrl-C detaches and says how to
    re-attach. The following itself is ``draftops.runs.tools.follow``; this only shows what it is given.

    ``log`` says what happens to the log lines: "print" keeps them on screen, "window" shows the last
    few under the bar while the job runs and clears them when it ends (for tasks that show their
    result themselves, so it is not shown twice), "hide" shows none, "steps" (install jobs) prints
    only the job's own steps (``install_step``) and shows the latest other line as one passing line
    on a terminal (off a terminal, a count every ``HEARTBEAT_S``), the full log staying in its file.
    ``note`` follows the "run ID on HOST" line; ``announce=False`` leaves that line out;
    ``on_detach`` (with ``{run_id}`` and ``{host}``)
    is added to what Ctrl-C says, for a task that has more to do once the job ends."""

    def __init__(self, out: Console, log: LogMode = "print", note: str = "", announce: bool = True,
                 on_detach: str = ""):
        from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

        self.out, self.mode, self.note, self.announce, self.on_detach = out, log, note, announce, on_detach
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                                 TimeElapsedColumn(), console=_real(out), auto_refresh=False)
        self.window: deque[str] = deque(maxlen=1 if log == "steps" else WINDOW_LINES)
        self.bar: Any = None
        self.chatter, self.said = 0, time.monotonic()
        self.piped_at: float | None = None      # when the last "…" line went to a pipe (None: none yet)

    def started(self, host: str, run_id: str) -> None:
        if self.announce:
            self.out.print(f"[dim]run {safe(run_id)} on {safe(host)}{self.note}[/]")

    @contextmanager
    def following(self) -> Iterator[None]:
        from rich.live import Live

        live = Live(_LiveView(self.progress, self.window if self.mode in ("window", "steps") else None),
                    console=_real(self.out), transient=True, refresh_per_second=8, redirect_stdout=False,
                    redirect_stderr=False)
        with live:
            yield

    def text(self, line: str) -> None:
        if self.mode == "print" or (self.mode == "steps" and install_step(line)):
            self.out.print(line, markup=False, highlight=False, soft_wrap=True)
            self.said = time.monotonic()
        elif self.mode == "window":
            self.window.append(line)
            self._piped(line)
        elif self.mode == "steps":
            self._chatter(line)
        # "hide": no log line is shown, not even piped; its progress events still are (:meth:`event`)

    def _piped(self, what: str) -> None:
        """Off a terminal the live window and bar draw nothing, so a pipe, a CI log or `| tee` saw
        nothing for the whole job (25 s of demo generation): there, the latest line at once and then
        every PIPED_S, one line each, the full log staying in its file."""
        now = time.monotonic()
        if (self.piped_at is not None and now - self.piped_at < PIPED_S) or _real(self.out).is_terminal:
            return
        text = clean(what).strip()
        if any(ch.isalpha() for ch in text):       # a line of words, not a "{" a JSON dump starts with
            self.out.print(f"… {text[:160]}", markup=False, highlight=False, soft_wrap=True)
            self.piped_at = now

    def _chatter(self, line: str) -> None:
        """A line of pip's: the one passing line on a terminal, a count now and then elsewhere."""
        self.chatter += 1
        self.window.append(line)
        if not _real(self.out).is_terminal and time.monotonic() - self.said > HEARTBEAT_S:
            self.out.print(f"… {self.chatter} lines of output so far (the full log is kept); latest: "
                           f"{line.strip()[:100]}", markup=False, highlight=False, soft_wrap=True)
            self.said = time.monotonic()

    def event(self, event: dict[str, Any]) -> None:
        if event.get("event") != "progress":
            return
        what = clean(str(event.get("what") or "job"))
        total = event.get("total") if isinstance(event.get("total"), (int, float)) else None
        done = event.get("done") if isinstance(event.get("done"), (int, float)) else 0
        if self.bar is None:
            self.bar = self.progress.add_task(what, total=total or None)
        self.progress.update(self.bar, completed=done, total=total or None, description=what)
        if self.mode != "print":
            self._piped(f"{what}: {done:g}" + (f" of {total:g}" if total else ""))

    def detached(self, host: str, run_id: str) -> None:
        self.out.print(f"\n[yellow]detached[/]: {safe(self._detached_text(host, run_id))}")
        self._exit()

    def leave_on_interrupt(self, host: str, run_id: str) -> Callable[[], None]:
        """Ctrl-C while following: say how to re-attach and leave at once, from the signal handler.

        Nothing that can wait on a lock runs here (no rich, no flush of a stream the interrupted code
        may be writing): the line goes straight to the output's file descriptor. The job runs on."""
        text = f"\ndetached: {clean(self._detached_text(host, run_id))}\n".encode()

        def leave() -> None:
            try:
                fd = self.out.file.fileno()
            except (AttributeError, OSError, ValueError):     # not a real file: print it the usual way
                self.detached(host, run_id)
                return
            if os.isatty(fd):
                text_out = b"\x1b[?25h" + text                  # the live display hid the cursor
            else:
                text_out = text
            os.write(fd, text_out)
            os._exit(130)
        return leave

    def _detached_text(self, host: str, run_id: str) -> str:
        more = self.on_detach.format(run_id=run_id, host=host)
        more = " " + cmdline.commands_in(more, host) if more else ""
        return (f"job {run_id} keeps running on {host}. Re-attach with "
                f"`{cmdline.command('logs', run_id, '--follow', host=host)}`; stop it with "
                f"`{cmdline.command('kill', run_id, host=host)}`.{more}")

    @staticmethod
    def _exit() -> None:
        # Leave at once: the job runs on without us, and closing the SSH link gracefully at exit can
        # wait on a lock paramiko's reader held when the interrupt landed.
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(130)

    def ended(self, run_id: str, final: dict[str, Any]) -> None:
        how = (f" (exit {safe(final['exit_code'])})" if final.get("exit_code") is not None
               else f" ({safe(final['note'])})" if final.get("slurm") and final.get("note") else "")
        self.out.print(f"job {safe(run_id)}: {state_text(final.get('state'))}{how}")

    def skipped(self, notes: list[dict[str, str]]) -> None:
        show_skipped(notes, self.out)


def show_skipped(notes: list[dict[str, str]], out: Console) -> None:
    """What a pull left out of a run folder (the first 20 entries, then a count)."""
    for note in notes[:20]:
        out.print(f"[yellow]not pulled[/] {safe(note.get('path'))}: {safe(note.get('reason'))}")
    if len(notes) > 20:
        out.print(f"[yellow]not pulled[/]: {len(notes) - 20} more entries")


def real_console(shown: Console) -> Console:
    """The rich Console behind ``shown`` (``--json`` points it at stderr for a task's run)."""
    return _real(shown)


#: what a rich table with the default box spends around each column (a space either side and a rule)
CELL_EXTRA = 3


def fit_columns(width: int, natural: dict[str, int], priority: list[str], flexible: str = "",
                flexible_min: int = 20) -> list[str]:
    """The columns shown whole at ``width``: ``natural`` is each column's widest cell, ``priority``
    the order they earn their place in (the first always does); ``flexible`` (folded, wrapped
    inside its cell) takes what is left, at least ``flexible_min``. The names come back in
    ``natural``'s order, so wider terminals show more columns in the same places. Never a column
    cut to `k…`: one that does not fit whole is left out."""
    used = 1 + (flexible_min + CELL_EXTRA if flexible else 0)
    chosen = {priority[0]}
    used += natural[priority[0]] + CELL_EXTRA
    for name in priority[1:]:
        if name != flexible and used + natural[name] + CELL_EXTRA <= width:
            chosen.add(name)
            used += natural[name] + CELL_EXTRA
    return [name for name in natural if name in chosen or name == flexible]


def table_width(widths: Iterable[int]) -> int:
    """The width of a rich table (default box) whose columns are ``widths`` wide."""
    return 1 + sum(w + CELL_EXTRA for w in widths)
