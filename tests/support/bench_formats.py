"""Benchmark outputs in the engines' exact formats, built from the numbers a test chooses.

Each builder reproduces the real writer's field order and number formatting, as read in the
SGLang wheels (0.4.10.post2 ``scheduler_metrics_mixin``, 0.5.10 ``observability/
scheduler_metrics_mixin``, 0.5.13 ``bench_serving``) and vLLM's ``benchmarks/serve.py`` (see
shared/reference/sglang-eagle3.md §4–§5 and vllm-cpu.md). Tests feed these to the parsers and to
``bench compare`` and assert what must follow from the chosen numbers.
"""
from __future__ import annotations

import json
import math
from typing import Any


def sglang_decode_line(style: str, *, running: int = 1, tokens: int = 353, usage: float = 0.0,
                       accept_len: float | None = 2.31, accept_rate: float | None = None,
                       graph: str = "cuda", graph_on: bool = True, gen_tps: float = 141.2, queue: int = 0,
                       when: str = "2026-11-30 10:15:02", ranks: str = "TP0", forward_ct: int = 1200,
                       hybrid: bool = False, tail: str = "") -> str:
    """One decode log line as the given SGLang generation writes it, with its log prefix.

    style: "0.4" (≤0.5.2, "Decode batch."), "0.5.4" ("Decode batch [n],"), "0.5.6" ("Decode batch,"),
    "iter" (0.5.6+ with SGLANG_LOG_FORWARD_ITERS=1).
    """
    prefix = f"[{when} {ranks}] " if ranks else f"[{when}] "
    if style == "0.4":
        msg = f"Decode batch. #running-req: {running}, #token: {tokens}, token usage: {usage:.2f}, "
        if accept_len is not None:
            msg += f"accept len: {accept_len:.2f}, "
        msg += f"cuda graph: {graph_on}, gen throughput (token/s): {gen_tps:.2f}, #queue-req: {queue}, "
        return prefix + msg
    iter_msg = f" [{forward_ct}]" if style in ("0.5.4", "iter") else ""
    if hybrid:
        usage_msg = (f"#full token: {tokens}, full token usage: {usage:.2f}, #swa token: {tokens // 2}, "
                     f"swa token usage: {usage / 2:.2f}, ")
    else:
        usage_msg = f"#token: {tokens}, token usage: {usage:.2f}, "
    msg = f"Decode batch{iter_msg}, #running-req: {running}, {usage_msg}"
    if accept_len is not None:
        rate = accept_rate if accept_rate is not None else accept_len / 4
        msg += f"accept len: {accept_len:.2f}, accept rate: {rate:.2f}, "
    msg += f"{graph} graph: {graph_on}, gen throughput (token/s): {gen_tps:.2f}, #queue-req: {queue}"
    return prefix + msg + tail


def sglang_other_lines(when: str = "2026-11-30 10:15:00") -> list[str]:
    """Log lines around the decode lines that must not be taken for them."""
    return [(f"[{when} TP0] Prefill batch. #new-seq: 1, #new-token: 32, #cached-token: 0, "
             "token usage: 0.00, #running-req: 0, #queue-req: 0, "),
            f"[{when}] INFO:     127.0.0.1:51234 - \"POST /generate HTTP/1.1\" 200 OK",
            f"[{when}] The server is fired up and ready to roll!"]


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    n = len(ordered)
    mean = sum(ordered) / n
    median = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
    p99 = ordered[min(n - 1, math.ceil(0.99 * n) - 1)]
    std = (sum((v - mean) ** 2 for v in ordered) / n) ** 0.5
    return {"mean": mean, "median": median, "p99": p99, "std": std}


