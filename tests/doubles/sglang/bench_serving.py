"""Test double of ``python -m sglang.bench_serving`` (SGLang 0.5.10; see tests/doubles/README.md).

Stdlib only. It takes the real flags the runner passes, sends its requests to ``/generate`` with
temperature 0.0 (0.5.10's client has no ``--temperature`` and hard-codes it), flushes the cache
after its warm-up request when asked, reads ``avg_spec_accept_length`` from ``/get_server_info``
afterwards, prints the real summary lines and **appends** one JSONL record with 0.5.10's keys.
A request that fails (the server died) is counted as not completed, as the real client does.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench_serving.py")
    add = parser.add_argument
    add("--backend", type=str, default="sglang")
    add("--base-url", type=str, default=None)
    add("--host", type=str, default="0.0.0.0")
    add("--port", type=int)
    add("--model", type=str)
    add("--tokenizer", type=str)
    add("--dataset-name", type=str, default="sharegpt", choices=("sharegpt", "random", "random-ids"))
    add("--dataset-path", type=str, default="")
    add("--num-prompts", type=int, default=1000)
    add("--sharegpt-output-len", type=int)
    add("--random-input-len", type=int, default=1024)
    add("--random-output-len", type=int, default=1024)
    add("--random-range-ratio", type=float, default=0.0)
    add("--request-rate", type=float, default=float("inf"))
    add("--max-concurrency", type=int)
    add("--seed", type=int, default=1)
    add("--disable-ignore-eos", action="store_true")
    add("--flush-cache", action="store_true")
    add("--warmup-requests", type=int, default=1)
    add("--output-file", type=str)
    add("--tag", type=str)
    return parser


def _http(url: str, body: Any = None, timeout: float = 60.0) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
        return resp.status, json.loads(raw) if raw else None


def sample(args: argparse.Namespace) -> list[tuple[str, int]]:
    rng = random.Random(args.seed)
    if args.dataset_name == "sharegpt":
        with open(args.dataset_path) as fh:
            convs = json.load(fh)
        prompts = [c["conversations"][0]["value"] for c in convs if len(c.get("conversations", [])) >= 2]
        rng.shuffle(prompts)
        out_len = args.sharegpt_output_len or 128
        return [(prompts[i % len(prompts)], out_len) for i in range(args.num_prompts)]
    return [(" ".join(str(rng.randrange(1000)) for _ in range(args.random_input_len)), args.random_output_len)
            for _ in range(args.num_prompts)]


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(build_parser().parse_args(argv))


def _fail_on_cue() -> None:
    """``DRAFTOPS_SGLANG_DOUBLE_CLIENT_FAIL_RUN=N``: this process's N-th run raises (a repeat failing
    inside the library; a client process per step only ever has run 1)."""
    runs = int(os.environ.get("_DRAFTOPS_SGLANG_DOUBLE_CLIENT_RUNS", "0")) + 1
    os.environ["_DRAFTOPS_SGLANG_DOUBLE_CLIENT_RUNS"] = str(runs)
    if os.environ.get("DRAFTOPS_SGLANG_DOUBLE_CLIENT_FAIL_RUN") == str(runs):
        raise RuntimeError(f"double client: failing on cue in its run {runs}")


def run_benchmark(args: argparse.Namespace) -> int:
    """The library entry of the real client (``run_benchmark(args)``): the bench's client process
    (remote.bench.client_session) finds it and runs the module's ``__main__`` block once per step."""
    _fail_on_cue()
    base = args.base_url or f"http://{args.host}:{args.port}"
    requests = sample(args)
    for prompt, out_len in requests[: args.warmup_requests]:
        _http(base + "/generate", {"text": prompt, "sampling_params": {"max_new_tokens": out_len,
                                                                         "temperature": 0.0}})
    if args.flush_cache:
        _http(base + "/flush_cache", {})
    lock = threading.Lock()
    ttfts, tpots, outputs, failed = [], [], [], 0
    slots = threading.Semaphore(args.max_concurrency or len(requests))

    def one(prompt: str, out_len: int) -> None:
        nonlocal failed
        with slots:
            started = time.perf_counter()
            try:
                _, reply = _http(base + "/generate", {"text": prompt, "sampling_params": {
                    "max_new_tokens": out_len, "temperature": 0.0, "ignore_eos": not args.disable_ignore_eos}})
            except (urllib.error.URLError, OSError, ValueError):
                with lock:
                    failed += 1
                return
            latency = time.perf_counter() - started
            n = int(reply["meta_info"]["completion_tokens"])
            with lock:
                ttfts.append(latency * 1000 / max(n, 1))
                tpots.append(latency * 1000 / max(n, 1))
                outputs.append(n)

    started = time.perf_counter()
    threads = [threading.Thread(target=one, args=r) for r in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = max(time.perf_counter() - started, 1e-6)
    if not outputs:
        print("Initial test run failed - Please make sure benchmark arguments are correctly specified. "
              "Error: Cannot connect to the server", file=sys.stderr)
        return 1
    info, accept = _server_info(base)

    def stats(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {"mean": statistics.fmean(ordered), "median": statistics.median(ordered),
                "std": statistics.pstdev(ordered), "p99": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]}

    ttft, tpot = stats(ttfts), stats(tpots)
    total_out = sum(outputs)
    record = {
        "tag": args.tag, "backend": args.backend, "dataset_name": args.dataset_name,
        "request_rate": args.request_rate, "max_concurrency": args.max_concurrency,
        "sharegpt_output_len": args.sharegpt_output_len, "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len, "random_range_ratio": args.random_range_ratio,
        "server_info": info, "duration": duration, "completed": len(outputs), "total_input_tokens": 0,
        "total_input_text_tokens": 0, "total_input_vision_tokens": 0, "total_output_tokens": total_out,
        "total_output_tokens_retokenized": total_out, "request_throughput": len(outputs) / duration,
        "input_throughput": 0.0, "output_throughput": total_out / duration,
        "total_throughput": total_out / duration,
        **{f"{k}_e2e_latency_ms": v for k, v in stats([t * n for t, n in zip(ttfts, outputs, strict=True)]).items()},
        "p90_e2e_latency_ms": ttft["p99"],
        **{f"{k}_ttft_ms": v for k, v in ttft.items()}, **{f"{k}_tpot_ms": v for k, v in tpot.items()},
        **{f"{k}_itl_ms": v for k, v in tpot.items()}, "p95_itl_ms": tpot["p99"],
        "concurrency": float(args.max_concurrency or 1), "accept_length": accept,
        "max_output_tokens_per_s": total_out / duration, "max_concurrent_requests": args.max_concurrency,
    }
    _print_result(args.backend, record)
    if args.output_file:
        with open(args.output_file, "a") as fh:
            fh.write(json.dumps(record) + "\n")
    return 0


def _server_info(base: str) -> tuple[dict | None, float | None]:
    """``/get_server_info`` and its accept length, as bench_serving reads them after the run."""
    try:
        _, info = _http(base + "/get_server_info")
    except (urllib.error.URLError, OSError, ValueError):
        return None, None
    return info, (info.get("internal_states") or [{}])[0].get("avg_spec_accept_length")


def _print_result(backend: str, record: dict) -> None:
    """The result table bench_serving prints (the lines draftops' parser reads)."""
    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print("{:<40} {:<10}".format("Backend:", backend))
    print("{:<40} {:<10}".format("Successful requests:", record["completed"]))
    print("{:<40} {:<10.2f}".format("Output token throughput (tok/s):", record["output_throughput"]))
    if record["accept_length"]:
        print("{:<40} {:<10.2f}".format("Accept length:", record["accept_length"]))
    print("{:<40} {:<10.2f}".format("Median TTFT (ms):", record["median_ttft_ms"]))
    print("{:<40} {:<10.2f}".format("Mean TPOT (ms):", record["mean_tpot_ms"]))


if __name__ == "__main__":
    sys.exit(main())
