"""The two serving engines behind one small interface.

Each engine knows its launch command, how to tell it is ready, how to read back the settings it
actually runs with, where its accept length comes from, and how to parse its periodic log lines.
Facts: shared/reference/sglang-eagle3.md §4 (SGLang), shared/reference/vllm-cpu.md (vLLM).
"""
from __future__ import annotations

import ast
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

#: the largest speculative --steps / --topk / --draft-tokens `invoke serve` passes on (far above any
#: useful draft, low enough that the engines' own arithmetic on them cannot blow up)
SPECULATIVE_MAX = {"--steps": 64, "--topk": 64, "--draft-tokens": 1024}

#: GET a path on the server (through the host) -> (HTTP status or None, body text)
Fetch = Callable[[str, Any], tuple[int | None, str]]


@dataclass(frozen=True)
class Launch:
    """What a server needs to run: the settings `serve` resolved (asked-for values)."""

    python: str
    target: str
    draft: str | None
    port: int
    listen: str
    tp: int
    max_running_requests: int
    mem_fraction: float | None
    context_length: int | None
    steps: int | None
    topk: int | None
    draft_tokens: int | None
    extra_args: tuple[str, ...]
    sglang_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Probe:
    """One readiness step: ready when the server answers ``path`` (POST ``body`` if given) with 200."""

    path: str
    body: Any = None
    what: str = ""


class Engine(ABC):
    """A serving engine as `invoke serve` drives it."""

    name: str
    label: str
    #: flags `serve` sets itself; a profile's extra_args may not repeat them (field to use instead)
    owned_flags: ClassVar[dict[str, str]]
    #: (key, label) of the settings shown asked-for vs effective
    settings: ClassVar[tuple[tuple[str, str], ...]]
    accept_length_source: str

    @abstractmethod
    def command(self, launch: Launch) -> list[str]:
        """argv of the server process."""

    def environment(self, launch: Launch) -> dict[str, str]:
        """Variables the server needs besides the profile's ``env``."""
        return {}

    @abstractmethod
    def readiness(self, launch: Launch) -> list[Probe]:
        """Ordered probes; the server is ready when all answer 200."""

    @abstractmethod
    def asked(self, launch: Launch) -> dict[str, Any]:
        """The settings as requested, keyed like ``settings``."""

    @abstractmethod
    def effective(self, fetch: Fetch, log_head: str) -> dict[str, Any]:
        """The settings the running server reports, keyed like ``settings``."""

    @abstractmethod
    def parse_log_line(self, line: str) -> dict[str, float] | None:
        """The numbers of one periodic metrics line, or None for other lines."""

    @abstractmethod
    def limits(self, fetch: Fetch, effective: dict[str, Any]) -> Limits:
        """(context, longest prompt, where read) of the running server, for refusing a benchmark whose
        lengths it cannot take; ``effective`` (serve's read-back) when the server does not say."""


#: (context length, longest prompt, where they were read); None where not known
Limits = tuple["int | None", "int | None", str]


