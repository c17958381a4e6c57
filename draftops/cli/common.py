"""What every task shares: the project root, the connected host, friendly errors, job round trips."""
from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from invoke import Context
from invoke.exceptions import Exit

from draftops import jobs
from draftops.console import LogMode, console, follow_live, safe
from draftops.errors import DraftopsError
from draftops.host import Host, open_host
from draftops.sync import sync
from draftops.terminal import clean
from remote.events import EVENT_PREFIX

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
    """Turn draftops' errors into a one-paragraph message and exit code 1, without a traceback."""
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except DraftopsError as exc:
            raise Exit(f"error: {clean(str(exc))}", code=1) from None
    return wrapper  # type: ignore[return-value]


def connect(c: Context, host: str | None, inventory: Inventory | None = None) -> Host:
    """The host for this invoke call (one connection, shared by chained tasks)."""
    with console.status(f"connecting to {host or 'default host'}…"):
        return open_host(host, project_root(c), inventory)


def ensure_code(target: Host) -> None:
    """Sync once per invoke call before running synced code (a no-op sync costs one round trip)."""
    if target.synced:
        return
    report = sync(target)
    if not report.noop:
        console.print(f"[dim]synced {len(report.upload)} changed file(s) to {target.name}[/]")
    target.synced = True


def run_job(target: Host, name: str, command: str, *, follow: bool = True, pull: bool = True,
            quiet: bool = False, env: dict[str, str] | None = None, log: LogMode | None = None,
            task: str | None = None, args: dict[str, Any] | None = None
            ) -> tuple[str, dict[str, Any], Path | None]:
    """Start a job, stream it, pull its folder home; returns (id, final status, local folder).

    ``task``/``args`` record what the run is (shown by `invoke runs`); ``log`` is how its log shows
    while it runs (see ``follow_live``)."""
    job = jobs.start(target, name, command, env=env, task=task, args=args)
    console.print(f"[dim]run {job.id} on {safe(target.name)}[/]")
    if not follow:
        console.print(f"started; follow with `invoke logs {job.id} --follow --host {safe(target.name)}`")
        return job.id, jobs.status(target, job.id), None
    final = follow_live(target, job.id, quiet=quiet, log=log)
    local = None
    if pull:
        pulled = jobs.pull_run(target, job.id)
        show_skipped(pulled)
        local = pulled.path
    return job.id, final, local


def show_skipped(pulled: jobs.Pulled) -> None:
    for note in pulled.skipped[:20]:
        console.print(f"[yellow]not pulled[/] {safe(note.get('path'))}: {safe(note.get('reason'))}")
    if len(pulled.skipped) > 20:
        console.print(f"[yellow]not pulled[/]: {len(pulled.skipped) - 20} more entries")


def log_tail(path: Path, lines: int = 15, max_bytes: int = 1 << 16) -> list[str]:
    """The last text lines of a pulled log (event lines left out, terminal-safe); reads only its end."""
    with open(path, "rb") as fh:
        size = fh.seek(0, 2)
        fh.seek(max(0, size - max_bytes))
        data = fh.read()
    if size > max_bytes:
        data = data.split(b"\n", 1)[-1]            # the first line is cut
    text = [clean(line) for line in data.decode("utf-8", "replace").splitlines()
            if not line.startswith(EVENT_PREFIX)]
    return text[-lines:]


def require_success(run_id: str, final: dict[str, Any], local: Path | None) -> None:
    """Exit 1 unless the run succeeded, with the end of its log (the useful part of a failure)."""
    if final.get("state") != "succeeded":
        where, tail = "", ""
        if local and (local / "log").is_file():
            where = f"; its log is in {local}/log"
            tail = "\n" + "\n".join(log_tail(local / "log"))
        raise Exit(f"error: run {run_id} {clean(str(final.get('state')))} (exit {final.get('exit_code')}){where}."
                   f"{tail}", code=1)


def adopt_callwide_host(argv: list[str]) -> None:
    """Make one ``--host X`` apply to every task of the call.

    Invoke parses flags per task, so ``invoke sync test-drafter --host gpu`` would otherwise sync to
    the default host and evaluate on ``gpu``. When the command line names exactly one host, it becomes
    the call's default (an explicit $DRAFTOPS_HOST still wins for tasks that name none).
    """
    import os
    named = {argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("--host", "-H")}
    named |= {arg.split("=", 1)[1] for arg in argv if arg.startswith("--host=")}
    if len(named) == 1 and "DRAFTOPS_HOST" not in os.environ:
        os.environ["DRAFTOPS_HOST"] = named.pop()


def whole_number(flag: str, value: Any, error: type[DraftopsError]) -> int | None:
    """Invoke passes options whose default is None as strings; counts and ports must be integers."""
    if value is None:
        return None
    try:
        return int(str(value))
    except ValueError:
        raise error(f"{flag} {value!r} is not a whole number.") from None


def host_path(target: Host, path: str | None) -> str | None:
    """A path the user typed for the host; on the local host, relative means relative to the project
    (jobs run in <root>/code, where a relative path would silently point elsewhere)."""
    if path is None or target.spec.transport != "local":
        return path
    return str((target.project_root / path).resolve()) if not Path(path).is_absolute() else path
