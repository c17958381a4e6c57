"""`invoke collect RUN_ID`: finish a run whose task was interrupted (Ctrl-C, a dropped link), as that
task would have: follow it to its end, pull it, show its result and record it in the local history.

A test-drafter that was left (and then perhaps followed with `invoke logs --follow` and brought home
with `invoke pull`) otherwise never shows its verdict and never reaches `invoke runs --local`; a
capture-check never shows its table. The run's own task (its job.json) decides what is done, so one
command serves every task: bench runs go to `bench.collect`'s flow.
"""
from __future__ import annotations

from typing import Any

from invoke import Context

from draftops.cli.common import HOST_HELP, connect, friendly, live, warn
from draftops.cli.options import task
from draftops.console import console
from draftops.errors import JobError
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.tools import finish_job

#: the tasks whose runs `invoke collect` finishes
COLLECTED = ("test-drafter", "capture-check", "bench")


@task(help={"run_id": "the run to finish (`invoke runs` lists them)", "host": HOST_HELP})
@friendly
def collect(c: Context, run_id: str, host: str | None = None) -> None:
    """Finish an interrupted test-drafter, capture-check or bench run: follow it to its end, bring it
    home, show its result and record it in the local history, as the task would have."""
    host_ = connect(c, host)
    row = jobs.status(host_, run_id)
    kind = row.get("task")
    if kind == "bench":
        from draftops.cli import bench
        bench.collect(c, run_id, host=host_.name)
        return
    if kind not in COLLECTED:
        raise JobError(f"Run {run_id} on host {host_.name!r} is a run of {kind or row.get('name') or 'a job'}; `invoke "
                       f"collect` finishes {', '.join(COLLECTED)} runs (`invoke pull {run_id} --host {host_.name}` "
                       "brings any run's folder home).")
    args = row.get("args")
    given: dict[str, Any] = dict(args) if isinstance(args, dict) else {}
    if kind == "test-drafter":
        _test_drafter(host_, run_id, given)
    else:
        _capture_check(host_, run_id)


def _test_drafter(host: Host, run_id: str, given: dict[str, Any]) -> None:
    from draftops.cli.drafter import finish
    from draftops.drafter import record

    done = finish_job(host, run_id, view=live("window"))
    report = record.keep(host, done, given, warn)
    ckpt = given.get("ckpt")
    finish(done, report, ckpt if isinstance(ckpt, str) else None)


def _capture_check(host: Host, run_id: str) -> None:
    from draftops.cli.capture import show
    from draftops.documents.capture_check import CaptureCheck

    done = finish_job(host, run_id, view=live("window"))
    if done.ok:
        doc = done.document(CaptureCheck)
        if doc is not None:
            show(doc, str(done.result_file), console)
    done.check()
