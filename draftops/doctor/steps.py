"""Each doctor step, composed of the library calls the single tasks make (test-drafter's tool run and
record, draft-config's and patch-sglang's tools, serve's checks and lifecycle, bench's session, the
comparison), never a subprocess `invoke`. A step fills its ``Step``: the history runs it made, what
it found (``outcome``: what the report tells) and the commands that reproduce it."""
from __future__ import annotations

import dataclasses
import posixpath
import shlex
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftops import history, records
from draftops.doctor import plan
from draftops.doctor.state import State, Step
from draftops.errors import BenchError, DoctorError, RemoteError, ServeRefused
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.tools import JobView, ask_tool, run_tool
from draftops.serve import checks, hosttool, lifecycle, profiles, verdicts
from draftops.serve.host_engine import host_engine
from draftops.serve.request import DEMO, DEMO_DRAFT, DEMO_TARGET, Request, demo_dir, resolve
from draftops.terminal import clean
from remote.bench.digest import config_digest

if TYPE_CHECKING:
    from draftops.bench.result import BenchResult
    from draftops.documents.drafter_report import DrafterReport

TOLERANCE = 0.10            # draftops.bench.compare.TOLERANCE: measured vs predicted accept length
STEPS_K = 3                 # the TTT steps test-drafter scores = vLLM's num_speculative_tokens default


class Skip(Exception):
    """A step with nothing to do (no fix to apply): recorded as skipped, with the reason."""


class Tracker(JobView):
    """A quiet view that remembers the job it follows, so an interrupted doctor can stop it (a
    tool job it started must not outlive it), and lets Ctrl-C raise as usual."""

    def __init__(self, say: Callable[[str], None], on_start: Callable[[str], None] = lambda run_id: None) -> None:
        self.say, self.on_start = say, on_start
        self.current: str | None = None

    def started(self, host: str, run_id: str) -> None:
        self.current = run_id
        self.on_start(run_id)
        self.say(f"  run {run_id}")


@dataclasses.dataclass
class Ctx:
    """What every step needs: the host, the doctor's state, where runs land, how to tell the user."""

    host: Host
    state: State
    say: Callable[[str], None]
    progress: Callable[[str], None]
    tracker: Tracker

    @property
    def args(self) -> plan.Args:
        return self.state.args

    @property
    def runs_dir(self) -> Path:
        return self.host.project_root / "runs"

    @property
    def demo(self) -> bool:
        return self.args.draft == DEMO

    def draft_path(self) -> str:
        """The draft on the host (the demo's draft for `demo`)."""
        return f"{demo_dir(self.host.state_dir)}/{DEMO_DRAFT}" if self.demo else self.args.draft

    def warn(self, text: str) -> None:
        self.say(f"warning: {text}")

    def done_outcome(self, name: str) -> dict[str, Any]:
        return self.state.step(name).outcome if self.state.has(name) else {}


def ran(step: Step, run_id: str) -> None:
    """Note a run of the step (the tracker notes a job as it starts; a step adds what made no job)."""
    if run_id not in step.runs:
        step.runs.append(run_id)


def host_path(host: Host, path: str) -> str:
    """A path typed for the host, absolute by cli/common.host_path's rule (``~`` the host's home,
    relative to where a login shell starts there): a profile's ``python: ~/...`` is such a path."""
    if host.spec.transport == "local":
        given = Path(path).expanduser()
        return str(given if given.is_absolute() else (host.project_root / given).resolve())
    if not host.info:
        host.prepare()
    home = str(host.info["home"]).rstrip("/") or "/"
    if path == "~" or path.startswith("~/"):
        return home + path[1:]
    return path if path.startswith("/") else posixpath.join(home, path)


def _profile(ctx: Ctx) -> profiles.Profile:
    """The serve profile the doctor was asked for, its python as the host reads it."""
    chosen = profiles.resolve(ctx.host.spec, ctx.args.profile)
    return dataclasses.replace(chosen, python=host_path(ctx.host, chosen.python))


def _host_cmd(ctx: Ctx, text: str) -> str:
    """A reproducing command line, with the host when it is not the default."""
    return f"invoke {text} --host {shlex.quote(ctx.host.name)}"


# --- checks ----------------------------------------------------------------------------------------

