"""The doctor's served steps: serve (baseline or the draft) with serve's own checks and lifecycle, bench
that server with bench's session, stop it; and the rule for reusing a recent baseline bench."""
from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftops import history, records
from draftops.doctor import plan
from draftops.doctor.context import Ctx, host_cmd, profile_of, ran
from draftops.doctor.state import Step
from draftops.drafter.demo import ensure_demo
from draftops.errors import BenchError
from draftops.runs import jobs
from draftops.runs.hostfiles import config_digest_of
from draftops.serve import checks, lifecycle, profiles
from draftops.serve.request import DEMO, Request, demo_dir, resolve
from draftops.terminal import clean

if TYPE_CHECKING:
    from draftops.bench.result import BenchResult


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
    chosen = profile_of(ctx)
    baseline = role == plan.BASELINE
    draft = None if baseline else (DEMO if ctx.demo else args.draft)
    # the doctor serves the draft as it is to measure it, MISMATCH or not (--force): the checks still run
    # only the demo's baseline serves the demo's target; another draft is served with its own (--target,
    # else the profile's), never the demo's (precheck.py refused a doctor with neither)
    request = Request(draft=draft, baseline=baseline, profile=args.profile, port=args.port, force=True,
                      target=DEMO if baseline and ctx.demo else args.target)
    served = resolve(request, chosen, demo_dir(host.state_dir),
                     demo_baseline=ctx.demo and host.spec.transport == "local" and chosen.builtin)
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
    step.commands = [host_cmd(ctx, f"serve {flags}"), host_cmd(ctx, f"bench {bench_flags}"),
                     host_cmd(ctx, "serve.stop" + (f" --port {ctx.args.port}" if ctx.args.port else ""))]
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
        step.outcome.update(_bench_outcome(result))
        if role != plan.BASELINE:
            _decide_more(ctx, step, role, server, bench, result)
        keep = is_last and ctx.args.keep_serving
        if keep:
            server.keep = True


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
    facts = checks.refused_or_facts(host, serve_plan, chosen.settings.env, ctx.runs_dir, capture=True)
    ids = facts.draft.ids_by_engine.get("sglang") if facts.draft else None
    reading = facts.draft.reading if facts.draft else None
    serve_plan.launch = dataclasses.replace(launch, sglang_ids=tuple(ids) if ids else None)
    lifecycle.make_room(host, serve_plan)
    server = lifecycle.launch(host, serve_plan, dict(chosen.settings.env))
    ran(step, server.run_id)
    # what the host records of it (the registry's token, the job's name), so only it is ever stopped
    entry = {"run_id": server.run_id, "port": server.port, "role": role, "state": "starting",
             "token": server.entry.get("token"), "job": f"serve-{serve_plan.engine.name}-{server.port}"}
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
        readback, ready_s = lifecycle.ready_recorded(
            host, serve_plan, server, entry, _now(),
            lambda state, effective, ready_s: _record_serve(
                ctx, {**record, "effective": effective, "state": state, "ready_s": ready_s}))
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
        digest = config_digest_of(host, f"{draft}/config.json") if draft else None
        return records.serve_record(host=host.name, draft_digest=digest, git_rev=rev, **rec_args)

    records.keep(host.project_root, f"serve run {rec_args.get('run_id')}", build, ctx.warn)


def stop_server(ctx: Ctx, entry: dict[str, Any]) -> None:
    """Stop a server this doctor started (by its run, on its port), however far it came; one whose
    host records do not match what the doctor recorded of it (a tampered state) is left alone, said."""
    def not_ours(server: lifecycle.Server | None) -> str | None:
        problem = _not_ours(ctx, entry, server)
        return None if problem is None else (
            f"left alone: run {entry['run_id']} {problem}, so it is no server this doctor started "
            f"({ctx.state.folder / 'doctor.json'} says otherwise: it was edited).")

    # a server not (or no longer) registered: its run's process group is killed, if any
    lifecycle.stop_recorded(ctx.host, entry, not_ours=not_ours, kill_unregistered=True, save=ctx.state.save,
                            warn=ctx.warn)


