"""The engines' own benchmark clients' result files, normalised to one record shape.

* SGLang ``python -m sglang.bench_serving`` / ``sglang.benchmark.serving``: ``--output-file`` is
  JSONL, one object per run, **appended** (sglang-eagle3.md §5.1). ``accept_length`` comes from the
  server's ``/server_info`` and is null for non-SGLang backends or a baseline; ``server_info``
  holds the effective ``speculative_*`` settings.
* vLLM ``vllm bench serve --save-result``: one JSON object; with ``--append-result`` further
  objects follow, each after a newline. Speculative runs add ``spec_decode_acceptance_length``,
  ``spec_decode_acceptance_rate`` (percent), ``spec_decode_num_drafts``,
  ``spec_decode_draft_tokens``, ``spec_decode_accepted_tokens`` and
  ``spec_decode_per_position_acceptance_rates`` (vllm-cpu.md).

A record that cannot be decoded (a client killed mid-write leaves a cut last line) is reported in
``problems`` with its line number; the good records before and after it still count.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from .numbers import finite

# normalised name -> key in both clients' records (they agree on these)
_COMMON = {
    "duration_s": "duration", "completed": "completed",
    "total_input_tokens": "total_input_tokens", "total_output_tokens": "total_output_tokens",
    "request_throughput": "request_throughput", "output_throughput": "output_throughput",
    "mean_ttft_ms": "mean_ttft_ms", "median_ttft_ms": "median_ttft_ms", "p99_ttft_ms": "p99_ttft_ms",
    "mean_tpot_ms": "mean_tpot_ms", "median_tpot_ms": "median_tpot_ms", "p99_tpot_ms": "p99_tpot_ms",
    "mean_itl_ms": "mean_itl_ms", "median_itl_ms": "median_itl_ms", "p99_itl_ms": "p99_itl_ms",
    "max_concurrency": "max_concurrency",
}
SPEC_SETTING_KEYS = ("speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
                     "speculative_num_draft_tokens", "speculative_draft_model_path", "max_running_requests")
REQUIRED = ("output_throughput", "completed")


@dataclass
class ClientRecord:
    """One benchmark run as the client reported it (None = the client did not report it)."""

    engine: str
    index: int                          # 0-based position among the file's records
    lineno: int
    duration_s: float | None = None
    completed: float | None = None
    failed: float | None = None
    total_input_tokens: float | None = None
    total_output_tokens: float | None = None
    request_throughput: float | None = None
    output_throughput: float | None = None
    total_throughput: float | None = None
    mean_ttft_ms: float | None = None
    median_ttft_ms: float | None = None
    p99_ttft_ms: float | None = None
    mean_tpot_ms: float | None = None
    median_tpot_ms: float | None = None
    p99_tpot_ms: float | None = None
    mean_itl_ms: float | None = None
    median_itl_ms: float | None = None
    p99_itl_ms: float | None = None
    max_concurrency: float | None = None
    accept_length: float | None = None
    accept_rate: float | None = None          # fraction 0..1 (vLLM writes percent; converted)
    num_drafts: float | None = None
    draft_tokens: float | None = None
    accepted_tokens: float | None = None
    per_position_acceptance: list[float] | None = None
    server_settings: dict[str, Any] = field(default_factory=dict)   # SGLang: effective speculative_* etc.
    label: str | None = None
    samples: dict[str, list[float]] | None = None   # per request (vLLM --save-detailed, SGLang --output-details)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ClientOutput:
    """All records of one result file and what could not be read."""

    records: list[ClientRecord] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)   # {"line": n, "message": "..."}

    @property
    def last(self) -> ClientRecord | None:
        return self.records[-1] if self.records else None

    def to_dict(self) -> dict[str, Any]:
        return {"records": [r.to_dict() for r in self.records], "problems": self.problems}


def iter_json_objects(text: str) -> Iterator[tuple[int, dict[str, Any] | None, str | None]]:
    """Yield ``(lineno, object, None)`` for each top-level JSON value, ``(lineno, None, error)`` for
    each one that cannot be decoded; decoding resumes at the next line that opens an object."""
    decoder = json.JSONDecoder()
    pos, size = (1 if text.startswith("\ufeff") else 0), len(text)
    while True:
        while pos < size and text[pos] in " \t\r\n":
            pos += 1
        if pos >= size:
            return
        lineno = text.count("\n", 0, pos) + 1
        try:
            value, end = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            # beyond JSONDecodeError: an integer past Python's digit limit, nesting past the recursion limit
            nxt = text.find("\n{", pos)
            where = (f"{exc.msg} at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError)
                     else str(exc).split(";")[0])
            yield lineno, None, (f"the last record is cut off or broken ({where})" if nxt < 0
                                 else f"not JSON ({where}); the records after it still count")
            if nxt < 0:
                return
            pos = nxt + 1
            continue
        if not isinstance(value, dict):
            yield lineno, None, f"a JSON {type(value).__name__}, not a result object"
        else:
            yield lineno, value, None
        pos = end


#: per-request fields kept, at most this many requests per record (the comparison needs hundreds, not millions)
MAX_REQUESTS = 20_000


def _seconds(value: Any) -> float | None:
    x = finite(value)
    return x if x is not None and x >= 0 else None


def _from_gaps(ttft: float | None, gaps: Any) -> float | None:
    """A request's end-to-end latency from its TTFT and inter-token gaps (SGLang writes no latencies)."""
    if ttft is None or not isinstance(gaps, list):
        return None
    return ttft + sum(g for g in (_seconds(x) for x in gaps[:MAX_REQUESTS]) if g is not None)


