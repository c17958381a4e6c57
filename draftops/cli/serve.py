"""`invoke serve` (start a checked EAGLE-3 server) and serve.status / serve.stop / serve.logs.

`serve` is a namespace whose default task starts a server, so `invoke serve --draft CKPT` and
`invoke serve.stop` read as one family.
"""
from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from invoke import Context

from draftops import cmdline
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, live, project_root
from draftops.cli.history import record_serve
from draftops.cli.options import GRACE_S, MAX_PENDING, MAX_PENDING_HELP, WHOLE, Number, grace_option, task
from draftops.console import console, escape, shown_state, state_text, table_width
from draftops.drafter.demo import ensure_demo
from draftops.errors import ConnectError, DraftopsError, RemoteError, ServeError, ServeRefused
from draftops.link.host import Host
from draftops.runs import tools
from draftops.runs.hostfiles import host_path
from draftops.serve import checks, hosttool, lifecycle, profiles, verdicts
from draftops.serve.request import DEMO, Request, demo_dir, resolve
from draftops.terminal import clean

if TYPE_CHECKING:
    from rich.console import Console

    from draftops.documents.serve_inspect import ServeInspect

_HELP = {
    "draft": "draft checkpoint folder on the host, or `demo` (the generated demo's target and its draft "
             "as configured: the seed's wrong ids until `invoke draft-config --ckpt demo` fixes them)",
    "baseline": "serve the profile's target with no draft (for comparison runs; on `local` with no target: "
                "the demo's target)",
    "profile": "serve profile of the host (hosts.yaml `serve:`; default: the only one, or `default`)",
    "target": "target model folder on the host (default: the profile's `target`; `demo` for the demo's)",
    "steps": "speculative steps (vLLM: num_speculative_tokens, default 3)",
    "topk": "SGLang: draft tree branching per step", "draft_tokens": "SGLang: tokens verified per step",
    "port": "port on the host (default: the profile's, else 30000 SGLang / 8000 vLLM)",
    "allow_override": "start even though SGLang will change --draft-tokens (topk 1)",
    "force": "serve a draft whose latest test-drafter verdict is MISMATCH",
    "replace": "stop the draftops server already on that port first", "host": HOST_HELP,
    "max_pending": MAX_PENDING_HELP,
}


def _absolute(host: Host, path: str | None) -> str | None:
    """A host path of serve (`demo` stays the keyword): see ``host_path``."""
    return path if path == DEMO else host_path(host, path)


def show_findings(found: checks.Findings, out: Console) -> None:
    """The checks' notes and warnings (refusals are raised, not shown)."""
    for note in found.notes:
        out.print(f"[dim]· {escape(cmdline.commands_in(note))}[/]")
    for warning in found.warnings:
        first, *commands = cmdline.commands_in(warning).split("\n")
        out.print(f"[yellow]warning[/]: {escape(first)}")
        for command in commands:    # a command on its own line, never wrapped: it pastes whole
            out.print(escape(command), soft_wrap=True)


class _ProgressLine:
    """A live status line on a terminal; otherwise a plain line on each change and every 15 s."""

    def __init__(self, label: str, where: str):
        self.label, self.where = label, where
        self.last: tuple[str, str] | None = None
        self.printed = 0.0
        self.status = console.status(f"waiting for {label} on {where}…") if console.is_terminal else None
        if self.status is not None:
            self.status.start()

    def __call__(self, elapsed: float, what: str, code: int | None) -> None:
        answer = "no answer yet" if code is None else f"HTTP {code}"
        text = f"waiting for {self.label} on {self.where}: {elapsed:.0f} s, {what} → {answer}"
        if self.status is not None:
            self.status.update(text)
        elif (answer, what) != self.last or time.monotonic() - self.printed > 15:
            console.print(f"[dim]{escape(text)}[/]")
            self.last, self.printed = (answer, what), time.monotonic()

    def done(self) -> None:
        if self.status is not None:
            self.status.stop()


def _value(value: Any) -> str:
    return "—" if value is None else escape(str(value))


@dataclasses.dataclass(frozen=True)
class LayerIds:
    """The draft's aux layer ids as the serving engine reads its config (``ids`` None: the config
    names none the engine reads, so it uses its default)."""

    engine: str                 # the engine's label: its convention
    ids: list[int] | None
    field: str | None


