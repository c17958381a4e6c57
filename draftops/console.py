"""rich output for the task layer: live log tails with a progress bar, and the common tables.

The library modules never print; they return data, and these functions show it.
"""
from __future__ import annotations

from typing import Any, Iterable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from draftops import jobs
from draftops.host import Host
from draftops.sync import SyncReport

console = Console(highlight=False)
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


def state_text(state: str | None) -> str:
    state = state or "?"
    return f"[{STATE_STYLE.get(state, 'white')}]{state}[/]"


def show_runs(rows: Iterable[dict[str, Any]], host: str) -> None:
    table = Table(title=f"runs on {host}", title_justify="left")
    for col in ("id", "state", "exit", "started", "ended", "command"):
        table.add_column(col, overflow="fold" if col == "command" else "ellipsis")
    for row in rows:
        command = (row.get("command") or "")
        table.add_row(row["id"], state_text(row.get("state")), str(row.get("exit_code", "")),
                      row.get("started") or "", row.get("ended") or "",
                      escape(command if len(command) < 80 else command[:77] + "..."))
    console.print(table)


def follow_live(host: Host, run_id: str, offset: int = 0, quiet: bool = False) -> dict[str, Any]:
    """Tail a job's log with a progress bar; Ctrl-C detaches and says how to re-attach."""
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    bar: dict[str, Any] = {}

    def on_text(line: str) -> None:
        if not quiet:
            progress.console.print(line, markup=False, highlight=False)

    def on_event(event: dict[str, Any]) -> None:
        if event.get("event") != "progress":
            return
        what = event.get("what") or run_id
        if "id" not in bar:
            bar["id"] = progress.add_task(what, total=event.get("total") or None)
        progress.update(bar["id"], completed=event.get("done", 0), total=event.get("total") or None,
                        description=what)

    try:
        with progress:
            final = jobs.follow(host, run_id, on_text, on_event, offset)
    except KeyboardInterrupt:
        console.print(f"\n[yellow]detached[/]: job {run_id} keeps running on {host.name}. Re-attach with "
                      f"`invoke logs {run_id} --follow --host {host.name}`; stop it with "
                      f"`invoke kill {run_id} --host {host.name}`.")
        raise SystemExit(130) from None
    console.print(f"job {run_id}: {state_text(final.get('state'))}"
                  + (f" (exit {final['exit_code']})" if final.get("exit_code") is not None else ""))
    return final
