"""`invoke bench`'s flow on the host, as serve's is in serve/lifecycle.py: find the server `invoke serve`
started, plan the engine's own client against it, run the plan as one job (``remote.bench.runner``)
and build ``bench-result.json`` from the run folder once it is home; ``collect`` finishes a run whose
`invoke bench` was interrupted the same way. The task only turns flags into ``BenchSettings`` and
shows what comes back: the plan's warnings, the summary, the history row.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftops import records
from draftops.bench import plan as planning
from draftops.bench import result as bench_result
from draftops.bench import runner
from draftops.bench.result import BenchResult
from draftops.errors import BenchError
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.tools import JobView, call_tool, follow, run_tool
from draftops.serve import engines, hosttool, lifecycle, profiles

DEMO_DATASET = "demo"
LIVE_STATES = ("starting", "running")


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A benchmark checked and planned, not started: the plan, the server it measures, the job's env."""

    plan: planning.BenchPlan
    served: runner.ServedBy
    env: dict[str, str]


@dataclasses.dataclass(frozen=True)
class Finished:
    """A bench run's result, written into its run folder here."""

    result: BenchResult
    folder: Path


def live_server(host: Host, port: int | None) -> lifecycle.Server:
    """The server `invoke serve` registered on ``port`` (or the only one); refused unless it runs."""
    server = lifecycle.find(host, port)
    if not server.alive:
        raise BenchError(f"The {server.engine} server on port {server.port} of host {host.name!r} is {server.state} "
                         f"(run {server.run_id}); start it again with `invoke serve`, then bench.")
    return server


def _engine(host: Host, server: lifecycle.Server) -> tuple[str, dict[str, str]]:
    """The python that runs the server's engine, and its serve profile's environment."""
    profile = profiles.resolve(host.spec, server.profile)
    return str(server.entry.get("python") or profile.python), {k: str(v) for k, v in profile.settings.env.items()}


def _limits(host: Host, server: lifecycle.Server) -> planning.ServerLimits:
    """The lengths the running server takes (its own answer, else what serve read back)."""
    def fetch(path: str, body: Any) -> tuple[int | None, str]:
        return hosttool.http(host, server.port, path, body, server.reach)

    context, longest, source = engines.get(server.engine).limits(fetch, server.effective or {})
    return planning.ServerLimits(context, longest, f"the {server.engine} server on port {server.port}: {source}")


def _probe(host: Host, python: str, engine: str, env: dict[str, str]) -> dict[str, Any]:
    """``python -m remote.bench.probe ENGINE`` with the engine's python on the host (only the serve
    profile's PYTHONPATH reaches it)."""
    extra = {"PYTHONPATH": env["PYTHONPATH"]} if env.get("PYTHONPATH") else {}
    answer: dict[str, Any] = call_tool(host, "remote.bench.probe", [engine], python=python, env=extra, timeout=60,
                                       error=BenchError, missing="Install the engine there (`invoke env.setup`).")
    return answer


def _demo_dataset(host: Host) -> str:
    """Prompts in the demo's language, written once per host next to the demo (see docs/bench.md)."""
    path = f"{host.state_dir}/demo/bench-prompts.jsonl"    # the demo build writes it (else made here, once)
    try:
        call_tool(host, "remote.bench.demo_prompts", [f"{host.state_dir}/demo", path], python=host.spec.interpreter,
                  timeout=120, error=BenchError)
    except BenchError as exc:
        raise BenchError(f"{exc} Generate the demo first (`invoke test-drafter` or `invoke serve --draft "
                         "demo`).") from None
    return path


def _served_by(host: Host, server: lifecycle.Server, python: str) -> runner.ServedBy:
    """The server as the job and the result describe it (address as seen from the host itself)."""
    base_url = f"http://{hosttool.probe_address(server.reach)}:{server.port}"
    return runner.ServedBy(engine=server.engine, port=server.port, base_url=base_url, python=python,
                           target=server.target, draft=server.draft, pid=server.pid,
                           log=f"{host.runs_dir}/{server.run_id}/log", run_id=server.run_id,
                           effective=server.effective or {}, asked=server.asked)


def _job_env(env: dict[str, str]) -> dict[str, str]:
    """The profile's environment for the job; its PYTHONPATH reaches the client only (the runner itself
    runs the synced code), so it travels under ``runner.CLIENT_PATH_VAR``."""
    job_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    if env.get("PYTHONPATH"):
        job_env[runner.CLIENT_PATH_VAR] = env["PYTHONPATH"]
    return job_env