def _not_ours(ctx: Ctx, entry: dict[str, Any], server: lifecycle.Server | None) -> str | None:
    """Why the run ``entry`` names is not the server this doctor started (None: it is). Held against
    the doctor's own steps (a server's run is a run of its step), the host's registry (port and the
    token only the starting call knew) and the host's job record (a serve job's name, its start)."""
    run_id, port = str(entry["run_id"]), entry["port"]
    role = entry.get("role")
    if not ctx.state.has(str(role)) or run_id not in ctx.state.step(str(role)).runs + ctx.state.step(str(role)).earlier:
        return f"is no run of this doctor's step {role!r}"
    token = entry.get("token")          # a state written before tokens were kept has none: the job decides
    if server is not None and (server.port != port or (token and server.entry.get("token") != token)):
        return f"is registered as the server on port {server.port} of another `invoke serve` call"
    row = jobs.status(host=ctx.host, run_id=run_id)
    name = str(row.get("name") or "")
    if name != (entry.get("job") or name) or not (name.startswith("serve-") and name.endswith(f"-{port}")):
        return f"is a job {name!r} on host {ctx.host.name!r}, not a server on port {port}"
    if entry.get("started") and row.get("started") != entry["started"]:
        return f"started at {row.get('started')}, not at {entry['started']} as the doctor recorded"
    return None


def _bench(ctx: Ctx, step: Step, role: str, started: Started, bench: dict[str, Any]) -> BenchResult:
    from draftops.bench import session
    return session.run_kept(
        ctx.host, bench, port=started.server.port, name=role, given={**bench, "doctor": ctx.state.doctor_id},
        view=ctx.tracker, noted=lambda run_id: ran(step, run_id), say=ctx.progress, warn=ctx.warn,
        intro=f"  bench: {bench.get('prompts')} prompts × {bench.get('repeats')} repeats after a warm-up")


def _decide_more(ctx: Ctx, step: Step, role: str, started: Started, bench: dict[str, Any],
                 res: BenchResult) -> None:
    """Decide, don't guess: while this server is still up, hold its bench against the baseline's by the
    comparison rule (the first of comparison.LOOKS looks); when that is undecided, bench this server
    again for the extra repeats the rule asks for (at most comparison.MAX_EXTRA), which the compare step
    adds to this run's repeats for its second look. Each look is at ALPHA / LOOKS, so the decision's
    error rate holds however the looks turn out."""
    from draftops import comparison
    from draftops.bench import result as bench_result
    from draftops.bench import samples
    base_run = ctx.state.step(plan.BASELINE).outcome.get("bench_run") if ctx.state.has(plan.BASELINE) else None
    if not base_run:
        return
    try:
        base = bench_result.load(ctx.runs_dir / str(base_run))
    except BenchError as exc:
        ctx.warn(f"no extra repeats: the baseline's bench result cannot be read ({clean(str(exc))})")
        return
    first = comparison.compare("throughput", samples.blocks(base, "throughput"), samples.blocks(res, "throughput"),
                               alpha=comparison.look_alpha())
    more = comparison.extra_repeats(first)
    step.outcome["first_look"] = first.to_dict()
    if not more:
        return
    ctx.progress(f"  throughput vs baseline {first.sentence()}: {more} more repeats of this server to decide")
    extra = _bench(ctx, step, role, started, {**bench, "repeats": more})
    step.outcome["extra_bench_run"] = extra.run_id


def _bench_outcome(res: BenchResult) -> dict[str, Any]:
    tput = res.metrics.output_throughput
    accept = res.accept_length
    per = res.per_position
    return {"bench_run": res.run_id, "throughput": {"median": tput.median, "min": tput.min, "max": tput.max,
                                                      "spread": tput.spread, "values": list(tput.values)},
            "accept_length": accept.value if accept else None,
            "per_position": per.model_dump() if per is not None else None}