def ensure_demo(host: Host, view: JobView) -> None:
    """Generate the demo on the host once, as `invoke serve --draft demo` does first."""
    folder = demo_dir(host.state_dir)
    known = ask_tool(host, "remote.drafter.demo_spec", [folder], timeout=60).data
    if isinstance(known, dict) and known.get("complete") is True:
        return
    run_tool(host, "remote.drafter", ["demo", "--out", folder], name="demo", pull=False, view=view).check()


def capture(ctx: Ctx, step: Step) -> None:
    """`invoke capture-check`: a short-lived engine instance says which layer each dumped slot holds."""
    host, args = ctx.host, ctx.args
    chosen = _profile(ctx)
    root = demo_dir(host.state_dir)
    if ctx.demo:
        ensure_demo(host, ctx.tracker)
        data, target = f"{root}/data", f"{root}/{DEMO_TARGET}"
    else:
        data, target = str(args.data), chosen.settings.target or ""
        if not target:
            raise ServeRefused(f"No target model for the capture check: serve profile {chosen.name!r} of host "
                               f"{host.name!r} has no `target:`; set it, or run the doctor with --no-capture.")
    settings = chosen.settings
    import json
    tool_args = ["check", "--out", jobs.RUN_DIR, "--engine", chosen.engine, "--python", chosen.python,
                 "--target", target, "--data", data, "--samples", "24", "--tp", str(settings.tp or 1),
                 "--extra-args", json.dumps(list(settings.extra_args)), "--draft", ctx.draft_path()]
    if settings.context_length:
        tool_args += ["--max-model-len", str(settings.context_length)]
    done = run_tool(host, "remote.capture", tool_args, name="capture-check", task="capture-check",
                    given={"data": data, "draft": ctx.draft_path(), "target": target, "profile": chosen.name,
                           "samples": 24}, env=dict(settings.env), view=ctx.tracker)
    ran(step, done.run_id)
    done.check()
    from draftops.documents.capture_check import CaptureCheck
    doc = done.document(CaptureCheck)
    step.outcome = {"run_id": done.run_id, "status": doc.status if doc else None,
                    "message": doc.headline if doc else None}
    step.commands = [_host_cmd(ctx, f"capture-check --draft {shlex.quote(args.draft)}"
                               + (f" --data {shlex.quote(args.data)}" if args.data else ""))]


def _drafter_args(ctx: Ctx) -> tuple[list[str], dict[str, Any]]:
    host, args = ctx.host, ctx.args
    served = host_engine(host)
    tool_args = ["eval", "--out", jobs.RUN_DIR, "--steps", str(STEPS_K), "--device", "auto", *served.eval_args()]
    ckpt = None if ctx.demo else args.draft
    data = None if ctx.demo else args.data
    if ckpt:
        tool_args += ["--ckpt", ckpt, "--data", str(data)]
    measured = ctx.done_outcome(plan.CAPTURE).get("run_id")
    if measured:
        tool_args += ["--measured", f"{host.runs_dir}/{measured}/capture-check.json"]
        if verdicts.kept_engine_states(ctx.runs_dir, measured):
            tool_args += ["--engine-states", f"{host.runs_dir}/{measured}/engine-states"]
    given = {"ckpt": ckpt, "data": data, "verifier": None, "config": None, "steps": STEPS_K, "limit": None,
             "expected_acc": None, "expected_accept_length": None, "expected_from": None, "device": "auto",
             "measured_by": measured}
    return tool_args, given


def _digest(host: Host, report: DrafterReport | None) -> str | None:
    """The digest of the config the report evaluated (cli/history.py's rule: the report's, else read)."""
    checkpoint = report.checkpoint if report else None
    if checkpoint and checkpoint.config_digest:
        return checkpoint.config_digest
    if checkpoint and checkpoint.config_path:
        try:
            return config_digest(host.agent.read(checkpoint.config_path).data)
        except RemoteError:
            return None
    return None