def prepare(host: Host, settings: planning.BenchSettings, *, port: int | None,
            dataset_path: str | None = None) -> Prepared:
    """Check ``settings`` against the running server and plan the client's runs; on the host only quick
    reads happen (the registry, the server's limits, the client probe). ``dataset_path``: the
    ``--dataset`` the user typed, as the host reads it (``demo`` is made here)."""
    server = live_server(host, port)
    python, env = _engine(host, server)
    settings.validate()
    settings.check_fits(_limits(host, server))
    client = planning.Client.from_probe(_probe(host, python, server.engine, env), python=python)
    if settings.dataset is not None:
        where = _demo_dataset(host) if settings.dataset == DEMO_DATASET else dataset_path
        settings = dataclasses.replace(settings, dataset=where)
    served = _served_by(host, server, python)
    target = planning.Server(served.base_url, server.target, server.target, bool(server.draft))
    plan = planning.plan(client, target, settings, runner.RUN_DIR_TOKEN)
    plan.warnings += _chat_warning(host, server.draft, settings, server.engine)
    return Prepared(plan, served, _job_env(env))


def _chat_warning(host: Host, draft: str | None, settings: planning.BenchSettings, engine: str) -> list[str]:
    """The draft's latest test-drafter report against the bench's prompts: chat-formatted dumps and raw
    prompts (or the other way round) measure the draft on text it was not trained on."""
    from draftops.serve import verdicts
    verdict = verdicts.latest(host.project_root / "runs", draft) if draft else None
    advice = planning.chat_advice(verdict.chat_formatted, settings.chat_template, engine, verdict.run_id) \
        if verdict else None
    return [advice] if advice else []


def run(host: Host, prepared: Prepared, *, name: str | None, given: dict[str, Any], view: JobView) -> Finished:
    """Run the plan as one detached job followed into ``view``, bring its folder home and write its
    result there (also for a failed run: what was measured until then)."""
    served = prepared.served
    done = run_tool(host, "remote.bench.runner", ["--plan-json", runner.plan_json(prepared.plan, served)],
                    name=f"bench-{name or served.engine}", view=view, task="bench",
                    given={**given, "port": served.port}, env=prepared.env)
    folder = done.folder or host.project_root / "runs" / done.run_id
    res = runner.build(run_id=done.run_id, host=host.name, folder=folder, job=runner.job_plan(prepared.plan, served),
                       bench=prepared.plan, served=served, job_state=done.state, runner_doc=done.data)
    bench_result.write(res, folder)
    return Finished(res, folder)


def run_kept(host: Host, settings: dict[str, Any], *, port: int, name: str, given: dict[str, Any], view: JobView,
             intro: str, noted: Callable[[str], None], say: Callable[[str], None],
             warn: Callable[[str], None]) -> BenchResult:
    """Bench the server on ``port`` once as a step of a larger command (the doctor, the tune) does:
    plan it, say ``intro``, run it, note its run id (``noted``) and keep its history row, refuse a failed
    run (BenchError, naming its folder), and say its throughput and accept length."""
    prepared = prepare(host, planning.BenchSettings(**settings), port=port)
    say(intro)
    done = run(host, prepared, name=name, given=given, view=view)
    res = done.result
    noted(res.run_id)
    records.keep(host.project_root, f"run {res.run_id}", lambda rev: bench_result.bench_record(res, git_rev=rev),
                 warn)
    if res.status != "succeeded":
        raise BenchError(f"bench run {res.run_id} failed: {res.failure} What was written is in {done.folder}.")
    tput = res.metrics.output_throughput
    acc = res.accept_length.value if res.accept_length else None
    say(f"  {tput.median or 0:.1f} tok/s (repeats {tput.min or 0:.1f}–{tput.max or 0:.1f})"
        + (f", accept length {acc:.2f}" if acc is not None else ""))
    return res


def _plan_doc(folder: Path) -> Any:
    """The run's plan.json as the host wrote it; None when missing or damaged (``from_plan`` says so)."""
    try:
        return json.loads((folder / "plan.json").read_text())
    except (OSError, ValueError):
        return None


def collect(host: Host, run_id: str, view: JobView) -> Finished:
    """Follow bench run ``run_id`` to its end (into ``view``, when it still runs), bring it home and
    write its result, as ``run`` would have."""
    row = jobs.status(host, run_id)
    if row.get("task") != "bench":
        raise BenchError(f"Run {run_id} on host {host.name!r} is a {row.get('task') or row.get('name') or 'job'} run, "
                         "not a bench run; `invoke runs` shows what each run is.")
    final = follow(host, run_id, view) if row.get("state") in LIVE_STATES else row
    folder = jobs.pull_run(host, run_id).path
    doc = _plan_doc(folder)
    bench, served = runner.from_plan(doc, run_id)
    res = runner.build(run_id=run_id, host=host.name, folder=folder, job=doc, bench=bench, served=served,
                       job_state=final.get("state"))
    bench_result.write(res, folder)
    return Finished(res, folder)
