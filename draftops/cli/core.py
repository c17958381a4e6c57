"""Tasks for code sync and remote jobs: sync, runs, logs, kill, pull."""
from __future__ import annotations

from invoke import Context, task

from draftops import jobs
from draftops.cli.common import HOST_HELP, connect, friendly
from draftops.cli.history import LOCAL_RUNS_HELP, show_local_runs
from draftops.console import console, follow_live, show_runs, show_sync, state_text
from draftops.sync import sync as sync_code


@task(help={"host": HOST_HELP, "dry_run": "show what would change, send nothing",
            "verbose": "list every file sent or deleted",
            "force": "change the code even under a run that is still running there"})
@friendly
def sync(c: Context, host: str | None = None, dry_run: bool = False, verbose: bool = False,
         force: bool = False) -> None:
    """Push remote/ (and the host's sync_paths) to <root>/code; only changed files travel.

    A run still running in <root>/code makes the sync refuse to change its code (it would pick up
    new modules mid-run) unless --force is given."""
    target = connect(c, host)
    report = sync_code(target, dry_run=dry_run, force=force)
    target.synced = target.synced or not dry_run
    show_sync(report, verbose)


@task(help={"host": HOST_HELP, **LOCAL_RUNS_HELP})
@friendly
def runs(c: Context, host: str | None = None, local: bool = False, kind: str | None = None,
         draft: str | None = None, since: str | None = None) -> None:
    """List the host's runs with their state (a dead process shows as dead); --local: the local history."""
    if local:
        return show_local_runs(c, host=host, kind=kind, draft=draft, since=since)
    target = connect(c, host)
    show_runs(jobs.list_runs(target), target.name)


@task(help={"host": HOST_HELP, "follow": "keep streaming until the job ends (Ctrl-C detaches)"})
@friendly
def logs(c: Context, run_id: str, host: str | None = None, follow: bool = False) -> None:
    """Print a run's log (and with --follow, stream it live)."""
    target = connect(c, host)
    if follow:
        follow_live(target, run_id)
        return
    jobs.status(target, run_id)
    result = target.transport.run(f"cat {jobs.shell_path(target.runs_dir + '/' + run_id + '/log')}", check=False)
    console.print(result.text, markup=False, highlight=False, end="")


@task(help={"host": HOST_HELP, "grace": "seconds between SIGTERM and SIGKILL"})
@friendly
def kill(c: Context, run_id: str, host: str | None = None, grace: float = 10.0) -> None:
    """Stop a run: SIGTERM to its process group, SIGKILL after the grace period."""
    target = connect(c, host)
    final = jobs.kill(target, run_id, grace)
    console.print(f"run {run_id}: {state_text(final.get('state'))}")


@task(help={"host": HOST_HELP})
@friendly
def pull(c: Context, run_id: str, host: str | None = None) -> None:
    """Copy <root>/runs/<id>/ from the host into runs/<id>/ here."""
    target = connect(c, host)
    console.print(f"pulled into {jobs.pull(target, run_id)}")