def sglang_server_info(*, accept_length: float | None = None, steps: int = 3, topk: int = 1,
                       draft_tokens: int = 4, algorithm: str | None = "EAGLE3", draft: str | None = "/m/draft",
                       max_running_requests: int = 48, version: str = "0.5.10",
                       disaggregated: bool = False) -> dict[str, Any]:
    """``/get_server_info``: server args at the top level, internal_states per DP rank, version."""
    state: dict[str, Any] = {"last_gen_throughput": 141.2, "memory_usage": {"weight": 1.2}}
    if accept_length is not None:
        state["avg_spec_accept_length"] = accept_length
    info = {"model_path": "/m/target", "tokenizer_path": "/m/target", "port": 30000,
            "speculative_algorithm": algorithm, "speculative_draft_model_path": draft if algorithm else None,
            "speculative_num_steps": steps if algorithm else None,
            "speculative_eagle_topk": topk if algorithm else None,
            "speculative_num_draft_tokens": draft_tokens if algorithm else None,
            "max_running_requests": max_running_requests, "decode_log_interval": 40,
            "disable_cuda_graph": False, "max_total_num_tokens": 600000,
            "internal_states": [state], "version": version}
    return {"decode": [info], "prefill": [dict(info, internal_states=[{}])]} if disaggregated else info


def sglang_bench_record(*, ttfts_ms: list[float], tpots_ms: list[float], itls_ms: list[float],
                        output_tokens: int, duration: float, accept_length: float | None,
                        server_info: dict[str, Any] | None = None, prompts: int | None = None,
                        input_tokens: int = 3200, max_concurrency: int | None = 8,
                        dataset_name: str = "sharegpt") -> dict[str, Any]:
    """One bench_serving JSONL record in the 0.5.10/0.5.13 key order."""
    ttft, tpot, itl = _stats(ttfts_ms), _stats(tpots_ms), _stats(itls_ms)
    completed = prompts or len(ttfts_ms)
    e2e = _stats([t + p * 100 for t, p in zip(ttfts_ms, tpots_ms, strict=True)])
    return {
        "tag": None, "backend": "sglang", "dataset_name": dataset_name, "request_rate": float("inf"),
        "max_concurrency": max_concurrency, "sharegpt_output_len": 128, "random_input_len": 1024,
        "random_output_len": 1024, "random_range_ratio": 0.0, "server_info": server_info,
        "duration": duration, "completed": completed, "total_input_tokens": input_tokens,
        "total_input_text_tokens": input_tokens, "total_input_vision_tokens": 0,
        "total_output_tokens": output_tokens, "total_output_tokens_retokenized": output_tokens,
        "request_throughput": completed / duration, "input_throughput": input_tokens / duration,
        "output_throughput": output_tokens / duration, "total_throughput": (input_tokens + output_tokens) / duration,
        "mean_e2e_latency_ms": e2e["mean"], "median_e2e_latency_ms": e2e["median"],
        "std_e2e_latency_ms": e2e["std"], "p90_e2e_latency_ms": e2e["p99"], "p99_e2e_latency_ms": e2e["p99"],
        "mean_ttft_ms": ttft["mean"], "median_ttft_ms": ttft["median"], "std_ttft_ms": ttft["std"],
        "p99_ttft_ms": ttft["p99"], "mean_tpot_ms": tpot["mean"], "median_tpot_ms": tpot["median"],
        "std_tpot_ms": tpot["std"], "p99_tpot_ms": tpot["p99"], "mean_itl_ms": itl["mean"],
        "median_itl_ms": itl["median"], "std_itl_ms": itl["std"], "p95_itl_ms": itl["p99"],
        "p99_itl_ms": itl["p99"], "concurrency": 7.6, "accept_length": accept_length,
        "max_output_tokens_per_s": output_tokens / duration * 1.3, "max_concurrent_requests": max_concurrency,
    }


