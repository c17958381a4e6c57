"""`invoke doctor`: check a draft, and with --fix apply the fix and prove it on real servers; the flow
is draftops/doctor/ (this task takes the flags, prints its lines and exits with its code)."""
from __future__ import annotations

from typing import Any

from invoke import Context
from invoke.exceptions import Exit

from draftops import cmdline
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, project_root
from draftops.cli.jsonout import JSON_HELP, answer, json_output
from draftops.cli.options import MAX_PENDING, MAX_PENDING_HELP, WHOLE, task
from draftops.console import console, escape
from draftops.link.host import Host
from draftops.runs.hostfiles import host_path

_HELP = {
    "draft": "draft checkpoint folder on the host, or `demo` (the generated demo's draft)",
    "data": "its hidden-state dump folder on the host (not for the demo)",
    "profile": "serve profile of the host (hosts.yaml `serve:`)",
    "target": "the target model the draft was trained for, on the host (default: the profile's `target:`; "
              "not for the demo)",
    "fix": "apply the fixes the findings name, check again, then serve and bench baseline, as served and fixed",
    "bench": "with --fix: serve and bench the three runs (default; --no-bench stops after the re-check)",
    "capture": "ask the engine itself which layer each dumped slot holds first (capture-check, ~90 s)",
    "port": "port for the servers the doctor starts (default: the profile's; a --resume may change it)",
    "keep_serving": "leave the last server (the fixed draft) running at the end",
    "fresh": "bench the baseline again even when the history holds a recent one of the same code",
    "tune": "with --fix: end with `invoke tune` of the fixed draft (the fastest settings, predicted and confirmed)",
    "resume": "continue the latest doctor (or the doctor of this id) from its last finished step",
    "host": HOST_HELP,
    "max_pending": MAX_PENDING_HELP + " (each of the doctor's jobs; a --resume takes its own)",
    "json": JSON_HELP,
}


@task(help=_HELP, optional=["resume"], options={"port": WHOLE, "max_pending": MAX_PENDING})
@json_output("doctor")
@friendly
def doctor(c: Context, draft: str | None = None, data: str | None = None, profile: str | None = None,
           target: str | None = None, fix: bool = False, bench: bool = True, capture: bool = False,
           port: int | None = None, keep_serving: bool = False, fresh: bool = False, tune: bool = False,
           resume: str | None = None,
           host: str | None = None, max_pending: float | None = None, json: bool = False) -> None:
    """Check a draft (test-drafter), show its findings and the one command that fixes them; with --fix,
    apply the fix, check again, and serve + bench the baseline, the draft as it was and the fixed draft,
    with the story in runs/<id>/doctor.{md,html,json}. Exit 0 healthy or fixed, 3 not, 1 a failed step."""
    from draftops.doctor import precheck, state  # the flow loads the bench modules (pydantic)
    host_ = connect(c, host, max_pending=max_pending)
    runs_dir = project_root(c) / "runs"
    given = {"draft": draft, "data": data, "profile": profile, "target": target, "fix": fix or None,
             "bench": None if bench else False, "capture": capture or None, "port": port,
             "tune": tune or None}
    if resume is not None:
        asked = {k: v for k, v in _typed(host_, given).items() if v is not None}
        folder = state.find(runs_dir, None if resume is True else str(resume))
        with state.held(folder):
            current = state.resume(folder, host_.name, {**asked, "keep_serving": keep_serving, "fresh": fresh})
            left = [s.name for s in current.steps if not s.finished]
            precheck.check(host_, current.args, left)
            ensure_code(host_)
            precheck.engine(host_, current.args, left)
            _run(host_, current)
        return
    args = _new_args(host_, given, keep_serving=keep_serving, fresh=fresh)
    ensure_code(host_)
    precheck.engine(host_, args)
    current = state.new(runs_dir, host_.name, args)
    with state.held(current.folder):
        _run(host_, current)


def _typed(host: Host, given: dict[str, Any]) -> dict[str, Any]:
    """The paths as the host reads them (absolute by runs/hostfiles.host_path's rule), so a relative
    --draft names the same folder on a resume as on the first call."""
    out = dict(given)
    for key in ("draft", "data", "target"):
        value = out.get(key)
        if value and value != "demo":
            out[key] = host_path(host, value)
    return out


def _new_args(host: Host, given: dict[str, Any], *, keep_serving: bool, fresh: bool) -> Any:
    """A new doctor's arguments, every one checked before its first step (doctor/precheck.py)."""
    from draftops.doctor import plan, precheck
    from draftops.errors import DoctorError
    draft, data = given["draft"], given["data"]
    if not draft:
        raise Exit("error: give --draft CKPT (a draft folder on the host, or `demo`), or --resume.", code=1)
    if draft != "demo" and not data:
        raise DoctorError(f"--draft {draft} needs --data DUMPS: the hidden-state dumps it was trained on (on the "
                          "host); only the demo knows its own.")
    if given["tune"] and (not given["fix"] or given["bench"] is False):
        raise DoctorError("--tune finds the fastest settings of the fixed draft on real servers: it needs --fix "
                          "(and no --no-bench).")
    if draft == "demo" and data:
        raise DoctorError("the demo's dumps are its own: drop --data with --draft demo.")
    typed = _typed(host, given)
    args = plan.Args(draft=typed["draft"], data=typed["data"], profile=typed["profile"], target=typed["target"],
                     fix=bool(given["fix"]), bench=given["bench"] is not False, capture=bool(given["capture"]),
                     port=given["port"], keep_serving=keep_serving, fresh=fresh, tune=bool(given["tune"]))
    precheck.check(host, args)
    return args


def _run(host: Host, current: Any) -> None:
    """Run the doctor ``current`` (new or resumed) to its end; exit with its status."""
    from draftops.doctor import flow
    console.print(f"[bold]doctor[/] {current.doctor_id} on {escape(host.name)}: "
                  f"{escape(', '.join(s.name for s in current.steps))}")
    ended = flow.run(host, current, lambda text: console.print(escape(text), soft_wrap=True))
    answer(ended.to_dict(), ended.doctor_id)
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
    if not ended.args.fix:
        for line in _findings(check):
            console.print(escape(line), soft_wrap=True)
    if not ended.args.fix and check.get("fixable"):
        console.print("fix it with:")
        console.print(escape("  " + cmdline.command("doctor", *ended.args.words(), "--fix", host=ended.host)),
                      soft_wrap=True)


def _findings(check: dict[str, Any]) -> list[str]:
    """The check's findings, as the report's Findings section names them (what, then its fix)."""
    found = check.get("findings") or []
    if not check:
        return []
    if not found:
        return [f"findings: none (test-drafter {check.get('run_id')}: {check.get('status')})"]
    lines = [f"findings (test-drafter {check.get('run_id')}: {check.get('status')}):"]
    for f in found:
        lines.append(f"  {f.get('severity')} {f.get('id')}: {f.get('text')}")
        if f.get("fix"):
            lines.append(f"    fix: {f.get('fix')}")
    return lines