def layer_ids(facts: ServeInspect, label: str) -> LayerIds | None:
    """From `remote.serve inspect`'s reading of the draft config for the chosen engine; None for a
    baseline or a config whose format was not recognised."""
    reading = facts.draft.reading if facts.draft else None
    if reading is None:
        return None
    return LayerIds(label, reading.ids, reading.field or None)


def _layer_row(layers: LayerIds, effective: dict[str, Any]) -> tuple[tuple[str, Any, Any, bool], str | None]:
    """The aux-layer-ids row of the read-back table, and a note when the engine did not report them."""
    got = effective.get("aux_layer_ids")
    got = list(got) if isinstance(got, (list, tuple)) else None
    asked: Any = layers.ids if layers.ids is not None else "engine default (none in the config)"
    row = (f"aux layer ids ({layers.engine} convention)", asked, got,
           layers.ids is not None and got is not None and list(layers.ids) != got)
    note = None
    if got is None:
        where = f"`{layers.field}` of the draft config" if layers.field else "the draft config"
        note = (f"{layers.engine} did not report the aux layer ids it captures; asked is what {where} holds "
                f"as {layers.engine} reads it")
    return row, note


def show_readback(readback: lifecycle.Readback, label: str, out: Console, layers: LayerIds | None = None) -> None:
    """Asked-for vs effective settings (the draft's aux layer ids among them: the setting a wrong
    draft config gets wrong), the differing ones in red, then the notes."""
    from rich.table import Table

    table = Table(title=f"{label}: asked for vs effective", title_justify="left")
    for col in ("setting", "asked", "effective"):
        table.add_column(col, overflow="fold")
    rows, notes = list(readback.rows), list(readback.notes)
    if layers is not None:
        row, note = _layer_row(layers, readback.effective)
        rows.insert(2 if len(rows) >= 2 else len(rows), row)
        notes += [note] if note else []
    for name, asked, got, differs in rows:
        style = "bold red" if differs else ""
        table.add_row(f"[{style}]{escape(name)}[/]" if style else escape(name), _value(asked),
                      f"[{style}]{_value(got)}[/]" if style else _value(got))
    out.print(table)
    differing = [name for name, _, _, differs in rows if differs]
    if differing:
        out.print(f"[bold red]the server runs with other values than asked for: {escape(', '.join(differing))}[/]")
    for note in notes:
        out.print(f"[yellow]note[/]: {escape(note)}")


@task(default=True, help=_HELP, options={**dict.fromkeys(("steps", "topk", "draft_tokens", "port"), WHOLE),
                                         "max_pending": MAX_PENDING})