def check(ctx: Ctx, step: Step) -> None:
    """`invoke test-drafter`: the draft against its dumps, outside any server; its findings and fix."""
    from draftops.documents.drafter_report import DrafterReport
    host = ctx.host
    tool_args, given = _drafter_args(ctx)
    done = run_tool(host, "remote.drafter", tool_args, name="test-drafter", view=ctx.tracker, task="test-drafter",
                    given=given, env={"DRAFTOPS_DEMO_DIR": demo_dir(host.state_dir)})
    ran(step, done.run_id)
    report = done.document(DrafterReport) if done.ok else None
    digest = _digest(host, report)
    records.keep(host.project_root, f"run {done.run_id}",
                 lambda rev: records.test_drafter_record(done.run_id, done.host, done.final, report, given,
                                                         git_rev=rev, config_digest=digest), ctx.warn)
    done.check()
    if report is None:
        raise DoctorError(f"test-drafter run {done.run_id} left no report.json; see `invoke logs {done.run_id}`.")
    step.outcome = drafter_outcome(report, done.run_id)
    flags = "" if ctx.demo else f" --ckpt {shlex.quote(ctx.args.draft)} --data {shlex.quote(str(ctx.args.data))}"
    step.commands = [_host_cmd(ctx, f"test-drafter{flags}")]
    ctx.progress(f"  {report.verdict.status}: predicted accept length {_fmt(report.predicted_accept_length, 'served')}"
                 f" as configured, {_fmt(report.predicted_accept_length, 'best')} with the fix; "
                 f"{len(report.findings)} finding(s)")


def _fmt(accept: Any, role: str) -> str:
    value = getattr(accept, role, None) if accept is not None else None
    return f"{value:.2f}" if isinstance(value, (int, float)) else "—"


def drafter_outcome(report: DrafterReport, run_id: str) -> dict[str, Any]:
    """What the doctor's report tells of a test-drafter run: what training fed (the dumped slots),
    what the configured ids feed, the verdict, the findings, the prediction, the fix."""
    verdict, accept = report.verdict, report.predicted_accept_length

    def per_step(evaluation: Any) -> list[Any] | None:
        if evaluation is None:
            return None
        counts = (evaluation.verifier if report.metrics.basis == "verifier" else None) or evaluation.data
        return list(counts.cond_acc) if counts is not None and counts.cond_acc is not None else None

    return {
        "run_id": run_id, "status": verdict.status, "message": verdict.message, "fixable": report.fixable,
        "fix_layer_ids": verdict.fix_layer_ids, "fix_layer_ids_vllm": verdict.fix_layer_ids_vllm,
        "needs_capture_patch": verdict.needs_capture_patch, "serving_convention": verdict.serving_convention,
        "served_slots": verdict.served_slots,
        "configured_layer_ids": report.checkpoint.configured_layer_ids, "format": report.checkpoint.format,
        "checkpoint": report.checkpoint.path, "data": report.data.path, "samples": report.data.samples,
        "trained_slots": [{"slot": s.slot, "layer_id": s.layer_id, "role": s.role} for s in report.slot_norms],
        "predicted": {"steps": accept.steps if accept else None, "served": accept.served if accept else None,
                      "best": accept.best if accept else None},
        "predicted_cond": {"served": per_step(report.metrics.served), "best": per_step(report.metrics.best)},
        "findings": [{"id": f.id, "severity": f.severity, "text": f.text, "fix": f.fix} for f in report.findings],
        "bad_findings": [f.id for f in report.findings if f.severity == "bad"],
    }


# --- the fix -----------------------------------------------------------------------------------------

