"""Tasks for code sync and remote jobs: sync, runs, logs, kill, pull; disconnect (kept connections)."""
from __future__ import annotations

import time

from invoke import Context

from draftops import timing
from draftops.cli.common import HOST_HELP, connect, friendly, live, project_root
from draftops.cli.history import LOCAL_RUNS_HELP, show_local_runs
from draftops.cli.jsonout import JSON_HELP, answer, json_output
from draftops.cli.options import GRACE_S, Number, grace_option, task
from draftops.console import (
    console,
    err_console,
    human_bytes,
    safe,
    show_not_shown,
    show_runs,
    show_skipped,
    show_sync,
    state_text,
)
from draftops.link.host import project_inventory
from draftops.runs import jobs, tools
from draftops.runs.sync import scan
from draftops.runs.sync import sync as sync_code


@task(help={"host": HOST_HELP, "dry_run": "show what would change, send nothing",
            "verbose": "list every file sent or deleted",
            "force": "change the code even under a run that is still running there"})
@friendly
def sync(c: Context, host: str | None = None, dry_run: bool = False, verbose: bool = False,
         force: bool = False) -> None:
    """Push remote/ (and the host's sync_paths) to <root>/code; only changed files travel.

    A run still running in <root>/code makes the sync refuse to change its code (it would pick up
    new modules mid-run) unless --force is given."""
    from concurrent.futures import ThreadPoolExecutor

    root = project_root(c).resolve()
    inventory = project_inventory(root)
    with ThreadPoolExecutor(max_workers=1) as pool:
        # The local scan needs no connection: it runs while the SSH handshake does (its errors, like
        # an unreadable file, still surface after a connection error, as before).
        local = pool.submit(scan, root, inventory.get(host))
        host = connect(c, host, inventory)
        waited = time.monotonic()
        manifest = local.result()
        timing.took("scan wait", time.monotonic() - waited)
        report = sync_code(host, dry_run=dry_run, force=force, local=manifest)
    host.synced = host.synced or not dry_run
    show_sync(report, console, verbose)


@task(help={"host": HOST_HELP, **LOCAL_RUNS_HELP,
            "last": f"how many of the latest runs to show (default {jobs.RUNS_SHOWN})", "all": "every run",
            "json": JSON_HELP},
      options={"last": Number(int, 1, refusal="{flag} must be 1 or more, not {value}; --all shows every run.")})
@json_output("runs")
@friendly
def runs(c: Context, host: str | None = None, local: bool = False, kind: str | None = None,
         draft: str | None = None, since: str | None = None, last: int = jobs.RUNS_SHOWN, all: bool = False,
         json: bool = False) -> None:
    """List the host's latest runs: what each was (task and arguments), its state, exit code and outcome;
    --local: the local history."""
    count = None if all else last
    if local:
        return show_local_runs(c, host=host, kind=kind, draft=draft, since=since, last=count)
    host = connect(c, host)
    if count is None:
        rows, total = jobs.list_runs(host), None
    else:
        rows, total = jobs.recent_runs(host, count)
    answer({"host": host.name, "runs": rows, "not_shown": max(0, total - len(rows)) if total is not None else 0})
    show_runs(rows, host.name, console)
    show_not_shown(total, len(rows), err_console)


@task(help={"host": HOST_HELP, "follow": "keep streaming until the job ends (Ctrl-C detaches)",
            "all": "the whole log, not just its end",
            "lines": f"how many lines of its end (default {jobs.TAIL_LINES})"}, options={"lines": Number(int, 0)})
@friendly
def logs(c: Context, run_id: str, host: str | None = None, follow: bool = False, all: bool = False,
         lines: int = jobs.TAIL_LINES) -> None:
    """Print the end of a run's log (--all for all of it; with --follow, keep streaming it live)."""
    host = connect(c, host)
    if follow:
        tools.follow(host, run_id, live(), lines=None if all else lines, bounded=False)   # waits out the queue
        return
    out = console.file

    def write(line: str) -> None:
        out.write(line + "\n")

    header = jobs.read_log(host, run_id, write, lines=None if all else lines)
    out.flush()
    if header.get("offset"):
        err_console.print(f"[dim]({human_bytes(int(header['offset']))} of earlier log not shown: `--lines N` "
                          "or `--all`)[/]")


@task(help={"host": HOST_HELP, "grace": f"seconds between SIGTERM and SIGKILL (default {GRACE_S:.0f})"},
      options={"grace": grace_option("the run")})
@friendly
def kill(c: Context, run_id: str, host: str | None = None, grace: float = GRACE_S) -> None:
    """Stop a run: SIGTERM to its process group, SIGKILL after the grace period."""
    host = connect(c, host)
    final = jobs.kill(host, run_id, grace)
    console.print(f"run {safe(run_id)}: {state_text(final.get('state'))}")


@task(help={"host": HOST_HELP})
@friendly
def pull(c: Context, run_id: str, host: str | None = None) -> None:
    """Copy <root>/runs/<id>/ from the host into runs/<id>/ here (links that lead out are left out)."""
    host = connect(c, host)
    pulled = jobs.pull_run(host, run_id)
    show_skipped(pulled.skipped, console)
    console.print(f"pulled into {safe(pulled.path)}")


@task(help={"host": HOST_HELP, "all": "every kept connection of this user, to any host"})
@friendly
def disconnect(c: Context, host: str | None = None, all: bool = False) -> None:
    """Close the kept SSH connection to the host (hosts.yaml `persist:`), as `ssh -O exit` would.

    The next call connects afresh (and keeps that connection again)."""
    from draftops.link import keeper_link

    if all:
        count = keeper_link.disconnect_all()
        console.print(f"closed {count} kept connection(s)")
        return
    inventory = project_inventory(project_root(c).resolve())
    spec = inventory.get(host)
    closed = keeper_link.disconnect(spec, inventory)
    console.print(f"{safe(spec.name)}: " + ("kept connection closed" if closed else "no kept connection"))