@friendly
def start(c: Context, draft: str | None = None, baseline: bool = False, profile: str | None = None,
          target: str | None = None, steps: int | None = None, topk: int | None = None,
          draft_tokens: int | None = None, port: int | None = None, allow_override: bool = False,
          force: bool = False, replace: bool = False, host: str | None = None,
          max_pending: float | None = None) -> None:
    """Check a draft against its engine and target, then serve it detached and show its real settings."""
    host = connect(c, host, max_pending=max_pending)
    ensure_code(host)        # first: its exec also boots the agent, which every later step needs
    chosen = profiles.resolve(host.spec, profile)
    request = Request(draft=_absolute(host, draft), baseline=baseline, profile=profile,
                      target=_absolute(host, target), steps=steps, topk=topk,
                      draft_tokens=draft_tokens, port=port, allow_override=allow_override, force=force, replace=replace)
    plan = resolve(request, dataclasses.replace(chosen, python=_absolute(host, chosen.python) or chosen.python),
                   demo_dir(host.state_dir), demo_baseline=host.spec.transport == "local" and chosen.builtin)
    found = checks.Findings(notes=list(plan.notes))
    checks.flag_checks(plan, found)
    if found.refusals:
        raise ServeRefused(*found.refusals)
    if plan.demo:
        ensure_demo(host, live("hide"))
    launch = plan.launch
    facts = hosttool.inspect(host, launch.python, chosen.settings.env, plan.engine.name, launch.target, launch.draft)
    runs = project_root(c) / "runs"
    verdict = verdicts.latest(runs, launch.draft) if launch.draft else None
    measured = verdicts.latest_capture(runs, launch.draft, launch.target, plan.engine.name) if launch.draft else None
    checks.fact_checks(plan, facts, verdict, found, measured)
    console.print(f"[bold]{plan.engine.label}[/] {escape(str(facts.engine.version or ''))} on {host.name} "
                  f"(profile {chosen.name}, {escape(launch.python)})")
    show_findings(found, console)
    if found.refusals:
        raise ServeRefused(*found.refusals)
    layers = layer_ids(facts, plan.engine.label) if launch.draft else None
    ids = facts.draft.ids_by_engine.get("sglang") if facts.draft else None
    plan.launch = dataclasses.replace(launch, sglang_ids=tuple(ids) if ids else None)
    room = lifecycle.make_room(host, plan)
    for note in room.notes:
        console.print(f"[yellow]{escape(note)}[/]")
    server = lifecycle.launch(host, plan, dict(chosen.settings.env))
    console.print(f"[dim]started run {server.run_id} (pid {server.pid}) on {host.name}; "
                  f"log: {host.runs_dir}/{server.run_id}/log[/]")
    update = _ProgressLine(plan.engine.label, f"{host.name}:{server.port}")
    later = (f"Check it with `{cmdline.command('serve.status', host=host.name)}`; stop it with "
             f"`{cmdline.command('serve.stop', '--port', server.port, host=host.name)}`.")
    started = time.monotonic()
    record = {"run_id": server.run_id, "engine": plan.engine.name, "engine_version": facts.engine.version,
              "target": launch.target, "draft": launch.draft,
              "asked": {"profile": chosen.name, "port": server.port, "steps": launch.steps, "topk": launch.topk,
                        "draft_tokens": launch.draft_tokens, "max_running_requests": launch.max_running_requests,
                        "tp": launch.tp, "baseline": baseline, "aux_layer_ids": layers.ids if layers else None},
              "replaced_exit_s": room.replaced_exit_s}
    try:
        lifecycle.wait_ready(host, plan, server, update)
    except KeyboardInterrupt:
        update.done()
        console.print(f"\n[yellow]detached[/]: the server keeps starting on {host.name}. {later}")
        raise SystemExit(130) from None
    except (ConnectError, RemoteError) as exc:
        raise ServeError(f"Lost the host while waiting for the server to come up ({exc}). The server runs "
                         f"detached (run {server.run_id}) and may still be starting. {later}") from None
    except DraftopsError:
        record_serve(host, {**record, "effective": {}, "state": "failed", "ready_s": None})
        raise
    finally:
        update.done()
    ready_s = time.monotonic() - started
    readback = lifecycle.read_back(host, plan, server)
    record_serve(host, {**record, "effective": readback.effective, "state": "ready", "ready_s": ready_s})
    console.print(f"[green]ready[/]: {plan.engine.label} on {host.name} 127.0.0.1:{server.port} "
                  f"(run {server.run_id}); accept length: {plan.engine.accept_length_source}")
    show_readback(readback, plan.engine.label, console, layers)
    stop = cmdline.command("serve.stop", "--port", server.port, host=host.name)
    console.print(f"[dim]status: `{escape(cmdline.command('serve.status', host=host.name))}`; stop: "
                  f"`{escape(stop)}`[/]", soft_wrap=True)