def fix(ctx: Ctx, step: Step) -> None:
    """`invoke draft-config --from-report` (a backup of the config first), and `patch-sglang.apply` where
    SGLang serves and the fix needs the embedding captured."""
    found = ctx.done_outcome(plan.CHECK)
    if not found.get("fixable"):
        raise Skip(f"test-drafter said {found.get('status')}: no layer ids to rewrite")
    host = ctx.host
    engine = verdicts.serving_engine(host.spec)
    if found.get("needs_capture_patch") and engine != "vllm":
        patched = run_tool(host, "remote.sglang_patch", ["apply", "--out", jobs.RUN_DIR], name="patch-sglang-apply",
                           view=ctx.tracker, env={"DRAFTOPS_STATE_DIR": host.state_dir})
        ran(step, patched.run_id)
        _record_plain(ctx, patched.run_id, "patch-sglang", patched.final, {"action": "apply"})
        patched.check()
        step.commands.append(_host_cmd(ctx, "patch-sglang.apply"))
    check_run = str(found["run_id"])
    ckpt = ctx.draft_path()
    tool_args = ["--ckpt", ckpt, "--out", jobs.RUN_DIR, "--from-report", f"{host.runs_dir}/{check_run}/report.json"]
    tool_args += ["--engine", engine] if engine == "vllm" else ["--sglang-status"]
    if ctx.demo:
        tool_args += ["--target", f"{demo_dir(host.state_dir)}/{DEMO_TARGET}"]
    done = run_tool(host, "remote.draft_config", tool_args, name="draft-config", view=ctx.tracker,
                    env={"DRAFTOPS_STATE_DIR": host.state_dir})
    ran(step, done.run_id)
    from draftops.documents.draft_config import DraftConfigResult
    result = done.document(DraftConfigResult) if done.ok else None
    outcome = {"config": result.config, "old_ids": result.old_ids, "written_ids": result.written_ids,
               "backup": result.backup, "changed": result.changed, "warnings": list(result.warnings)} if result else {}
    _record_plain(ctx, done.run_id, "draft-config", done.final, {"ckpt": ckpt, "from_report": check_run},
                  draft=ckpt, verdict="changed" if outcome.get("changed") else None)
    done.check()
    step.outcome = {**outcome, "run_id": done.run_id}
    step.commands.append(_host_cmd(ctx, f"draft-config --ckpt {shlex.quote(ctx.args.draft)} --from-report {check_run}"))
    ctx.progress(f"  {clean(str(outcome.get('old_ids')))} → {clean(str(outcome.get('written_ids')))}; backup "
                 f"{clean(str(outcome.get('backup')))}")


def _record_plain(ctx: Ctx, run_id: str, kind: str, final: dict[str, Any], settings: dict[str, Any], *,
                  draft: str | None = None, verdict: str | None = None) -> None:
    """A run of a tool without a history row of its own (draft-config, patch-sglang), so every doctor
    step is a run in the history."""
    state = final.get("state")
    rec = history.RunRecord(run_id=run_id, kind=kind, host=ctx.host.name, draft=draft, settings=settings,
                            time=final.get("ended") or history.now_iso(),
                            metrics={"exit_code": final.get("exit_code"), "state": state},
                            verdict=(verdict or "succeeded") if state == "succeeded" else "failed")
    records.keep(ctx.host.project_root, f"run {run_id}",
                 lambda rev: dataclasses.replace(rec, git_rev=rev), ctx.warn)


def recheck(ctx: Ctx, step: Step) -> None:
    if not ctx.state.step(plan.FIX).outcome.get("run_id"):
        raise Skip("nothing was fixed, so nothing to check again")
    check(ctx, step)


# --- serve + bench -------------------------------------------------------------------------------------

def _bench_settings(ctx: Ctx) -> dict[str, Any]:
    """The one bench every served step runs; the demo's own prompts for the demo, random ids else."""
    return dict(plan.BENCH) if ctx.demo else {k: v for k, v in plan.BENCH.items() if k != "dataset"}


def reusable_baseline(runs_dir: Path, hist: history.History, *, host: str, engine: str, target: str,
                      settings: dict[str, Any], git_rev: str | None, now: datetime | None = None,
                      max_age_h: float = plan.BASELINE_MAX_AGE_H) -> history.RunRecord | None:
    """The newest succeeded baseline bench of this host, engine and target, with these bench settings,
    run by this code version (git revision) within ``max_age_h`` hours, whose result is still here."""
    if git_rev is None:
        return None             # no code version to hold it against: never reuse
    since = history.to_iso((now or datetime.now(timezone.utc)) - timedelta(hours=max_age_h))
    for rec in hist.query(kind="bench", host=host, engine=engine, target=target, since=since):
        s = rec.settings
        same = all(s.get(k) == v for k, v in settings.items() if k != "dataset")
        same = same and (s.get("dataset_kind") == "text") == ("dataset" in settings) and s.get("seed") in (0, None)
        if (rec.verdict == "succeeded" and s.get("mode") == "baseline" and same and rec.git_rev == git_rev
                and (runs_dir / rec.run_id / "bench-result.json").is_file()):
            return rec
    return None


