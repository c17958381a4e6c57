"""Bench results built the way the runner builds them: the engines' real output formats (from
``tests.support.bench_formats``) go through the real parsers, ``build_metrics`` and ``build_accept``, and
the test only chooses the numbers (throughput per repeat, accept length, settings)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from draftops import records
from draftops.bench import result as bench_result
from draftops.bench.result import BenchResult, DraftInfo, EngineInfo, HostFacts, Repeat, Settings, Speculative
from draftops.documents import parse
from draftops.documents.drafter_report import DrafterReport
from draftops.history import History, RunRecord
from remote.bench import client_output, decode_log, server_metrics
from tests.support import bench_formats as fmt

DRAFTS = 400          # drafts per repeat in the synthetic counters


def _settings(**over: Any) -> Settings:
    base: dict[str, Any] = {"dataset": "/data/demo-prompts.jsonl", "dataset_kind": "text", "prompts": 20,
                            "repeats": 3, "concurrency": 4, "output_len": 128, "seed": 0, "temperature": 0.0,
                            "max_running_requests": 8, "ignore_eos": False}
    return Settings(**{**base, **over})


def vllm_run(run_id: str, *, tok_s: list[float], accept: float | None = None, draft: DraftInfo | None = None,
             steps: int = 3, time: str = "2026-11-30T10:00:00Z", host: str = "local",
             server_accept: float | None = None, status: Literal["succeeded", "failed"] = "succeeded",
             failure: str | None = None, per_pos: list[float] | None = None,
             version: str = "0.32.0+cpu", **settings: Any) -> BenchResult:
    """A vLLM bench run: one ``--save-result`` JSON and a /metrics pair per repeat.

    ``accept`` sets the client's spec-decode deltas, ``server_accept`` (default: the same) the
    /metrics window, so a test can make the two disagree. ``per_pos``: the share of drafts accepted
    at each position (cumulative, as vLLM counts it), in both the client's JSON and the counters;
    ``accept`` then defaults to 1 + their sum.
    """
    recs, server, repeats, windows = [], [], [], []
    if per_pos is not None and accept is None:
        accept = 1 + sum(round(share * DRAFTS) for share in per_pos) / DRAFTS
    server_accept = accept if server_accept is None else server_accept
    for i, tput in enumerate(tok_s):
        spec = None
        window = None
        if accept is not None and server_accept is not None:
            counts = [round(share * DRAFTS) for share in per_pos or []]
            spec = {"drafts": DRAFTS, "draft_tokens": DRAFTS * steps, "accepted": round((accept - 1) * DRAFTS),
                    **({"per_pos": counts} if per_pos is not None else {})}
            base = 10_000.0 * i
            before = fmt.vllm_metrics_text(drafts=base, draft_tokens=base * steps, accepted=base,
                                           per_pos=[base] * len(counts))
            after = fmt.vllm_metrics_text(drafts=base + DRAFTS, draft_tokens=(base + DRAFTS) * steps,
                                          accepted=base + round((server_accept - 1) * DRAFTS),
                                          per_pos=[base + c for c in counts])
            window = server_metrics.accept_length_window(server_metrics.spec_counters(before),
                                                         server_metrics.spec_counters(after))
            server.append(window.value if window else None)
        windows.append(window)
        doc = fmt.vllm_bench_result(ttfts_ms=[80.0, 95.0, 300.0], tpots_ms=[1000 / tput] * 3,
                                    itls_ms=[900 / tput, 1000 / tput, 2000 / tput], output_tokens=round(tput * 10),
                                    duration=10.0, spec=spec)
        rec = client_output.parse_vllm(json.dumps(doc)).records[0]
        recs.append(rec)
        repeats.append(Repeat(index=i + 1, client_file=f"client-rep{i + 1}.json", record=rec.to_dict(),
                              server_accept=server[-1] if server else None,
                              server_per_position=window.per_position if window else None))
    return _result(run_id, "vllm", version, recs, server, "metrics window", repeats, draft=draft, steps=steps,
                   time=time, host=host, status=status, failure=failure, windows=windows, **settings)


def sglang_run(run_id: str, *, tok_s: list[float], accept: float | None = None, draft: DraftInfo | None = None,
               steps: int = 3, time: str = "2026-11-30T10:00:00Z", host: str = "gpu",
               version: str = "0.5.10", **settings: Any) -> BenchResult:
    """An SGLang bench run: one bench_serving JSONL record per repeat and the decode log lines."""
    recs, server, repeats = [], [], []
    for i, tput in enumerate(tok_s):
        info = fmt.sglang_server_info(accept_length=accept, steps=steps, draft_tokens=steps + 1,
                                      algorithm="EAGLE3" if draft else None, version=version)
        record = fmt.sglang_bench_record(ttfts_ms=[50.0, 60.0, 70.0], tpots_ms=[1000 / tput] * 3,
                                         itls_ms=[1000 / tput] * 3, output_tokens=round(tput * 10), duration=10.0,
                                         accept_length=accept, server_info=info)
        rec = client_output.parse_sglang(fmt.jsonl([record])).records[0]
        log = "".join(fmt.sglang_decode_line("0.5.6", running=4, accept_len=accept) + "\n" for _ in range(3))
        server.append(decode_log.parse_log(log).accept_length)
        recs.append(rec)
        repeats.append(Repeat(index=i + 1, client_file=f"client-rep{i + 1}.jsonl", record=rec.to_dict(),
                              server_accept=server[-1]))
    return _result(run_id, "sglang", version, recs, server, "decode log", repeats, draft=draft, steps=steps,
                   time=time, host=host, **settings)


def _result(run_id: str, engine: Literal["sglang", "vllm"], version: str, recs: list, server: list, source: str,
            repeats: list,
            *, draft: DraftInfo | None, steps: int, time: str, host: str,
            status: Literal["succeeded", "failed"] = "succeeded",
            failure: str | None = None, windows: list | None = None, **settings: Any) -> BenchResult:
    spec = Speculative(algorithm="eagle3", num_steps=steps, topk=1, num_draft_tokens=steps + 1) if draft else None
    return BenchResult(schema="draftops.bench-result/1", run_id=run_id, time=time, status=status, failure=failure,
                       host=HostFacts(name=host, gpu="cpu" if engine == "vllm" else "NVIDIA H200"),
                       engine=EngineInfo(name=engine, version=version), target="/m/target", draft=draft,
                       speculative=spec, settings=_settings(repeats=len(repeats), **settings),
                       metrics=bench_result.build_metrics(recs),
                       accept_length=bench_result.build_accept(recs, server if draft else [], source, engine=engine),
                       per_position=(bench_result.build_per_position(engine, recs, windows or [None] * len(recs))
                                     if draft else None),
                       repeats=repeats)


def save(project: Path, res: BenchResult, history: History | None = None) -> Path:
    """Write the run folder and its history row, as the runner will."""
    folder = bench_result.write(res, project / "runs" / res.run_id).parent
    (history or History(project / "runs" / "history.sqlite")).record(bench_result.bench_record(res, git_rev=None))
    return folder


def drafter_report(*, status: str, served: float, best: float, steps: int = 3, ckpt: str = "/m/draft",
                   configured: list[int] | None = None, fix: list[int] | None = None,
                   fix_vllm: list[int] | None = None, fmt_name: str = "speculators",
                   walk: tuple[float, float] | None = None,
                   cond: tuple[list[float], list[float]] | None = None) -> dict[str, Any]:
    """The keys of a ``draftops.drafter-report/1`` the history hook reads (see remote/drafter/report.py);
    ``cond``: the served and best layouts' cond_acc per step on the verifier basis."""
    metrics: dict[str, Any] = {}
    if cond:
        metrics = {"steps": steps, "basis": "verifier", "served": {"verifier": {"cond_acc": cond[0]}},
                   "best": {"verifier": {"cond_acc": cond[1]}}}
    return {"schema": "draftops.drafter-report/1", **({"metrics": metrics} if metrics else {}),
            "verdict": {"status": status, "fix_layer_ids": fix, "fix_layer_ids_vllm": fix_vllm,
                        "needs_capture_patch": bool(fix and -1 in fix), "message": "",
                        "serving_convention": "vllm" if fmt_name == "speculators" else "sglang"},
            "predicted_accept_length": {"steps": steps, "basis": "verifier", "served": served, "best": best,
                                        "value": served,
                                        **({"walk": {"served": walk[0], "best": walk[1]}} if walk else {})},
            "checkpoint": {"format": fmt_name, "path": ckpt, "config_path": f"{ckpt}/config.json",
                           "configured_layer_ids": configured},
            "verifier": {"path": "/m/target"}, "data": {"path": "/m/data"},
            "run": {"device": "cpu", "torch": "2.13.0", "steps": steps}}


def read_report(report: dict[str, Any]) -> DrafterReport:
    """A drafter report as test-drafter reads its report.json: into its model."""
    return parse(DrafterReport, json.loads(json.dumps(report)), "report.json")


def record_prediction(history: History, run_id: str, report: dict[str, Any], digest: str,
                      time: str = "2026-11-30T09:00:00Z") -> RunRecord:
    """A test-drafter run in the history, through the same conversion the task's hook uses."""
    rec = records.test_drafter_record(run_id, "local", {"state": "succeeded", "exit_code": 0, "ended": time},
                                      read_report(report), {"steps": report["predicted_accept_length"]["steps"]},
                                      git_rev=None, config_digest=digest)
    history.record(rec)
    return rec
