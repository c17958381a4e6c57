"""`invoke nightly`: run a playbook on its hosts, judge every metric against the earlier nights, write
runs/nightly-<date>/report.{md,html}; and `nightly.schedule` / `nightly.unschedule` for cron."""
from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Collection, Context
from invoke.exceptions import Exit

from draftops import tracking
from draftops.cli.common import friendly, project_root, warn
from draftops.cli.options import task
from draftops.console import console, safe
from draftops.nightly.schedule import BUSY_EXIT

DEFAULT_PLAYBOOK = "playbooks/nightly.yaml"
if TYPE_CHECKING:
    from draftops.nightly.night import Night
    from draftops.nightly.runner import Stop

EXIT_FAILED, EXIT_REGRESSION, EXIT_FINDINGS = 1, 2, 3
EXIT_BUSY = BUSY_EXIT      # another night holds one of the hosts: as cron's flock says the project is busy


def task_options(ns: Collection) -> dict[str, dict[str, str]]:
    """Each task of the collection (and each alias) -> its long options and their kinds, as Invoke
    parses them: what a playbook step's `args` may hold (tasks.py puts it in the config)."""
    found: dict[str, dict[str, str]] = {}
    for name, aliases in ns.task_names.items():
        options = {n: a.kind.__name__ for a in _arguments(ns[name]) for n in a.names if len(n) > 1}
        for each in (name, *aliases):
            found[each] = options
    return found


def _arguments(task_: Any) -> list[Any]:
    """The task's arguments, leaving its option help in place: Invoke's ``get_arguments`` pops each
    option's help text as it builds the argument, so a second call (the one `--help` makes) showed
    every option without its help."""
    saved = dict(task_.help)
    try:
        return list(task_.get_arguments())
    finally:
        task_.help = saved


def _tasks(c: Context) -> dict[str, dict[str, str]] | None:
    options = getattr(c.config.draftops, "task_options", None)
    return {k: dict(v) for k, v in options.items()} if options else None


_SIGNALS = {"SIGTERM": signal.SIGTERM, "SIGHUP": signal.SIGHUP, "SIGINT": signal.SIGINT}


@contextmanager
def _stopping() -> Iterator[Stop]:
    """While the night runs, SIGTERM, SIGHUP and Ctrl-C stop it in order (end the running steps, run the
    clean-up, record, report) instead of killing this process and orphaning a step and its server."""
    from draftops.nightly.runner import Stop
    stop = Stop()
    previous = {sig: signal.signal(sig, lambda signum, _frame: stop.set(signal.Signals(signum).name))
                for sig in _SIGNALS.values() if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _playbook_path(root: Path, playbook: str) -> Path:
    path = Path(playbook).expanduser()
    return path if path.is_absolute() else root / path


@task(default=True, help={"playbook": f"playbook file (default {DEFAULT_PLAYBOOK})",
                          "hosts": "comma-separated subset of the playbook's hosts (default: all of them)"})
@friendly
def run(c: Context, playbook: str = DEFAULT_PLAYBOOK, hosts: str | None = None) -> None:
    """Run a playbook on its hosts in parallel, compare with earlier nights, write the report.
    Exit 1 when a step failed, 3 when a step's findings say something is wrong (test-drafter's MISMATCH,
    a ✗ finding of any step), 2 when a metric regressed, 75 when another night of this project holds
    one of its hosts (nothing ran), 0 otherwise."""
    from draftops.errors import NightBusy
    from draftops.nightly import hostlock
    from draftops.nightly import night as nights
    from draftops.nightly import playbook as books
    root = project_root(c)
    path = _playbook_path(root, playbook)
    book = books.load(path, _tasks(c))
    from draftops.inventory import default_inventory_path, load_inventory
    inventory = load_inventory(default_inventory_path(root), root)
    chosen = nights.pick_hosts(book, hosts, str(path), inventory.names())
    keys = hostlock.lock_keys({h: inventory.hosts[h] for h in chosen})
    try:
        with hostlock.hold(root / "runs", keys, str(path)), _stopping() as stop:
            console.print(f"nightly [bold]{safe(book.name)}[/] on {safe(', '.join(chosen))}")
            night = nights.run_night(book, path, root, {h: inventory.hosts[h].root for h in chosen}, stop,
                                     lambda line: console.print(safe(line), soft_wrap=True))
    except NightBusy as exc:
        raise Exit(f"error: {safe(str(exc))}", code=EXIT_BUSY) from None
    finish(night)


def finish(night: Night) -> None:
    """Write the report, print the night's summary, and exit with the night's status. A report that
    cannot be written (a full disk) is one paragraph after the summary, which is printed anyway."""
    from draftops.nightly import report
    try:
        written: dict[str, Path] | None = report.write(night)
        problem = None
    except report.ReportError as exc:
        written, problem = None, exc
    for line in report.health(night):
        console.print(safe(line), soft_wrap=True)
    console.print(report.counts_line(night))
    if written:
        console.print(f"report: {safe(str(written['markdown']))} and {safe(written['html'].name)}", soft_wrap=True)
        for host in night.hosts:                  # the report beside each host's MLflow run of the night
            tracking.attach(host.logged, written.values(), warn)
    if problem:
        raise Exit(f"error: {safe(str(problem))}", code=EXIT_FAILED)
    if night.stopped:
        raise Exit(f"nightly: stopped by {night.stopped}: the running steps were ended, the clean-up steps ran, "
                   "the night is recorded as stopped and its report written", code=128 + _SIGNALS[night.stopped])
    if night.failed:
        raise Exit("nightly: a step failed (see the health summary above)", code=EXIT_FAILED)
    if night.flagged:
        raise Exit("nightly: every step ran, but a step's findings say something is wrong (✗, see the health "
                   "summary above)", code=EXIT_FINDINGS)
    if night.regressed:
        raise Exit("nightly: a metric regressed (its interval lies beyond the threshold; see the report)",
                   code=EXIT_REGRESSION)


@task(help={"at": "time of day, HH:MM (24 h, the machine's local time)",
            "playbook": f"playbook file (default {DEFAULT_PLAYBOOK})",
            "show": "print this project's crontab block and change nothing",
            "user": "whose crontab (needs root; default: yours)"})
@friendly
def schedule(c: Context, at: str | None = None, playbook: str = DEFAULT_PLAYBOOK, show: bool = False,
             user: str | None = None) -> None:
    """Run the nightly every day at --at from cron (one marker-delimited block; running it again
    replaces the block; a lock keeps two nights from overlapping; output in runs/nightly.log)."""
    from draftops.nightly import playbook as books
    from draftops.nightly import schedule as cron
    root = project_root(c)
    tab = cron.Crontab(user)
    if show:
        found = cron.show(tab, root)
        console.print(safe("\n".join(found)) if found else "no nightly is scheduled for this project")
        return
    if not at:
        raise Exit("error: give --at HH:MM (or --show to see the current schedule).", code=1)
    books.load(_playbook_path(root, playbook), _tasks(c))       # refuse to schedule a playbook that cannot run
    lines = cron.schedule(tab, root, at, playbook)
    console.print("scheduled:\n" + safe("\n".join(lines)))


@task(help={"user": "whose crontab (needs root; default: yours)"})
@friendly
def unschedule(c: Context, user: str | None = None) -> None:
    """Remove this project's nightly block from the crontab (other lines are kept)."""
    from draftops.nightly import schedule as cron
    removed = cron.unschedule(cron.Crontab(user), project_root(c))
    console.print("removed the nightly schedule" if removed else "no nightly was scheduled for this project")