def _serve_plan(ctx: Ctx, role: str) -> tuple[Any, profiles.Profile]:
    host, args = ctx.host, ctx.args
    chosen = _profile(ctx)
    baseline = role == plan.BASELINE
    draft = None if baseline else (DEMO if ctx.demo else args.draft)
    # the doctor serves the draft as it is to measure it, MISMATCH or not (--force): the checks still run
    request = Request(draft=draft, baseline=baseline, profile=args.profile, port=args.port, force=True,
                      target=DEMO if baseline and ctx.demo else None)
    served = resolve(request, chosen, demo_dir(host.state_dir),
                     demo_baseline=host.spec.transport == "local" and chosen.builtin)
    return served, chosen


def served(ctx: Ctx, step: Step, role: str, is_last: bool) -> None:
    """`invoke serve` (baseline or the draft) then `invoke bench` of that server; the server is stopped
    after its bench, except the last one with --keep-serving. A baseline bench of the same target,
    engine, settings and code version from the last 24 h is reused (unless --fresh)."""
    host = ctx.host
    serve_plan, chosen = _serve_plan(ctx, role)
    bench = _bench_settings(ctx)
    flags = "--baseline" if role == plan.BASELINE else f"--draft {shlex.quote(ctx.args.draft)}"
    if ctx.args.port:
        flags += f" --port {ctx.args.port}"
    bench_flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in bench.items())
    step.commands = [_host_cmd(ctx, f"serve {flags}"), _host_cmd(ctx, f"bench {bench_flags}"),
                     _host_cmd(ctx, "serve.stop" + (f" --port {ctx.args.port}" if ctx.args.port else ""))]
    if role == plan.BASELINE and not ctx.args.fresh:
        hist = history.for_project(host.project_root)
        found = reusable_baseline(ctx.runs_dir, hist, host=host.name, engine=serve_plan.engine.name,
                                  target=serve_plan.launch.target, settings=bench,
                                  git_rev=history.project_revision(host.project_root))
        if found is not None:
            step.outcome = {"bench_run": found.run_id, "reused": {"run_id": found.run_id, "time": found.time,
                                                                  "max_age_h": plan.BASELINE_MAX_AGE_H}}
            ran(step, found.run_id)
            ctx.progress(f"  reusing baseline bench {found.run_id} of {found.time[:19]} (same target, engine, "
                         f"settings and code version, under {plan.BASELINE_MAX_AGE_H:.0f} h old; --fresh re-runs it)")
            return
    with _serving(ctx, step, role, serve_plan, chosen) as server:
        result = _bench(ctx, step, role, server, bench)
        keep = is_last and ctx.args.keep_serving
        if keep:
            server.keep = True
    step.outcome.update(_bench_outcome(result))


@dataclasses.dataclass
class Started:
    server: lifecycle.Server
    keep: bool = False


