"""`invoke bench`: benchmark the server `invoke serve` started, with the engine's own client on the
host, and bring everything home into runs/<id>/; `invoke bench.compare`: two benchmark runs side by
side with test-drafter's prediction, and what follows from them."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from invoke import Context
from invoke.exceptions import Exit

from draftops import history, records
from draftops.cli.common import HOST_HELP, connect, ensure_code, friendly, live, project_root, warn
from draftops.cli.jsonout import JSON_HELP, answer, json_output
from draftops.cli.options import MAX_PENDING, MAX_PENDING_HELP, WHOLE, Number, task
from draftops.console import console, escape
from draftops.errors import BenchError
from draftops.link.host import Host
from draftops.runs import jobs
from draftops.runs.hostfiles import host_path

if TYPE_CHECKING:   # the bench modules load pydantic: only when a bench task runs
    from draftops.bench.session import Finished

TOLERANCE = 0.10        # draftops.bench.compare.TOLERANCE; the bench modules load when the task runs


def run_folder(root: Path, ref: str) -> Path:
    """A run id (its folder under runs/) or a path to a run folder or bench-result.json."""
    given = Path(ref).expanduser()
    if given.exists():
        return given
    if "/" in ref or ref.startswith(".") or not ref.strip():
        raise BenchError(f"{ref!r} is neither a run id nor an existing run folder; `invoke runs --local --kind "
                         "bench` lists the benchmark runs.")
    return root / "runs" / ref


@task(help={"run_a": "run A: a bench run id or folder (default: the latest baseline of run B's host, "
                     "engine and target)",
            "run_b": "run B: a bench run id or folder (default: the latest speculative run)",
            "host": "pick the default pair among this host's runs only",
            "tolerance": "how far measured may be from predicted accept length, as a fraction (default 0.10)",
            "json": JSON_HELP},
      options={"tolerance": Number(float, 0, 1, inclusive=False,
                                   refusal="{flag} {value} must be a fraction between 0 and 1, e.g. 0.10.")})
@json_output("bench.compare")
@friendly
def compare(c: Context, run_a: str | None = None, run_b: str | None = None, host: str | None = None,
            tolerance: float = TOLERANCE, json: bool = False) -> None:
    """Compare two bench runs (default: the latest baseline and the latest speculative run of the same
    host, engine and target) against test-drafter's predicted accept length; writes
    runs/<id>/compare.{md,json,png}."""
    from draftops.bench import compare as comparing
    from draftops.bench import outputs, render, result
    if bool(run_a) != bool(run_b):
        raise Exit("error: give both --run-a and --run-b (two bench run ids), or neither for the default pair.",
                   code=1)
    root = project_root(c)
    hist = history.for_project(root)
    if not run_a or not run_b:
        run_a, run_b = comparing.default_pair(hist, host)
    runs = [result.load(run_folder(root, ref)) for ref in (run_a, run_b)]
    if runs[0].run_id == runs[1].run_id:
        raise BenchError(f"--run-a and --run-b are the same run ({runs[0].run_id}); give two different runs.")
    predictions = {r.run_id: comparing.find_prediction(hist, r) for r in runs}
    current = {r.run_id: comparing.current_config(hist, r) for r in runs}
    cmp = comparing.compare(runs[0], runs[1], predictions, tolerance, current)
    run_id = jobs.new_run_id("bench-compare")
    paths = outputs.write(cmp, root / "runs" / run_id)
    answer(history.json_safe(cmp.to_dict()), run_id)
    render.show(cmp, console)
    console.print(f"[dim]written: {paths['markdown']}, {paths['json'].name}, {paths['chart'].name}[/]")
    records.keep(root, "this comparison", lambda rev: comparing.compare_record(cmp, run_id, git_rev=rev), warn)


_RUN_HELP = {
    "name": "a name for the run (part of its run id)", "prompts": "prompts per measured repeat (default 100)",
    "concurrency": "requests in flight at once (default 1)",
    "input_len": "random prompts: tokens per prompt (default 128)", "output_len": "tokens to generate per "
    "prompt (default 128)", "dataset": "prompt JSONL on the host ({\"prompt\": ...} per line), or `demo` for "
    "prompts in the demo's language; default: random token ids", "repeats": "measured repeats after one "
    "warm-up (default 3)", "port": "the server's port (default: the only draftops server on the host)",
    "seed": "sampling seed of the client (default 0)",
    "temperature": "sampling temperature of every request (default 0: greedy); bench.compare holds the run "
                   "against test-drafter's prediction at this temperature (`invoke test-drafter --temperature T`)",
    "chat_template": "send every prompt through the target's chat template (vLLM: the chat endpoint; SGLang: "
                     "--apply-chat-template), as a chat-trained draft is served", "host": HOST_HELP,
    "max_pending": MAX_PENDING_HELP, "json": JSON_HELP}
TEMPERATURE = Number(float, 0.0, 100.0, refusal="{flag} must be a sampling temperature from 0 (greedy) to 100, "
                                                 "not {value}.")
_NUMBERS = ("prompts", "concurrency", "input_len", "output_len", "repeats", "port", "seed")


@task(default=True, help=_RUN_HELP, options={**dict.fromkeys(_NUMBERS, WHOLE), "max_pending": MAX_PENDING,
                                            "temperature": TEMPERATURE})
@json_output("bench")
@friendly
def run(c: Context, name: str | None = None, prompts: int | None = None, concurrency: int | None = None,
        input_len: int | None = None, output_len: int | None = None, dataset: str | None = None,
        repeats: int | None = None, port: int | None = None, seed: int | None = None,
        chat_template: bool = False, host: str | None = None, max_pending: float | None = None,
        json: bool = False, temperature: float | None = None) -> None:
    """Benchmark the server `invoke serve` started (greedy unless --temperature, fixed seed, a warm-up, then R
    repeats) with the engine's own client on the host; everything lands in runs/<id>/ and the local history."""
    from draftops.bench import plan as planning
    from draftops.bench import session
    host = connect(c, host, max_pending=max_pending)
    ensure_code(host)
    asked: dict[str, Any] = {"prompts": prompts, "concurrency": concurrency, "input_len": input_len,
                             "output_len": output_len, "dataset": dataset, "repeats": repeats, "seed": seed,
                             "chat_template": chat_template or None, "temperature": temperature}
    settings = planning.BenchSettings(**{k: v for k, v in asked.items() if v is not None})    # else its defaults
    prepared = session.prepare(host, settings, port=port, dataset_path=host_path(host, dataset))
    for warning in prepared.plan.warnings:
        console.print(f"[yellow]warning[/]: {escape(warning)}")
    given = {"name": name, "prompts": prompts, "concurrency": concurrency, "input_len": input_len,
             "output_len": output_len, "dataset": dataset, "repeats": repeats, "port": port, "seed": seed,
             "chat_template": chat_template, **({"temperature": temperature} if temperature is not None else {})}
    done = session.run(host, prepared, name=name, given=given, view=live("window", on_detach=COLLECT_HINT))
    _finish(host, done)