def request_samples(raw: dict[str, Any]) -> dict[str, list[float]] | None:
    """Per-request output tokens, TTFT and end-to-end latency (ms) of the requests that succeeded, from
    the client's detailed fields (vLLM: ``output_lens``, ``ttfts``, ``latencies`` or ``itls``, ``errors``;
    SGLang: the same names without ``latencies``); None when the record has none. A request with an
    error, no output or a value that is not a finite non-negative number is left out."""
    lens, ttfts, lats, itls, errors = (raw.get(k) for k in ("output_lens", "ttfts", "latencies", "itls", "errors"))
    if not isinstance(lens, list) or not isinstance(ttfts, list) or len(ttfts) != len(lens):
        return None
    out: dict[str, list[float]] = {"output_len": [], "ttft_ms": [], "latency_ms": []}
    for i, n in enumerate(lens[:MAX_REQUESTS]):
        tokens, ttft = finite(n), _seconds(ttfts[i])
        error = errors[i] if isinstance(errors, list) and i < len(errors) else None
        latency = _seconds(lats[i]) if isinstance(lats, list) and i < len(lats) else None
        if latency is None:
            latency = _from_gaps(ttft, itls[i] if isinstance(itls, list) and i < len(itls) else None)
        if error or not tokens or tokens < 1 or ttft is None or latency is None or latency < ttft:
            continue
        out["output_len"].append(tokens)
        out["ttft_ms"].append(round(ttft * 1000, 3))
        out["latency_ms"].append(round(latency * 1000, 3))
    return out if out["output_len"] else None


def _common(engine: str, index: int, lineno: int, raw: dict[str, Any]) -> ClientRecord:
    rec = ClientRecord(engine=engine, index=index, lineno=lineno)
    for name, key in _COMMON.items():
        setattr(rec, name, finite(raw.get(key)))
    rec.samples = request_samples(raw)
    return rec


def _collect(text: str, engine: str, build: Any) -> ClientOutput:
    out = ClientOutput()
    for lineno, raw, error in iter_json_objects(text):
        if raw is None:
            out.problems.append({"line": lineno, "message": error})
            continue
        missing = [key for key in REQUIRED if finite(raw.get(key)) is None]
        if missing:
            out.problems.append({"line": lineno, "message": f"no usable {', '.join(missing)} in the record "
                                 "(the client printed an error instead of results?)"})
            continue
        out.records.append(build(len(out.records), lineno, raw))
    return out


def parse_sglang(text: str) -> ClientOutput:
    """Records of an SGLang bench_serving ``--output-file`` (JSONL, appended per run)."""
    def build(index: int, lineno: int, raw: dict[str, Any]) -> ClientRecord:
        rec = _common("sglang", index, lineno, raw)
        rec.total_throughput = finite(raw.get("total_throughput"))
        accept = finite(raw.get("accept_length"))
        rec.accept_length = accept if accept and accept > 0 else None   # the client prints it only if non-zero
        info = raw.get("server_info")
        if isinstance(info, dict):
            decode = info.get("decode")       # a disaggregated server nests it; anything else is the top level
            info = decode[0] if isinstance(decode, list) and decode and isinstance(decode[0], dict) else info
            rec.server_settings = {k: info.get(k) for k in (*SPEC_SETTING_KEYS, "version") if k in info}
        rec.label = raw.get("tag") if isinstance(raw.get("tag"), str) else None
        return rec
    return _collect(text, "sglang", build)


def parse_vllm(text: str) -> ClientOutput:
    """Records of a ``vllm bench serve --save-result`` file (one object, more with --append-result)."""
    def build(index: int, lineno: int, raw: dict[str, Any]) -> ClientRecord:
        rec = _common("vllm", index, lineno, raw)
        rec.failed = finite(raw.get("failed"))
        rec.total_throughput = finite(raw.get("total_token_throughput"))
        rec.accept_length = finite(raw.get("spec_decode_acceptance_length"))
        rate = finite(raw.get("spec_decode_acceptance_rate"))
        rec.accept_rate = rate / 100 if rate is not None else None
        rec.num_drafts = finite(raw.get("spec_decode_num_drafts"))
        rec.draft_tokens = finite(raw.get("spec_decode_draft_tokens"))
        rec.accepted_tokens = finite(raw.get("spec_decode_accepted_tokens"))
        per_pos = raw.get("spec_decode_per_position_acceptance_rates")
        if isinstance(per_pos, list):
            rec.per_position_acceptance = [v for v in (finite(x) for x in per_pos) if v is not None]
        rec.label = raw.get("label") if isinstance(raw.get("label"), str) else None
        return rec
    return _collect(text, "vllm", build)


def parse(engine: str, text: str) -> ClientOutput:
    """Dispatch on the engine name ("sglang" or "vllm")."""
    if engine == "sglang":
        return parse_sglang(text)
    if engine == "vllm":
        return parse_vllm(text)
    raise ValueError(f"unknown engine {engine!r}: expected 'sglang' or 'vllm'")