@contextmanager
def _serving(ctx: Ctx, step: Step, role: str, serve_plan: Any, chosen: profiles.Profile) -> Iterator[Started]:
    """A checked server, up and read back, recorded in the history and the doctor's state; stopped on
    the way out (a failure too) unless kept."""
    host = ctx.host
    if serve_plan.demo:
        ensure_demo(host, ctx.tracker)
    launch = serve_plan.launch
    found = checks.Findings(notes=list(serve_plan.notes))
    checks.flag_checks(serve_plan, found)
    facts = hosttool.inspect(host, launch.python, chosen.settings.env, serve_plan.engine.name, launch.target,
                             launch.draft)
    verdict = verdicts.latest(ctx.runs_dir, launch.draft) if launch.draft else None
    measured = verdicts.latest_capture(ctx.runs_dir, launch.draft, launch.target, serve_plan.engine.name) \
        if launch.draft else None
    checks.fact_checks(serve_plan, facts, verdict, found, measured)
    if found.refusals:
        raise ServeRefused(*found.refusals)
    ids = facts.draft.ids_by_engine.get("sglang") if facts.draft else None
    reading = facts.draft.reading if facts.draft else None
    serve_plan.launch = dataclasses.replace(launch, sglang_ids=tuple(ids) if ids else None)
    lifecycle.make_room(host, serve_plan)
    server = lifecycle.launch(host, serve_plan, dict(chosen.settings.env))
    ran(step, server.run_id)
    entry = {"run_id": server.run_id, "port": server.port, "role": role, "state": "starting"}
    ctx.state.servers.append(entry)
    ctx.state.save()
    started = Started(server)
    record = {"run_id": server.run_id, "engine": serve_plan.engine.name, "engine_version": facts.engine.version,
              "target": launch.target, "draft": launch.draft,
              "asked": {"profile": chosen.name, "port": server.port, "steps": launch.steps,
                        "max_running_requests": launch.max_running_requests, "baseline": role == plan.BASELINE,
                        "aux_layer_ids": reading.ids if reading else None, "doctor": ctx.state.doctor_id}}
    try:
        ctx.progress(f"  serving on port {server.port} (run {server.run_id}); waiting until it answers")
        t0 = _now()
        try:
            lifecycle.wait_ready(host, serve_plan, server, lambda *_: None)
        except Exception:
            _record_serve(ctx, {**record, "effective": {}, "state": "failed", "ready_s": None})
            raise
        readback = lifecycle.read_back(host, serve_plan, server)
        ready_s = _now() - t0
        _record_serve(ctx, {**record, "effective": readback.effective, "state": "ready", "ready_s": ready_s})
        entry["state"] = "ready"
        step.outcome.update({"serve_run": server.run_id, "ready_s": round(ready_s, 1),
                             "engine": serve_plan.engine.name, "engine_version": facts.engine.version,
                             "configured_ids": reading.ids if reading else None,
                             "effective_ids": readback.effective.get("aux_layer_ids"),
                             "notes": [clean(n) for n in readback.notes]})
        ctx.progress(f"  ready in {ready_s:.0f} s")
        yield started
    finally:
        if not started.keep:
            stop_server(ctx, entry)


def _now() -> float:
    import time
    return time.monotonic()


def _record_serve(ctx: Ctx, rec_args: dict[str, Any]) -> None:
    host = ctx.host
    draft = rec_args.get("draft")

    def build(rev: str | None) -> history.RunRecord:
        digest = None
        if draft:
            try:
                digest = config_digest(host.agent.read(f"{draft}/config.json").data)
            except RemoteError:
                digest = None
        return records.serve_record(host=host.name, draft_digest=digest, git_rev=rev, **rec_args)

    records.keep(host.project_root, f"serve run {rec_args.get('run_id')}", build, ctx.warn)


def stop_server(ctx: Ctx, entry: dict[str, Any]) -> None:
    """Stop a server this doctor started (by its run, on its port), however far it came."""
    host = ctx.host
    try:
        server = next((s for s in lifecycle.servers(host) if s.run_id == entry["run_id"]), None)
        if server is not None:
            lifecycle.stop(host, server)
        else:                       # not (or no longer) registered: its run's process group, if any
            jobs.kill(host, str(entry["run_id"]), 10.0)
    except Exception as exc:        # noqa: BLE001  (the stop is tried and said, never a traceback)
        ctx.warn(f"could not stop the server of run {entry['run_id']}: {clean(str(exc))}")
        entry["state"] = "unknown"
        return
    entry["state"] = "stopped"
    ctx.state.save()


def _bench(ctx: Ctx, step: Step, role: str, started: Started, bench: dict[str, Any]) -> BenchResult:
    from draftops.bench import plan as planning
    from draftops.bench import result as bench_result
    from draftops.bench import session
    host = ctx.host
    settings = planning.BenchSettings(**bench)
    prepared = session.prepare(host, settings, port=started.server.port)
    ctx.progress(f"  bench: {bench.get('prompts')} prompts × {bench.get('repeats')} repeats after a warm-up")
    done = session.run(host, prepared, name=f"doctor-{role}", given={**bench, "doctor": ctx.state.doctor_id},
                       view=ctx.tracker)
    res = done.result
    ran(step, res.run_id)
    records.keep(host.project_root, f"run {res.run_id}", lambda rev: bench_result.bench_record(res, git_rev=rev),
                 ctx.warn)
    if res.status != "succeeded":
        raise BenchError(f"bench run {res.run_id} failed: {res.failure} What was written is in {done.folder}.")
    tput = res.metrics.output_throughput
    acc = res.accept_length.value if res.accept_length else None
    ctx.progress(f"  {tput.median or 0:.1f} tok/s (repeats {tput.min or 0:.1f}–{tput.max or 0:.1f})"
                 + (f", accept length {acc:.2f}" if acc is not None else ""))
    return res


