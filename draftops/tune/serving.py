"""One measuring step of a tune: serve the draft with K draft tokens (K = 0: the baseline, no draft) with
serve's own checks and lifecycle, bench that server once per concurrency with bench's session, stop it.
Every server is named in tune.json as it starts, so an interrupted tune stops exactly its own."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from draftops import records
from draftops.documents.tune import Step
from draftops.runs.hostfiles import host_path
from draftops.runs.tools import ask_tool, run_tool
from draftops.serve import checks, lifecycle, profiles
from draftops.serve.request import DEMO, Request, demo_dir, resolve
from draftops.tune import plan
from draftops.tune.context import Ctx, ran

if TYPE_CHECKING:
    from draftops.bench.result import BenchResult


def profile_of(ctx: Ctx) -> profiles.Profile:
    """The serve profile asked for, its python as the host reads it."""
    chosen = profiles.resolve(ctx.host.spec, ctx.doc.args.profile)
    return dataclasses.replace(chosen, python=host_path(ctx.host, chosen.python))


def ensure_demo(ctx: Ctx) -> None:
    """Generate the demo on the host once, as `invoke serve --draft demo` does first."""
    folder = demo_dir(ctx.host.state_dir)
    known = ask_tool(ctx.host, "remote.drafter.demo_spec", [folder], timeout=60).data
    if not (isinstance(known, dict) and known.get("complete") is True):
        run_tool(ctx.host, "remote.drafter", ["demo", "--out", folder], name="demo", pull=False,
                 view=ctx.tracker).check()


def _plan(ctx: Ctx, k: int, topk: int = 1, draft_tokens: int | None = None) -> tuple[Any, profiles.Profile]:
    chosen = profile_of(ctx)
    baseline = k == 0
    # SGLang is given all three flags (a chain: topk 1, steps + 1 draft tokens), so it never picks its own
    tree = chosen.engine == "sglang" and not baseline
    # served as it is to be measured (--force: a verdict that says MISMATCH is the user's to fix first)
    request = Request(draft=None if baseline else (DEMO if ctx.demo else ctx.doc.args.draft), baseline=baseline,
                      profile=ctx.doc.args.profile, port=ctx.doc.args.port, force=True,
                      steps=None if baseline else k, target=DEMO if baseline and ctx.demo else None,
                      topk=topk if tree else None, draft_tokens=(draft_tokens or k + 1) if tree else None)
    served = resolve(request, chosen, demo_dir(ctx.host.state_dir),
                     demo_baseline=ctx.demo and ctx.host.spec.transport == "local" and chosen.builtin)
    return served, chosen


def measure(ctx: Ctx, step: Step, k: int, concurrencies: list[int], seen: dict[str, float]) -> None:
    """Serve with ``k`` draft tokens (on SGLang: ``k`` steps, the step's topk and draft tokens), bench it
    at each of ``concurrencies``, stop it; the benches land in ``step.outcome['benches']`` (concurrency →
    run, tok/s, accept length, per position, and on SGLang the setting the server reported)."""
    serve_plan, chosen = _plan(ctx, k, step.topk, step.draft_tokens)
    step.outcome["benches"] = {}
    with _serving(ctx, step, k, serve_plan, chosen, seen) as server:
        for c in concurrencies:
            t0 = time.monotonic()
            res = _bench(ctx, step, k, server, c)
            seen["bench"] = time.monotonic() - t0
            step.outcome["benches"][str(c)] = bench_outcome(res)
            ctx.save()


@contextmanager
def _serving(ctx: Ctx, step: Step, k: int, serve_plan: Any, chosen: profiles.Profile,
             seen: dict[str, float]) -> Iterator[lifecycle.Server]:
    host = ctx.host
    if serve_plan.demo:
        ensure_demo(ctx)
    launch = serve_plan.launch
    facts = checks.refused_or_facts(host, serve_plan, chosen.settings.env, ctx.runs_dir, capture=False)
    ctx.doc.engine = serve_plan.engine.name
    lifecycle.make_room(host, serve_plan)
    t0 = time.monotonic()
    server = lifecycle.launch(host, serve_plan, dict(chosen.settings.env))
    ran(step, server.run_id)
    entry: dict[str, Any] = {"run_id": server.run_id, "port": server.port, "k": k, "step": step.name,
                             "state": "starting", "token": server.entry.get("token"),
                             "job": f"serve-{serve_plan.engine.name}-{server.port}"}
    ctx.doc.servers.append(entry)
    ctx.save()
    record = {"run_id": server.run_id, "engine": serve_plan.engine.name, "engine_version": facts.engine.version,
              "target": launch.target, "draft": launch.draft,
              "asked": {"profile": chosen.name, "port": server.port, "steps": launch.steps, "baseline": k == 0,
                        "max_running_requests": launch.max_running_requests, "tune": ctx.doc.tune_id}}
    try:
        ctx.say(f"  serving K={k} on port {server.port} (run {server.run_id}); waiting until it answers"
                if k else f"  serving the baseline on port {server.port} (run {server.run_id})")
        readback, ready_s = lifecycle.ready_recorded(
            host, serve_plan, server, entry, t0,
            lambda state, effective, ready_s: _record_serve(
                ctx, {**record, "effective": effective, "state": state, "ready_s": ready_s}))
        seen["serve"] = ready_s
        step.outcome.update({"serve_run": server.run_id, "ready_s": round(ready_s, 1),
                             "effective": {k_: v for k_, v in readback.effective.items() if not k_.startswith("_")}})
        ctx.say(f"  ready in {ready_s:.0f} s")
        yield server
    finally:
        stop_server(ctx, entry)


def _record_serve(ctx: Ctx, rec_args: dict[str, Any]) -> None:
    records.keep(ctx.host.project_root, f"serve run {rec_args.get('run_id')}",
                 lambda rev: records.serve_record(host=ctx.host.name, draft_digest=None, git_rev=rev, **rec_args),
                 ctx.warn)


def stop_server(ctx: Ctx, entry: dict[str, Any]) -> None:
    """Stop a server this tune started (its run on its port, the registry's token the start held),
    however far it came; one the host records as another's is left alone, said."""
    def not_ours(server: lifecycle.Server | None) -> str | None:
        if server is not None and (server.port != entry["port"] or
                                   (entry.get("token") and server.entry.get("token") != entry["token"])):
            return (f"left alone: run {entry['run_id']} is registered as another call's server on port "
                    f"{server.port} ({ctx.folder / 'tune.json'} says otherwise: it was edited).")
        return None

    lifecycle.stop_recorded(ctx.host, entry, not_ours=not_ours, kill_unregistered=entry["run_id"] in ctx.doc.runs(),
                            save=ctx.save, warn=ctx.warn)


def _bench(ctx: Ctx, step: Step, k: int, server: lifecycle.Server, concurrency: int) -> BenchResult:
    from draftops.bench import session
    settings = plan.bench_settings(concurrency, ctx.demo)
    return session.run_kept(
        ctx.host, settings, port=server.port, name=f"tune-k{k}-c{concurrency}",
        given={**settings, "tune": ctx.doc.tune_id}, view=ctx.tracker, noted=lambda run_id: ran(step, run_id),
        say=ctx.say, warn=ctx.warn,
        intro=f"  bench at concurrency {concurrency}: {settings['prompts']} prompts × {settings['repeats']} repeats")


def bench_outcome(res: BenchResult) -> dict[str, Any]:
    tput = res.metrics.output_throughput
    per = res.per_position
    return {"bench_run": res.run_id, "tok_s": tput.median, "values": list(tput.values),
            "accept_length": res.accept_length.value if res.accept_length else None,
            "per_position": per.model_dump() if per is not None else None,
            "served": _served_setting(res)}


def _served_setting(res: BenchResult) -> list[int] | None:
    """SGLang's [steps, topk, draft tokens] as the server reported them (/get_server_info), else None."""
    spec = res.speculative
    if res.engine.name != "sglang" or spec is None or None in (spec.num_steps, spec.topk, spec.num_draft_tokens):
        return None
    return [int(spec.num_steps or 0), int(spec.topk or 0), int(spec.num_draft_tokens or 0)]


def as_measured(step: Step) -> list[tuple[int, dict[str, Any]]]:
    """(concurrency, bench outcome) of a measuring step, in concurrency order."""
    benches = step.outcome.get("benches") or {}
    return sorted(((int(c), b) for c, b in benches.items() if isinstance(b, dict)), key=lambda cb: cb[0])