COLLECT_HINT = "When it has ended, `invoke bench.collect {run_id}` builds its result."


@task(help={"run_id": "the bench run (`invoke runs` lists them)", "host": HOST_HELP})
@friendly
def collect(c: Context, run_id: str, host: str | None = None) -> None:
    """Finish a bench run whose `invoke bench` was interrupted (Ctrl-C, a dropped link): follow it to its
    end, bring its folder home and build its result and history row, as `invoke bench` would have."""
    from draftops.bench import session
    host = connect(c, host)
    _finish(host, session.collect(host, run_id, live("window", announce=False)))


def _finish(host: Host, done: Finished) -> None:
    """Record the written result in the local history and show it; a failed run exits 1."""
    from draftops.bench import result as bench_result
    from draftops.bench import summary
    res, folder = done.result, done.folder
    records.keep(host.project_root, f"run {res.run_id}", lambda rev: bench_result.bench_record(res, git_rev=rev),
                 warn)
    answer(res.model_dump(mode="json", by_alias=True), res.run_id)
    summary.show(res, console)
    console.print(f"[dim]result: {folder / bench_result.RESULT_NAME}[/]")
    if res.status != "succeeded":
        raise Exit(f"error: bench run {res.run_id} failed: {res.failure} What was written is in {folder}.", code=1)