def _count(value: Any) -> int | None:
    """A positive whole number as a server reports a length, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _json(fetch: Fetch, path: str) -> dict[str, Any]:
    return _json_why(fetch, path)[0]


def _json_why(fetch: Fetch, path: str) -> tuple[dict[str, Any], str | None]:
    """The JSON object the server answers ``path`` with, or {} and why there is none (in words)."""
    status, body = fetch(path, None)
    if status != 200:
        said = " ".join(str(body).split())[:160]
        return {}, (f"GET {path} answered HTTP {status}" if status is not None
                    else f"GET {path} got no answer ({said or 'no reason given'})")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return {}, f"GET {path} answered with something that is not JSON"
    if not isinstance(data, dict):
        return {}, f"GET {path} answered JSON {type(data).__name__}, not an object"
    return data, None


def _numbers(line: str, patterns: dict[str, re.Pattern[str]]) -> dict[str, float]:
    out = {}
    for key, pattern in patterns.items():
        match = pattern.search(line)
        if match:
            out[key] = float(match.group(1))
    return out


class SGLang(Engine):
    name, label = "sglang", "SGLang"
    owned_flags: ClassVar[dict[str, str]] = {
        "--model-path": "target", "--model": "target", "--host": "listen", "--port": "port",
        "--tp-size": "tp", "--tensor-parallel-size": "tp",
        "--max-running-requests": "max_running_requests",
        "--mem-fraction-static": "mem_fraction", "--context-length": "context_length",
        "--speculative-algorithm": "--draft", "--speculative-draft-model-path": "--draft",
        "--speculative-draft-model": "--draft", "--speculative-num-steps": "--steps",
        "--speculative-eagle-topk": "--topk", "--speculative-num-draft-tokens": "--draft-tokens"}
    settings = (("algorithm", "speculative algorithm"), ("draft", "draft model"),
                ("num_steps", "num steps"), ("topk", "eagle topk"), ("num_draft_tokens", "num draft tokens"),
                ("max_running_requests", "max running requests"), ("tp", "tensor parallel"),
                ("mem_fraction", "mem fraction static"), ("context_length", "context length"))
    accept_length_source = ("GET /get_server_info: internal_states[0].avg_spec_accept_length (cumulative "
                            "since start or /flush_cache, updated every --decode-log-interval decode "
                            "steps), and `accept len:` in the `Decode batch` log lines")
    _LOG: ClassVar[dict[str, re.Pattern[str]]] = {
            "running_req": re.compile(r"Decode batch[^#]*#running-req:\s*(\d+)"),
            "accept_len": re.compile(r"accept len:\s*([0-9.]+)"),
            "accept_rate": re.compile(r"accept rate:\s*([0-9.]+)"),
            "gen_throughput": re.compile(r"gen throughput \(token/s\):\s*([0-9.]+)")}

    def command(self, launch: Launch) -> list[str]:
        argv = [launch.python, "-m", "sglang.launch_server", "--model-path", launch.target,
                "--host", launch.listen, "--port", str(launch.port), "--tp-size", str(launch.tp),
                "--max-running-requests", str(launch.max_running_requests)]
        if launch.mem_fraction is not None:
            argv += ["--mem-fraction-static", str(launch.mem_fraction)]
        if launch.context_length is not None:
            argv += ["--context-length", str(launch.context_length)]
        if launch.draft:
            argv += ["--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", launch.draft]
            if launch.steps is not None:
                argv += ["--speculative-num-steps", str(launch.steps),
                         "--speculative-eagle-topk", str(launch.topk),
                         "--speculative-num-draft-tokens", str(launch.draft_tokens)]
        return argv + list(launch.extra_args)

    def environment(self, launch: Launch) -> dict[str, str]:
        # The capture patch reads the draft's ids from here where SGLang (<= 0.5.4) calls the
        # setter without them (CUDA-graph capture); harmless for other versions.
        if launch.draft and launch.sglang_ids:
            return {"DRAFTOPS_EAGLE3_LAYER_IDS": ",".join(str(i) for i in launch.sglang_ids)}
        return {}

    def readiness(self, launch: Launch) -> list[Probe]:
        return [Probe("/health_generate", what="GET /health_generate (a 1-token generation)")]

    def asked(self, launch: Launch) -> dict[str, Any]:
        spec = launch.draft is not None
        auto = "auto" if spec and launch.steps is None else None
        return {"algorithm": "EAGLE3" if spec else None, "draft": launch.draft,
                "num_steps": launch.steps if launch.steps is not None else auto,
                "topk": launch.topk if launch.topk is not None else auto,
                "num_draft_tokens": launch.draft_tokens if launch.draft_tokens is not None else auto,
                "max_running_requests": launch.max_running_requests, "tp": launch.tp,
                "mem_fraction": launch.mem_fraction, "context_length": launch.context_length}

    def effective(self, fetch: Fetch, log_head: str) -> dict[str, Any]:
        info, why = _json_why(fetch, "/get_server_info")
        if why and "HTTP 404" in why:            # renamed /server_info from 0.5.10; a hang is not asked twice
            info, later = _json_why(fetch, "/server_info")
            why = f"{why}; {later}" if later else None
        return {**({"_unread": why} if why else {}), "algorithm": info.get("speculative_algorithm"),
                "draft": info.get("speculative_draft_model_path"),
                "num_steps": info.get("speculative_num_steps"), "topk": info.get("speculative_eagle_topk"),
                "num_draft_tokens": info.get("speculative_num_draft_tokens"),
                "max_running_requests": info.get("max_running_requests"), "tp": info.get("tp_size"),
                "mem_fraction": info.get("mem_fraction_static"),
                "context_length": info.get("context_length"),
                "_version": info.get("version")}

    def limits(self, fetch: Fetch, effective: dict[str, Any]) -> Limits:
        info = _json(fetch, "/get_server_info") or _json(fetch, "/server_info")
        if info:
            # max_req_input_len = min(context, KV pool) - 1: where no context_length is set, prompt and
            # output must still fit one more than it
            longest = _count(info.get("max_req_input_len"))
            context = _count(info.get("context_length")) or (longest + 1 if longest else None)
            return context, longest, "/get_server_info"
        return _count(effective.get("context_length")), None, "the context length serve read back"

    def parse_log_line(self, line: str) -> dict[str, float] | None:
        if "Decode batch" not in line:
            return None
        return _numbers(line, self._LOG)


class VLLM(Engine):
    name, label = "vllm", "vLLM"
    owned_flags: ClassVar[dict[str, str]] = {
        "--host": "listen", "--port": "port", "--tensor-parallel-size": "tp", "-tp": "tp",
        "--max-num-seqs": "max_running_requests", "--gpu-memory-utilization": "mem_fraction",
        "--max-model-len": "context_length", "--speculative-config": "--draft / --steps",
        "--model": "target"}
    settings = (("method", "speculative method"), ("draft", "draft model"),
                ("num_speculative_tokens", "num speculative tokens"), ("max_num_seqs", "max num seqs"),
                ("tp", "tensor parallel"), ("max_model_len", "max model len"))
    accept_length_source = ("GET /metrics: 1 + Δvllm:spec_decode_num_accepted_tokens_total / "
                            "Δvllm:spec_decode_num_drafts_total over a window, and the periodic "
                            "`SpecDecoding metrics: Mean acceptance length` log lines")
    _LOG: ClassVar[dict[str, re.Pattern[str]]] = {
            "accept_len": re.compile(r"Mean acceptance length:\s*([0-9.]+)"),
            "accepted": re.compile(r"Accepted:\s*(\d+) tokens"),
            "drafted": re.compile(r"Drafted:\s*(\d+) tokens"),
            "accept_rate_pct": re.compile(r"Avg Draft acceptance rate:\s*([0-9.]+)%"),
            "gen_throughput": re.compile(r"Avg generation throughput:\s*([0-9.]+)")}
    _SPEC = re.compile(r"speculative_config=SpeculativeConfig\(([^)]*)\)")
    _POSITION = re.compile(r'vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"')
    #: the worker's line at model load (gpu_model_runner, which the CPU runner inherits; eagle3_utils)
    _AUX = re.compile(r"Using (?:Eagle3 )?auxiliary layers from (?:speculative config|config|model): "
                      r"[(\[]([-\d,\s]*)[)\]]")

    def command(self, launch: Launch) -> list[str]:
        argv = [launch.python, "-m", "vllm.entrypoints.cli.main", "serve", launch.target,
                "--host", launch.listen, "--port", str(launch.port),
                "--tensor-parallel-size", str(launch.tp), "--max-num-seqs", str(launch.max_running_requests)]
        if launch.mem_fraction is not None:
            argv += ["--gpu-memory-utilization", str(launch.mem_fraction)]
        if launch.context_length is not None:
            argv += ["--max-model-len", str(launch.context_length)]
        if launch.draft:
            config = {"method": "eagle3", "model": launch.draft, "num_speculative_tokens": launch.steps}
            argv += ["--speculative-config", json.dumps(config)]
        return argv + list(launch.extra_args)

    def environment(self, launch: Launch) -> dict[str, str]:
        return {"HF_HUB_OFFLINE": "1"}      # local folders only: never reach for the Hub

    def readiness(self, launch: Launch) -> list[Probe]:
        tiny = {"model": launch.target, "prompt": "Hello", "max_tokens": 1, "temperature": 0}
        return [Probe("/health", what="GET /health"),
                Probe("/v1/completions", tiny, what="one 1-token completion")]

    def asked(self, launch: Launch) -> dict[str, Any]:
        spec = launch.draft is not None
        return {"method": "eagle3" if spec else None, "draft": launch.draft,
                "num_speculative_tokens": launch.steps if spec else None,
                "max_num_seqs": launch.max_running_requests, "tp": launch.tp,
                "max_model_len": launch.context_length}

    def effective(self, fetch: Fetch, log_head: str) -> dict[str, Any]:
        spec: dict[str, Any] = {}
        match = self._SPEC.search(log_head)
        if match:
            for part in re.finditer(r"(\w+)=('(?:[^']*)'|[^,]+)", match.group(1)):
                spec[part.group(1)] = _literal(part.group(2))
        status, metrics = fetch("/metrics", None)
        positions = {int(p) for p in self._POSITION.findall(metrics)} if status == 200 else set()
        tokens = spec.get("num_spec_tokens")
        if tokens is None and positions:
            tokens = max(positions) + 1
        unread = None if "max_num_seqs" in log_head else ("the start of the server's log has none of the "
                                                          "settings vLLM logs at start-up")
        return {**({"_unread": unread} if unread else {}), "method": spec.get("method"), "draft": spec.get("model"),
                "num_speculative_tokens": tokens,
                "max_num_seqs": _int_after(r"'max_num_seqs': (\d+)", log_head),
                "tp": _int_after(r"tensor_parallel_size=(\d+)", log_head),
                "max_model_len": _int_after(r"max_seq_len=(\d+)", log_head),
                "aux_layer_ids": self._aux_layer_ids(log_head),
                "_metrics_positions": len(positions)}

    def _aux_layer_ids(self, log_head: str) -> list[int] | None:
        """The aux layer ids the engine says it captures (its convention), None when it did not say."""
        match = self._AUX.search(log_head)
        return [int(n) for n in re.findall(r"-?\d+", match.group(1))] if match else None

    def limits(self, fetch: Fetch, effective: dict[str, Any]) -> Limits:
        models = _json(fetch, "/v1/models").get("data")
        first = models[0] if isinstance(models, list) and models and isinstance(models[0], dict) else {}
        if _count(first.get("max_model_len")):
            return _count(first.get("max_model_len")), None, "max_model_len in /v1/models"
        return _count(effective.get("max_model_len")), None, "the max model len serve read back"

    def parse_log_line(self, line: str) -> dict[str, float] | None:
        if "SpecDecoding metrics" not in line and "Avg generation throughput" not in line:
            return None
        return _numbers(line, self._LOG)


def _int_after(pattern: str, text: str) -> int | None:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else None


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return text.strip()


ENGINES: dict[str, Engine] = {"sglang": SGLang(), "vllm": VLLM()}


def get(name: str) -> Engine:
    return ENGINES[name]
