"""``invoke bench``'s two ends around the job on the host: the job's input (the plan, the server to
watch, which snapshots to take) and the result built from the run folder once it is home.

The job itself is ``remote.bench.runner``. Everything measured is read back here from the files
it wrote, with the parsers in ``remote.bench`` (the same ones the tests feed the engines' real
formats), so a run whose server died half-way still gives a result, marked ``failed``, from the
repeats that finished.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, TypeVar

from draftops.bench import plan as planning
from draftops.bench import result as bench_result
from draftops.bench.result import BenchResult, DraftInfo, EngineInfo, HostFacts, Repeat, Settings, Speculative
from draftops.documents import Document, parse
from draftops.documents.bench_run import HostDoc, RunnerDoc
from draftops.errors import BenchError, DocumentError
from draftops.history import now_iso
from remote import jsonread
from remote.bench import client_output, decode_log, server_metrics
from remote.bench.errors import BenchParseError
from remote.bench.runner import CLIENT_PATH_VAR, HOST_FILE, RUN_DIR_TOKEN, RUNNER_FILE
from remote.eagle import acceptlength

__all__ = ["CLIENT_PATH_VAR", "RUN_DIR_TOKEN", "ServedBy", "build", "from_plan", "job_plan", "plan_json"]

#: server snapshots taken once at the start of a run (file -> path), per engine
SNAPSHOTS = {"vllm": {"server-version.json": "/version", "server-models.json": "/v1/models",
                      "metrics-start.prom": "/metrics"},
             "sglang": {"server-info.json": "/get_server_info", "server-models.json": "/get_model_info"}}


@dataclasses.dataclass(frozen=True)
class ServedBy:
    """The server the benchmark talks to, as ``invoke serve`` registered it on the host."""

    engine: str
    port: int
    base_url: str
    python: str
    target: str
    draft: str | None
    pid: int | None
    log: str                       # the server job's log on the host
    run_id: str
    effective: dict[str, Any]
    asked: dict[str, Any]


def job_plan(bench: planning.BenchPlan, served: ServedBy) -> dict[str, Any]:
    """The JSON the job runs (``remote.bench.runner --plan-json``); paths say ``@RUN_DIR@``."""
    doc = dataclasses.asdict(bench)
    return {"engine": served.engine, "python": served.python, "target": served.target, "draft": served.draft,
            "repeats": bench.settings.repeats, "prepare": [list(p) for p in bench.prepare],
            "steps": [{**step, "argv": list(step["argv"])} for step in doc["steps"]],
            "snapshots": SNAPSHOTS[served.engine],
            "server": {"base_url": served.base_url, "pid": served.pid, "log": served.log, "run_id": served.run_id},
            # what `invoke bench.collect` needs to build the result later (the runner ignores it)
            "collect": {"settings": dataclasses.asdict(bench.settings), "dataset_kind": bench.dataset_kind,
                        "warnings": list(bench.warnings), "served": dataclasses.asdict(served)}}


def from_plan(doc: Any, run_id: str) -> tuple[planning.BenchPlan, ServedBy]:
    """The plan and server of a bench run, read back from its plan.json (``job_plan`` as the host
    wrote it), for a result built after `invoke bench` was interrupted."""
    part = doc.get("collect") if isinstance(doc, dict) else None
    if not isinstance(part, dict):
        raise BenchError(f"Run {run_id}'s plan.json does not hold what its result is built from (missing, damaged, "
                         "or written by a draftops from before `bench.collect`); its files are in runs/"
                         f"{run_id}/, and `invoke bench` measures again.")
    try:
        served = ServedBy(**part["served"])
        bench = planning.BenchPlan(engine=served.engine, settings=planning.BenchSettings(**part["settings"]),  # type: ignore[arg-type]
                                   dataset_kind=part["dataset_kind"], prepare=[], steps=[],
                                   warnings=[str(w) for w in part["warnings"]])
    except (KeyError, TypeError) as exc:
        raise BenchError(f"Run {run_id}'s plan.json cannot be read back ({type(exc).__name__}: {exc}); its files "
                         f"are in runs/{run_id}/, and `invoke bench` measures again.") from None
    if served.engine not in SNAPSHOTS:
        raise BenchError(f"Run {run_id}'s plan.json names engine {served.engine!r}, not one of {sorted(SNAPSHOTS)}.")
    return bench, served


#: the plan reaches the host as one argument of the job's command line, which Linux caps at 128 KiB
#: (MAX_ARG_STRLEN); this leaves room for the rest of the line and its quoting
PLAN_MAX_BYTES = 110_000


def plan_json(bench: planning.BenchPlan, served: ServedBy) -> str:
    """:func:`job_plan` as the ``--plan-json`` text, refused when it cannot be one argument (each repeat
    adds its steps, so many repeats overflow the limit and the host could not even start the job)."""
    text = json.dumps(job_plan(bench, served))
    size = len(text.encode())
    if size > PLAN_MAX_BYTES:
        repeats = bench.settings.repeats
        per_repeat = size / max(repeats + 1, 1)           # the warm-up is one step more
        fit = max(int(PLAN_MAX_BYTES / per_repeat) - 1, 1)
        raise BenchError(f"--repeats {repeats} makes a bench plan of {size} bytes, and the job's command line "
                         f"holds it as one argument, which Linux caps at 128 KiB: at most about {fit} repeats "
                         "fit. Use fewer repeats (and more --prompts per repeat for the same sample).")
    return text


def _read_json(path: Path) -> Any:
    try:
        return jsonread.load(path)
    except (OSError, ValueError):
        return None


D = TypeVar("D", bound=Document)


def _run_file(model: type[D], path: Path, problems: list[str], given: Any = None) -> D | None:
    """A file the job wrote (``given``: as the caller read it already), read once into ``model``; None
    when it is missing or no JSON (a run cut off leaves none), and when it fails its model: then
    ``problems`` says which field, since the result is still built from the repeats that finished."""
    doc = given if isinstance(given, dict) else _read_json(path)
    if doc is None:
        return None
    try:
        return parse(model, doc, path)
    except DocumentError as exc:
        problems.append(str(exc))
        return None


def _text(path: Path) -> str | None:
    """A pulled text file (server metrics, a log slice, the client's output), bounded: a regular file
    of at most ``jsonread.MAX_JSON`` bytes; None when it is missing, odd or larger (a file of its kind
    never is: the parsers then report it as absent)."""
    try:
        return jsonread.read_bounded(path).decode(errors="replace")
    except (OSError, ValueError):
        return None


def _local(folder: Path, host_path: str) -> Path:
    """A file the job wrote into its run folder, in the pulled copy."""
    return folder / Path(host_path.replace(RUN_DIR_TOKEN + "/", "")).name


@dataclasses.dataclass
class _Measured:
    records: list[client_output.ClientRecord | None]
    server: list[float | None]
    source: str | None
    repeats: list[Repeat]
    problems: list[str]
    server_info: dict[str, Any] | None
    windows: list[server_metrics.WindowAccept | None] = dataclasses.field(default_factory=list)


def _server_side(engine: str, folder: Path, step: dict[str, Any], out: _Measured, name: str) -> float | None:
    """The server's accept length over one repeat; notes its source, SGLang's server info and vLLM's
    /metrics window (its per-position counts) in ``out``."""
    if engine == "vllm":
        window = _metrics_window(folder, out.problems, name)
        out.windows.append(window)
        if window is None:
            return None
        out.source = out.source or "metrics window"
        return window.value
    value, source, info = _server_accept(engine, folder, step, out.problems, name)
    out.windows.append(None)
    out.source = out.source or source
    out.server_info = info or out.server_info
    return value


def _metrics_window(folder: Path, problems: list[str], name: str) -> server_metrics.WindowAccept | None:
    """vLLM's /metrics counters over one repeat (accept length and per position); None without both pages."""
    before = _text(folder / f"metrics-before-{name}.prom")
    after = _text(folder / f"metrics-after-{name}.prom")
    if before is None or after is None:
        return None
    try:
        return server_metrics.accept_length_window(server_metrics.spec_counters(before),
                                                   server_metrics.spec_counters(after))
    except BenchParseError as exc:
        problems.append(f"{name}: {exc}")
        return None


def _server_accept(engine: str, folder: Path, step: dict[str, Any], problems: list[str], name: str
                   ) -> tuple[float | None, str | None, dict[str, Any] | None]:
    """The server's own accept length over one repeat (SGLang), and where it came from."""
    info = _read_json(folder / f"server-info-{name}.json")
    log = _text(folder / step["log_slice"]) if step.get("log_slice") else None
    if log:
        summary = decode_log.parse_log(log)
        if summary.truncated:
            problems.append(f"{name}: the server log ends mid-line (not counted): {summary.truncated[:120]}")
        if summary.accept_length is not None:
            return summary.accept_length, "decode log", info
    if isinstance(info, dict) and "--flush-cache" not in step.get("argv", ()):
        # no flush before this repeat: avg_spec_accept_length counts every request since the server started
        problems.append(f"{name}: {acceptlength.SGLANG_CUMULATIVE}; the decode log had no accept len either, so "
                        "the server side of this repeat is left out")
        return None, None, info
    if isinstance(info, dict):
        try:
            return server_metrics.server_info_accept_length(info), "server info", info
        except BenchParseError as exc:
            problems.append(f"{name}: {exc}")
    return None, None, info if isinstance(info, dict) else None


def measure(engine: str, folder: Path, job: dict[str, Any], done: set[str]) -> _Measured:
    """Parse every measured repeat the job finished (``done``: their step names)."""
    out = _Measured([], [], None, [], [], None)
    for step in job["steps"]:
        if step["kind"] != "repeat":
            continue
        name = f"rep{step['index']}"
        rec, value, problems_here = None, None, []
        path = _local(folder, step["output"])
        text = _text(path)
        if name in done and text is not None:
            parsed = client_output.parse(engine, text)
            problems_here = parsed.problems
            rec = parsed.last
            value = _server_side(engine, folder, step, out, name)
        else:
            out.windows.append(None)
            if name in done:
                out.problems.append(f"{name}: the client wrote no result file {path.name}")
        for p in problems_here:
            out.problems.append(f"{name}: {path.name} line {p.get('line')}: {p.get('message')}")
        out.records.append(rec)
        out.server.append(value)
        if name in done or text is not None:
            window = out.windows[-1]
            out.repeats.append(Repeat(index=step["index"], client_file=path.name if text is not None else None,
                                      record=rec.to_dict() if rec else None, server_accept=value,
                                      server_per_position=window.per_position if window else None,
                                      problems=problems_here))
    return out


#: the effective speculative settings as Speculative holds them: field -> (type, server-info key, read-back key)
_SPEC_FIELDS = {"algorithm": (str, "speculative_algorithm", "algorithm"),
                "num_steps": (int, "speculative_num_steps", "num_steps"),
                "topk": (int, "speculative_eagle_topk", "topk"),
                "num_draft_tokens": (int, "speculative_num_draft_tokens", "num_draft_tokens")}


def typed(value: Any, kind: type, where: str, problems: list[str]) -> Any:
    """``value`` when it is a ``kind`` (a bool is no number) or None; else None and a note: a server
    answering a string, a list or junk for a setting must not stop the result from being written."""
    if value is None or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    wanted = "a number" if kind is int else "text"
    problems.append(f"{where} is {type(value).__name__} {ascii(value)[:80]}, not {wanted}; left out of the result")
    return None


def _speculative(served: ServedBy, info: dict[str, Any] | None, problems: list[str]) -> Speculative | None:
    if not served.draft:
        return None
    if served.engine == "sglang":
        eff = server_metrics.effective_speculative(info) if info else (served.effective or {})
        source = "/get_server_info" if info else "serve's read-back"
        keys = {name: (kind, info_key if info else readback_key) for name, (kind, info_key, readback_key)
                in _SPEC_FIELDS.items()}
        got = {name: typed(eff.get(key), kind, f"{source} {key}", problems) for name, (kind, key) in keys.items()}
        return Speculative(**got, asked=served.asked)
    eff = served.effective or {}
    steps = typed(eff.get("num_speculative_tokens"), int, "serve's read-back num_speculative_tokens", problems)
    steps = steps or typed(served.asked.get("num_speculative_tokens"), int, "asked num_speculative_tokens", problems)
    method = typed(eff.get("method"), str, "serve's read-back method", problems) or served.asked.get("method")
    return Speculative(algorithm=method if isinstance(method, str) else None, num_steps=steps, topk=1,
                       num_draft_tokens=steps, asked=served.asked)


def _draft(served: ServedBy, facts: HostDoc) -> DraftInfo | None:
    if not served.draft:
        return None
    seen = facts.inspect.draft if facts.inspect else None
    native = seen.native_engine if seen else None
    ids = seen.ids_by_engine.get(native) if seen and native else None
    return DraftInfo(path=served.draft, digest=facts.draft_digest, format=seen.format if seen else None,
                     layer_ids=ids, layer_id_convention=native if native in ("sglang", "vllm") else None)


def _max_running(served: ServedBy, info: dict[str, Any] | None) -> int | None:
    if info and isinstance(info.get("max_running_requests"), int):
        return int(info["max_running_requests"])
    eff = served.effective or {}
    value = eff.get("max_running_requests", eff.get("max_num_seqs"))
    if value is None:
        value = served.asked.get("max_running_requests", served.asked.get("max_num_seqs"))
    return int(value) if isinstance(value, int) else None


def _status(runner: RunnerDoc | None, job_state: str | None) -> tuple[str, str | None]:
    """succeeded (the runner said so and the job ended so) or failed, and why it failed."""
    failure = runner.failure if runner else None
    if runner and runner.status == "succeeded" and job_state == "succeeded":
        return "succeeded", failure
    if not failure:
        failure = (f"the bench job ended {job_state} before it finished (no runner.json)" if runner is None
                   else f"the bench job ended {job_state}")
    return "failed", failure


def build(*, run_id: str, host: str, folder: Path, job: dict[str, Any], bench: planning.BenchPlan,
          served: ServedBy, job_state: str | None, runner_doc: Any = None) -> BenchResult:
    """The bench result of a pulled run folder (succeeded, or failed with what was written);
    ``runner_doc`` is its runner.json when the caller read it already (``ToolResult.data``)."""
    unread: list[str] = []
    runner = _run_file(RunnerDoc, folder / RUNNER_FILE, unread, runner_doc)
    facts = _run_file(HostDoc, folder / HOST_FILE, unread) or HostDoc()
    got = measure(served.engine, folder, job, runner.done if runner else set())
    status, failure = _status(runner, job_state)
    inspected = facts.inspect
    info = got.server_info or (_read_json(folder / "server-info.json") if served.engine == "sglang" else None)
    info = info if isinstance(info, dict) else None     # 200 with JSON that is no object: not SGLang's answer
    settings = bench.settings
    warnings = list(bench.warnings) + unread + got.problems
    accept = (bench_result.build_accept(got.records, got.server, got.source, engine=served.engine)
              if served.draft else None)
    positions = bench_result.build_per_position(served.engine, got.records, got.windows) if served.draft else None
    if accept and accept.cross_check and accept.cross_check.get("agree") is False:
        warnings.append(str(accept.cross_check.get("message")))
    files = {"plan": "plan.json", "runner": RUNNER_FILE, "host facts": HOST_FILE}
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.name.startswith(("client-", "metrics-", "server-")):
            files[path.stem] = path.name
    return BenchResult(
        run_id=run_id, time=((runner.ended or runner.started) if runner else None) or now_iso(), status=status,
        failure=failure,
        host=HostFacts(name=host, gpu=facts.gpu, driver=facts.driver, cuda=facts.cuda, cpu=facts.cpu),
        engine=EngineInfo(name=served.engine, version=inspected.engine.version if inspected else None),
        target=served.target, draft=_draft(served, facts), speculative=_speculative(served, info, warnings),
        patch_state=inspected.sglang.state if inspected and inspected.sglang else None,
        settings=Settings(dataset=settings.dataset or ("random" if served.engine == "vllm" else "random-ids"),
                          dataset_kind=bench.dataset_kind, prompts=settings.prompts, repeats=settings.repeats,
                          concurrency=settings.concurrency, input_len=settings.input_len,
                          output_len=settings.output_len, seed=settings.seed, temperature=float(settings.temperature),
                          request_rate=settings.request_rate, max_running_requests=_max_running(served, info),
                          warmup=settings.warmup, ignore_eos=settings.dataset is None,
                          chat_template=settings.chat_template),
        metrics=bench_result.build_metrics(got.records), accept_length=accept, per_position=positions,
        repeats=got.repeats,
        warnings=warnings, files=files)