def _bench_outcome(res: BenchResult) -> dict[str, Any]:
    tput = res.metrics.output_throughput
    accept = res.accept_length
    per = res.per_position
    return {"bench_run": res.run_id, "throughput": {"median": tput.median, "min": tput.min, "max": tput.max,
                                                      "spread": tput.spread, "values": list(tput.values)},
            "accept_length": accept.value if accept else None,
            "per_position": per.model_dump() if per is not None else None}


# --- the comparison -----------------------------------------------------------------------------------

def compare(ctx: Ctx, step: Step) -> None:
    """`invoke bench.compare` of the baseline with the draft as served and with the fixed draft."""
    from draftops.bench import compare as comparing
    from draftops.bench import outputs, result
    hist = history.for_project(ctx.host.project_root)
    runs = {role: ctx.state.step(role).outcome.get("bench_run") for role in plan.SERVED_STEPS if ctx.state.has(role)}
    base = runs.get(plan.BASELINE)
    if not base:
        raise DoctorError("no baseline bench to compare with (the baseline step recorded none); run the doctor "
                          "again with --fresh.")
    loaded = {role: result.load(ctx.runs_dir / str(run)) for role, run in runs.items() if run}
    out: dict[str, Any] = {}
    for role in (plan.AS_SERVED, plan.FIXED):
        if role not in loaded:
            continue
        a, b = loaded[plan.BASELINE], loaded[role]
        predictions = {r.run_id: comparing.find_prediction(hist, r) for r in (a, b)}
        current = {r.run_id: comparing.current_config(hist, r) for r in (a, b)}
        cmp = comparing.compare(a, b, predictions, TOLERANCE, current)
        run_id = jobs.new_run_id("bench-compare")
        outputs.write(cmp, ctx.runs_dir / run_id)
        records.keep(ctx.host.project_root, "this comparison", partial(_compare_record, cmp, run_id), ctx.warn)
        ran(step, run_id)
        step.commands.append(f"invoke bench.compare --run-a {a.run_id} --run-b {b.run_id}")
        pred = predictions.get(b.run_id)
        measured = b.accept_length.value if b.accept_length else None
        out[role] = {"run_id": run_id, "a": a.run_id, "b": b.run_id, "speedup": cmp.speedup, "noise": cmp.noise,
                     "within_noise": cmp.within_noise, "speed_text": cmp.speed_text(),
                     "measured": measured, "predicted": pred.value if pred else None,
                     "predicted_role": pred.role if pred else None,
                     "within_tolerance": (measured is not None and pred is not None
                                          and abs(measured - pred.value) <= TOLERANCE * pred.value),
                     "findings": [dataclasses.asdict(f) for f in cmp.findings],
                     "per_position": [t.to_dict() for t in cmp.positions if t.run_id == b.run_id]}
        ctx.progress(f"  {role}: measured {_num(measured)} vs predicted {_num(pred.value if pred else None)}; "
                     f"throughput vs baseline {cmp.speed_text()}")
    step.outcome = {"tolerance": TOLERANCE, **out}


def _compare_record(cmp: Any, run_id: str, rev: str | None) -> history.RunRecord:
    from draftops.bench import compare as comparing
    return comparing.compare_record(cmp, run_id, git_rev=rev)


def _num(value: float | None) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else "—"


STEP_FUNCS: dict[str, Callable[[Ctx, Step], None]] = {
    plan.CAPTURE: capture, plan.CHECK: check, plan.FIX: fix, plan.RECHECK: recheck, plan.COMPARE: compare,
}


def run_step(ctx: Ctx, step: Step) -> None:
    """Run one step by its name."""
    if step.name in plan.SERVED_STEPS:
        served_steps = [s.name for s in ctx.state.steps if s.name in plan.SERVED_STEPS]
        if step.name == plan.FIXED and not ctx.state.step(plan.FIX).outcome.get("run_id"):
            raise Skip("nothing was fixed: the draft as served is the draft")
        served(ctx, step, step.name, is_last=step.name == served_steps[-1])
        return
    STEP_FUNCS[step.name](ctx, step)