def vllm_bench_result(*, ttfts_ms: list[float], tpots_ms: list[float], itls_ms: list[float],
                      output_tokens: int, duration: float, spec: dict[str, Any] | None = None,
                      prompts: int | None = None, failed: int = 0, input_tokens: int = 640,
                      max_concurrency: int | None = None, model: str = "/m/target") -> dict[str, Any]:
    """One ``vllm bench serve --save-result`` object in its writer's key order.

    ``spec``: {"drafts", "draft_tokens", "accepted", "per_pos": [accepted at k]} deltas of the
    server counters, from which the client derives its spec_decode_* fields.
    """
    completed = (prompts or len(ttfts_ms)) - failed
    result: dict[str, Any] = {
        "date": "20261130-101502", "endpoint_type": "vllm", "backend": "vllm", "label": None,
        "model_id": model, "tokenizer_id": model, "num_prompts": prompts or len(ttfts_ms),
        "request_rate": "inf", "burstiness": 1.0, "max_concurrency": max_concurrency,
        "duration": duration, "completed": completed, "failed": failed,
        "total_input_tokens": input_tokens, "total_output_tokens": output_tokens,
        "request_throughput": completed / duration, "request_goodput": None,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
        "max_output_tokens_per_s": output_tokens / duration * 1.2, "max_concurrent_requests": completed,
        "rtfx": 0.0,
    }
    if spec is not None:
        drafts, tokens, accepted = spec["drafts"], spec["draft_tokens"], spec["accepted"]
        result["spec_decode_acceptance_rate"] = accepted / tokens * 100
        result["spec_decode_acceptance_length"] = 1 + accepted / drafts
        result["spec_decode_num_drafts"] = drafts
        result["spec_decode_draft_tokens"] = tokens
        result["spec_decode_accepted_tokens"] = accepted
        result["spec_decode_per_position_acceptance_rates"] = [a / drafts for a in spec.get("per_pos", [])]
    for name, values in (("ttft", ttfts_ms), ("tpot", tpots_ms), ("itl", itls_ms)):
        stats = _stats(values)
        result[f"mean_{name}_ms"] = stats["mean"]
        result[f"median_{name}_ms"] = stats["median"]
        result[f"std_{name}_ms"] = stats["std"]
        result[f"p99_{name}_ms"] = stats["p99"]
    return result


def vllm_metrics_text(*, drafts: float | None, draft_tokens: float = 0.0, accepted: float = 0.0,
                      per_pos: list[float] | None = None, model: str = "/m/target", engines: int = 1) -> str:
    """A /metrics page as prometheus_client renders vLLM's counters (``_total`` plus ``_created``),
    with the counts split evenly over ``engines`` label sets."""
    lines = ["# HELP python_gc_objects_collected_total Objects collected during gc",
             "# TYPE python_gc_objects_collected_total counter",
             'python_gc_objects_collected_total{generation="0"} 1234.0',
             "# HELP vllm:num_requests_running Number of requests in model execution batches.",
             "# TYPE vllm:num_requests_running gauge",
             f'vllm:num_requests_running{{model_name="{model}",engine="0"}} 0.0']
    if drafts is None:
        return "\n".join(lines) + "\n"

    def counter(name: str, help_text: str, value: float, extra: str = "") -> None:
        lines.append(f"# HELP vllm:{name}_total {help_text}")
        lines.append(f"# TYPE vllm:{name}_total counter")
        for engine in range(engines):
            lines.append(f'vllm:{name}_total{{model_name="{model}",engine="{engine}"{extra}}} '
                         f"{float(value / engines)}")
        lines.append(f"# HELP vllm:{name}_created {help_text}")
        lines.append(f"# TYPE vllm:{name}_created gauge")
        for engine in range(engines):
            lines.append(f'vllm:{name}_created{{model_name="{model}",engine="{engine}"{extra}}} 1.7644968e+09')

    counter("spec_decode_num_drafts", "Number of spec decoding drafts.", drafts)
    counter("spec_decode_num_draft_tokens", "Number of draft tokens.", draft_tokens)
    counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.", accepted)
    for pos, value in enumerate(per_pos or []):
        counter("spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", value,
                extra=f',position="{pos}"')
    return "\n".join(lines) + "\n"


def jsonl(records: list[dict[str, Any]]) -> str:
    """Records as SGLang appends them: one json.dumps per line (NaN written as NaN)."""
    return "".join(json.dumps(r) + "\n" for r in records)


def vllm_appended(records: list[dict[str, Any]]) -> str:
    """Records as ``--append-result`` writes them: json.dump, a newline before each later one."""
    return "\n".join(json.dumps(r) for r in records)
