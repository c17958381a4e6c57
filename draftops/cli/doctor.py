"""`invoke doctor`: check a draft, and with --fix apply the fix and prove it on real servers; the flow
is draftops/doctor/ (this task takes the flags, prints its lines and exits with its code)."""
from __future__ import annotations

from invoke import Context
from invoke.exceptions import Exit

from draftops import cmdline
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, project_root
from draftops.cli.options import MAX_PENDING, MAX_PENDING_HELP, WHOLE, task
from draftops.console import console, escape

_HELP = {
    "draft": "draft checkpoint folder on the host, or `demo` (the generated demo's draft)",
    "data": "its hidden-state dump folder on the host (not for the demo)",
    "profile": "serve profile of the host (hosts.yaml `serve:`)",
    "fix": "apply the fixes the findings name, check again, then serve and bench baseline, as served and fixed",
    "bench": "with --fix: serve and bench the three runs (default; --no-bench stops after the re-check)",
    "capture": "ask the engine itself which layer each dumped slot holds first (capture-check, ~90 s)",
    "port": "port for the servers the doctor starts (default: the profile's)",
    "keep_serving": "leave the last server (the fixed draft) running at the end",
    "fresh": "bench the baseline again even when the history holds a recent one of the same code",
    "resume": "continue the latest doctor (or the doctor of this id) from its last finished step",
    "host": HOST_HELP,
    "max_pending": MAX_PENDING_HELP + " (each of the doctor's jobs; a --resume takes its own)",
}


@task(help=_HELP, optional=["resume"], options={"port": WHOLE, "max_pending": MAX_PENDING})
@friendly
def doctor(c: Context, draft: str | None = None, data: str | None = None, profile: str | None = None,
           fix: bool = False, bench: bool = True, capture: bool = False, port: int | None = None,
           keep_serving: bool = False, fresh: bool = False, resume: str | None = None,
           host: str | None = None, max_pending: float | None = None) -> None:
    """Check a draft (test-drafter), show its findings and the one command that fixes them; with --fix,
    apply the fix, check again, and serve + bench the baseline, the draft as it was and the fixed draft,
    with the story in runs/<id>/doctor.{md,html,json}. Exit 0 healthy or fixed, 3 not, 1 a failed step."""
    from draftops.doctor import flow, plan, state  # the flow loads the bench modules (pydantic)
    from draftops.errors import DoctorError
    host_ = connect(c, host, max_pending=max_pending)
    runs_dir = project_root(c) / "runs"
    if resume is not None:
        asked = plan.Args(draft=draft, data=data, profile=profile, fix=fix, bench=bench, capture=capture, port=port,
                          keep_serving=keep_serving, fresh=fresh) if draft else None
        current = state.resume(runs_dir, None if resume is True else str(resume), host_.name, asked)
        current.args = plan.Args(**{**current.args.to_dict(), "keep_serving": keep_serving, "fresh": fresh})
    else:
        if not draft:
            raise Exit("error: give --draft CKPT (a draft folder on the host, or `demo`), or --resume.", code=1)
        if draft != "demo" and not data:
            raise DoctorError(f"--draft {draft} needs --data DUMPS: the hidden-state dumps it was trained on (on the "
                              "host); only the demo knows its own.")
        if draft == "demo" and data:
            raise DoctorError("the demo's dumps are its own: drop --data with --draft demo.")
        from draftops.cli.common import host_path
        args = plan.Args(draft=draft if draft == "demo" else str(host_path(host_, draft)),
                         data=host_path(host_, data), profile=profile, fix=fix, bench=bench, capture=capture,
                         port=port, keep_serving=keep_serving, fresh=fresh)
        current = state.new(runs_dir, host_.name, args)
    ensure_code(host_)
    console.print(f"[bold]doctor[/] {current.doctor_id} on {escape(host_.name)}: "
                  f"{escape(', '.join(s.name for s in current.steps))}")
    ended = flow.run(host_, current, lambda text: console.print(escape(text), soft_wrap=True))
    _show_end(ended)
    code = flow.exit_code(ended)
    if code:
        raise Exit(code=code)


def _show_end(ended: object) -> None:
    from draftops.doctor.report import Story, status_text
    from draftops.doctor.state import State
    assert isinstance(ended, State)
    story = Story(ended)
    colour = "green" if ended.status in ("healthy", "fixed") else "red"
    console.print(f"[{colour}]{escape(status_text(ended))}[/]")
    for line in story.sections[0][1][1:]:
        console.print(escape(line), soft_wrap=True)
    check = story.out("check")
    if not ended.args.fix and check.get("fixable"):
        console.print("fix it with:")
        console.print(escape("  " + cmdline.command("doctor", *ended.args.words(), "--fix", host=ended.host)),
                      soft_wrap=True)