def _uptime(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _settings(server: lifecycle.Server) -> str:
    effective = server.effective or {}
    shown = {k: v for k, v in effective.items() if not k.startswith("_") and v is not None and k != "draft"}
    return ", ".join(f"{k}={v}" for k, v in shown.items()) or "(not read yet)"


@task(help={"host": HOST_HELP})
@friendly
def status(c: Context, host: str | None = None) -> None:
    """List the draftops servers on the host: engine, port, pid, target, draft, uptime, settings, alive."""
    host = connect(c, host)
    ensure_code(host)
    show_servers(lifecycle.servers(host), host.name, console)


SERVER_COLUMNS = ("port", "engine", "state", "pid", "uptime", "target", "draft", "effective settings", "run")


def show_servers(rows: list[lifecycle.Server], host: str, out: Console) -> None:
    """The registry's servers as a table where every cell fits whole, else one block per server (its
    run id whole on the first line, then target, draft and settings each on a line of its own), so
    nothing is dropped off the edge of an 80-column terminal or a pipe; one line when there are none."""
    if not rows:
        out.print(f"no draftops servers on {escape(host)}")
        return
    cells = [_server_cells(row) for row in rows]
    if table_width(max([len(c[col]) for c in cells] + [len(col)]) for col in SERVER_COLUMNS) <= out.width:
        _server_table(rows, cells, host, out)
    else:
        out.print(f"servers on {escape(host)}")
        for row, cell in zip(rows, cells, strict=True):
            out.print(f"port {escape(cell['port'])}  {escape(cell['engine'])}  {state_text(row.shown_state)}  "
                      f"pid {escape(cell['pid'])}  up {cell['uptime']}  run {escape(cell['run'])}", soft_wrap=True)
            for col in ("target", "draft", "effective settings"):
                out.print(f"  {col}: {escape(cell[col])}", soft_wrap=True)
    for row in rows:             # a Slurm server's end in words (TIMEOUT: its time limit), never "alive"
        if row.note:
            out.print(f"port {escape(str(row.port))}: {escape(row.note)}")


def _server_cells(row: lifecycle.Server) -> dict[str, str]:
    return {"port": str(row.port), "engine": str(row.engine), "state": str(row.shown_state),
            "pid": str(row.pid or "—"), "uptime": _uptime(row.uptime_s), "target": str(row.target),
            "draft": str(row.draft or "(baseline)"), "effective settings": _settings(row), "run": str(row.run_id)}


def _server_table(rows: list[lifecycle.Server], cells: list[dict[str, str]], host: str, out: Console) -> None:
    from rich.table import Table

    table = Table(title=f"servers on {escape(host)}", title_justify="left")
    for col in SERVER_COLUMNS:
        table.add_column(col, no_wrap=True)
    for row, cell in zip(rows, cells, strict=True):
        table.add_row(*(state_text(row.shown_state) if col == "state" else escape(cell[col]) for col in SERVER_COLUMNS))
    out.print(table)


@task(help={"port": "the server's port (default: the only server)", "all": "stop every draftops server",
            "grace": f"seconds between SIGTERM and SIGKILL (default {GRACE_S:.0f})", "host": HOST_HELP},
      options={"port": WHOLE, "grace": grace_option("the server")})
@friendly
def stop(c: Context, port: int | None = None, all: bool = False, grace: float = GRACE_S,
         host: str | None = None) -> None:
    """Stop a server: SIGTERM to its process group, SIGKILL after the grace period."""
    host = connect(c, host)
    ensure_code(host)
    targets = lifecycle.servers(host) if all else [lifecycle.find(host, port)]
    if not targets:
        console.print(f"no draftops servers on {host.name}")
    for server in targets:
        try:
            final = lifecycle.stop(host, server, grace)
        except ServeError as exc:
            if not all:
                raise
            console.print(f"port {escape(str(server.port))}: [yellow]skipped[/]: {escape(str(exc))}")
            continue
        left = (final.get("reaped") or {}).get("left")
        tail = f", [red]processes left: {escape(str(left))}[/]" if left else ", no process left"
        took = final.get("exit_s")
        exited = f" in {took:.1f} s" if isinstance(took, (int, float)) else ""
        console.print(f"port {escape(str(server.port))} ({escape(str(server.engine))}, run "
                      f"{escape(str(server.run_id))}): {state_text(shown_state(final))}{exited}{tail}")


@task(help={"port": "the server's port (default: the only server)", "follow": "stream until it stops "
            "(Ctrl-C detaches)", "lines": "how many of the last lines to print", "host": HOST_HELP},
      options={"port": WHOLE, "lines": Number(int, 0)})     # `tail -n -3` would quietly print 3
@friendly
def logs(c: Context, port: int | None = None, follow: bool = False, lines: int = 200,
         host: str | None = None) -> None:
    """Print a server's log (its last lines), or follow it live."""
    host = connect(c, host)
    ensure_code(host)
    server = lifecycle.find(host, port)
    console.print(clean(lifecycle.log_tail(host, server.run_id, lines)), markup=False, highlight=False, end="")
    if follow:
        tools.follow(host, server.run_id, live(), offset=lifecycle.log_size(host, server.run_id), bounded=False)
