"""`invoke capture-check`: the serving engine's own hidden states against the training dumps."""
from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from invoke import Context

from draftops import cmdline
from draftops.capture import flow
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, live, project_root
from draftops.cli.history import record_capture_check
from draftops.cli.jsonout import JSON_HELP, answer, json_output
from draftops.cli.options import MAX_PENDING, MAX_PENDING_HELP, Number, task
from draftops.console import LiveJob, console, escape
from draftops.drafter.demo import ensure_demo
from draftops.serve import profiles

if TYPE_CHECKING:
    from rich.console import Console

    from draftops.documents.capture_check import CaptureCheck

SAMPLES = Number(int, 1, 4096, refusal="{flag} must be {low} to {high}, not {value}.")
PORT = Number(int, 1, 65535, refusal="{flag} must be a TCP port ({low}-{high}), not {value}.")


@task(help={"data": "hidden-state dump folder on the host (default: the demo's)",
            "draft": "draft checkpoint folder on the host whose configured ids to check (demo: the demo)",
            "profile": "serve profile whose engine, python, tensor parallel size and dtype to use",
            "target": "target model folder on the host (default: the profile's)",
            "samples": "dump samples to send (default 24)",
            "port": "port for the short-lived engine instance (default: a free one)", "host": HOST_HELP,
            "max_pending": MAX_PENDING_HELP, "json": JSON_HELP},
      options={"samples": SAMPLES, "port": PORT, "max_pending": MAX_PENDING})
@json_output("capture-check")
@friendly
def capture_check(c: Context, data: str | None = None, draft: str | None = None, profile: str | None = None,
                  target: str | None = None, samples: int = 24, port: int | None = None,
                  host: str | None = None, max_pending: float | None = None, json: bool = False) -> None:
    """Ask the serving engine which layer each dumped slot holds, and what it will feed the draft."""
    host_ = connect(c, host, max_pending=max_pending)
    ensure_code(host_)
    chosen = profiles.resolve(host_.spec, profile)
    data_, draft_, target_, demo = flow.task_paths(host_, data, draft, target, chosen)
    if demo:
        ensure_demo(host_, live("hide"))
    check = flow.Check(flow.on_host(host_, chosen), data_, target_, draft_, samples, port)
    done = flow.run(host_, check, StopOnInterrupt(console, project_root(c)))
    answer(done.data, done.run_id)
    doc = flow.read(done) if done.ok else None
    if doc is not None:
        show(doc, str(done.result_file), console)
    record_capture_check(done, check.given(), doc, host_.project_root)
    done.check()


class StopOnInterrupt(LiveJob):
    """Ctrl-C stops the check instead of detaching from it: its engine instance exists only for the check.
    From the signal handler nothing may wait on a lock (console.LiveJob), so the stop is its own process,
    `invoke kill RUN` (SIGTERM: the tool stops its engine and removes its files), started and left."""

    def __init__(self, out: Console, root: Path) -> None:
        super().__init__(out, "window")
        self.root = root

    def _detached_text(self, host: str, run_id: str) -> str:
        return (f"stopping capture check {run_id} on {host}: its engine instance is stopped and its hidden-state "
                f"files removed (`{cmdline.command('runs', host=host)}` shows it ended).")

    def leave_on_interrupt(self, host: str, run_id: str) -> Callable[[], None]:
        leave = super().leave_on_interrupt(host, run_id)

        def stop_then_leave() -> None:
            try:
                subprocess.Popen([sys.executable, "-m", "invoke", "kill", run_id, "--host", host], cwd=self.root,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
            except OSError:
                pass
            leave()
        return stop_then_leave


def show(doc: CaptureCheck, result_file: str, out: Console) -> None:
    """The slot table, then the story in sentences, then where the file is."""
    from rich.table import Table

    table = Table(title=f"capture check: {escape(doc.engine.name)} {escape(doc.engine.version or '')} on "
                        f"{escape(doc.target.path)}", title_justify="left")
    for column in ("slot", "holds", "vLLM id", "SGLang id", "rel. error", "runner-up"):
        table.add_column(column)
    for s in doc.slots:
        runner = f"{s.runner_up} at {s.runner_up_error:.3g}" if s.runner_up is not None and s.runner_up_error is \
            not None else "-"
        holds = escape(s.layer) if s.matched and s.layer else f"[red]no boundary[/] (nearest {s.boundary})"
        table.add_row(str(s.slot), holds, str(s.vllm_id) if s.matched else "-",
                      str(s.sglang_id) if s.matched else "-", f"{s.relative_error:.2g}", runner)
    out.print(table)
    colour = {"MATCHED": "green", "PARTIAL": "yellow", "FINAL_ONLY": "yellow", "NOT_THIS_TARGET": "red"}.get(
        doc.status, "white")
    out.print(f"[bold {colour}]{escape(doc.headline)}[/]")
    for line in doc.lines:
        if not line.startswith("slot "):
            out.print(escape(line))
    seconds = doc.seconds
    if seconds:
        out.print(f"[dim]engine ready in {seconds.get('engine_ready_s', 0):.0f} s, {doc.data.samples} samples "
                  f"in {seconds.get('requests_s', 0):.1f} s, {seconds.get('total_s', 0):.0f} s in all[/]")
    out.print(f"[dim]report: {escape(result_file)}[/]", soft_wrap=True)
