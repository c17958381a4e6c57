"""Test double of ``python -m sglang.launch_server`` (SGLang 0.5.10 formats; see tests/doubles/README.md).

Stdlib only. It loads no model: it reads the target's config.json (as the real server's first
step does), applies the real argument handling and auto-adjustments with the real log lines, then
serves the real endpoints with deterministic fake tokens.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from sglang import __version__

logger = logging.getLogger("sglang.srt.server_args")
LOAD_S = float(os.environ.get("DRAFTOPS_SGLANG_DOUBLE_LOAD_S", "1.0"))
WARMUP_S = float(os.environ.get("DRAFTOPS_SGLANG_DOUBLE_WARMUP_S", "1.0"))
#: die (as a scheduler crash does) on this many-th /generate request; 0 = never
DIE_AFTER = int(os.environ.get("DRAFTOPS_SGLANG_DOUBLE_DIE_AFTER", "0"))
EXIT_S = float(os.environ.get("DRAFTOPS_SGLANG_DOUBLE_EXIT_S", "0"))
#: "FIXED,PER_TOKEN" milliseconds: each decode step (a verification round) of a request takes FIXED plus
#: PER_TOKEN per drafted token verified (draft tokens - 1), so throughput depends on the setting as on a
#: real server; unset: no delay
ROUND_MS = tuple(float(v) for v in os.environ.get("DRAFTOPS_SGLANG_DOUBLE_ROUND_MS", "0,0").split(",")[:2])
#: a broken /get_server_info (a fault, not SGLang's): "garbage" (not JSON), "hang" (never answers),
#: "wrong-types" (its values of the wrong JSON types); unset: SGLang's answer
SERVER_INFO_FAULT = os.environ.get("DRAFTOPS_SGLANG_DOUBLE_SERVER_INFO", "")
WRONG_TYPES = {"speculative_num_steps": "three", "speculative_eagle_topk": [1], "speculative_num_draft_tokens": None,
               "max_running_requests": {"n": [8]}, "speculative_algorithm": 5, "tp_size": "1",
               "context_length": [4096], "max_req_input_len": "4095", "version": {"v": 1},
               "internal_states": [{"avg_spec_accept_length": "2.5"}]}
SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
             "Qwen3MoeForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
             "KimiK25ForConditionalGeneration", "GptOssForCausalLM", "Glm4MoeForCausalLM")
ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")


@dataclasses.dataclass
class ServerArgs:
    model_path: str
    tokenizer_path: str | None = None
    host: str = "127.0.0.1"
    port: int = 30000
    dtype: str = "auto"
    trust_remote_code: bool = False
    context_length: int | None = None
    tp_size: int = 1
    dp_size: int = 1
    mem_fraction_static: float | None = None
    max_running_requests: int | None = None
    max_total_tokens: int | None = None
    chunked_prefill_size: int | None = None
    page_size: int = 1
    attention_backend: str | None = None
    disable_cuda_graph: bool = False
    cuda_graph_max_bs: int | None = None
    disable_overlap_schedule: bool = False
    enable_mixed_chunk: bool = False
    enable_torch_compile: bool = False
    random_seed: int | None = None
    served_model_name: str | None = None
    log_level: str = "info"
    decode_log_interval: int = 40
    enable_metrics: bool = False
    skip_server_warmup: bool = False
    watchdog_timeout: float = 300
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    speculative_accept_threshold_single: float = 1.0
    speculative_accept_threshold_acc: float = 1.0
    speculative_token_map: str | None = None
    enable_return_hidden_states: bool = False

    def __post_init__(self) -> None:
        if self.tokenizer_path is None:
            self.tokenizer_path = self.model_path
        if self.served_model_name is None:
            self.served_model_name = self.model_path
        if self.mem_fraction_static is None:
            self.mem_fraction_static = 0.88
        if self.speculative_algorithm == "NEXTN":
            self.speculative_algorithm = "EAGLE"
        if self.speculative_algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
            self._handle_speculative_decoding()

    def _handle_speculative_decoding(self) -> None:
        # ServerArgs._handle_speculative_decoding, 0.5.10 (sglang-eagle3.md §4.2)
        if self.max_running_requests is None:
            self.max_running_requests = 48
            logger.warning("Max running requests is reset to 48 for speculative decoding. You can "
                           "override this by explicitly setting --max-running-requests.")
        self.disable_overlap_schedule = True
        logger.warning("Overlap scheduler is disabled because of using eagle speculative decoding.")
        self.enable_mixed_chunk = False
        if self.speculative_num_steps is None:
            assert self.speculative_eagle_topk is None and self.speculative_num_draft_tokens is None
            (self.speculative_num_steps, self.speculative_eagle_topk,
             self.speculative_num_draft_tokens) = auto_choose_speculative_params(self)
        if self.speculative_eagle_topk > 1 and self.page_size > 1 and self.attention_backend not in (
                "flashinfer", "fa3"):
            raise ValueError("speculative_eagle_topk > 1 with page_size > 1 is unstable and produces "
                             "incorrect results for paged attention backends. This combination is "
                             "only supported for the 'flashinfer' backend.")
        if (self.speculative_eagle_topk == 1
                and self.speculative_num_draft_tokens != self.speculative_num_steps + 1):
            logger.warning("speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
                           "when speculative_eagle_topk == 1")
            self.speculative_num_draft_tokens = self.speculative_num_steps + 1


def target_config(path: str) -> dict[str, Any]:
    config = os.path.join(path, "config.json")
    try:
        with open(config) as fh:
            return json.load(fh)
    except (OSError, ValueError) as exc:
        raise OSError(f"Can't load the configuration of '{path}'. If you were trying to load it from "
                      "'https://huggingface.co/models', make sure you don't have a local directory with "
                      f"the same name. Otherwise, make sure '{path}' is the correct path to a directory "
                      f"containing a config.json file ({exc})") from None


def auto_choose_speculative_params(args: ServerArgs) -> tuple[int, int, int]:
    arch = (target_config(args.model_path).get("architectures") or [""])[0]
    if args.speculative_algorithm == "STANDALONE":
        return (3, 1, 4)
    if arch in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM"):
        return (5, 4, 8)
    return (3, 1, 4)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch_server.py")
    add = parser.add_argument
    add("--model-path", "--model", dest="model_path", type=str, required=True)
    add("--tokenizer-path", type=str)
    add("--host", type=str, default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--dtype", type=str, default="auto", choices=("auto", "half", "float16", "bfloat16", "float",
                                                       "float32"))
    add("--trust-remote-code", action="store_true")
    add("--context-length", type=int)
    add("--tensor-parallel-size", "--tp-size", dest="tp_size", type=int, default=1)
    add("--data-parallel-size", "--dp-size", dest="dp_size", type=int, default=1)
    add("--mem-fraction-static", type=float)
    add("--max-running-requests", type=int)
    add("--max-total-tokens", type=int)
    add("--chunked-prefill-size", type=int)
    add("--page-size", type=int, default=1)
    add("--attention-backend", type=str)
    add("--disable-cuda-graph", action="store_true")
    add("--cuda-graph-max-bs", type=int)
    add("--disable-overlap-schedule", action="store_true")
    add("--enable-mixed-chunk", action="store_true")
    add("--enable-torch-compile", action="store_true")
    add("--random-seed", type=int)
    add("--served-model-name", type=str)
    add("--log-level", type=str, default="info")
    add("--decode-log-interval", type=int, default=40)
    add("--enable-metrics", action="store_true")
    add("--skip-server-warmup", action="store_true")
    add("--watchdog-timeout", type=float, default=300)
    add("--speculative-algorithm", type=str, choices=ALGORITHMS)
    add("--speculative-draft-model-path", "--speculative-draft-model", dest="speculative_draft_model_path",
        type=str)
    add("--speculative-num-steps", type=int)
    add("--speculative-eagle-topk", type=int)
    add("--speculative-num-draft-tokens", type=int)
    add("--speculative-accept-threshold-single", type=float, default=1.0)
    add("--speculative-accept-threshold-acc", type=float, default=1.0)
    add("--speculative-token-map", type=str)
    add("--enable-return-hidden-states", action="store_true")
    return parser


class Engine:
    """Fake decoding with the real counters: accept length is cumulative and only updated at
    decode-log time (every ``decode_log_interval`` forward steps), as in SGLang's scheduler."""

    def __init__(self, args: ServerArgs, vocab: int):
        self.args, self.vocab = args, vocab
        self.lock = threading.Lock()
        self.spec = args.speculative_algorithm is not None
        self.forward_ct = 0
        self.interval = {"forward": 0, "accepted": 0, "tokens": 0, "start": time.monotonic()}
        self.spec_accepted, self.spec_forward = 0, 0
        self.internal: dict[str, Any] = {"last_gen_throughput": 0.0}
        self.total_tokens = 0

    def tokens(self, prompt: str, n: int) -> list[int]:
        seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big")
        out = []
        for _ in range(n):
            seed = (seed * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            out.append(seed % self.vocab)
        return out

    def generate(self, prompt: str, max_new: int) -> tuple[list[int], int]:
        """Generate ``max_new`` tokens; returns (ids, verify steps)."""
        ids = self.tokens(prompt, max_new)
        steps, produced = 0, 0
        while produced < max_new:
            if self.spec:
                most = (self.args.speculative_num_steps or 1) + 1
                accepted = min(1 + ids[produced] % most, max_new - produced)
            else:
                accepted = 1
            produced += accepted
            steps += 1
            self._round_delay()
            self._forward(accepted)
        return ids, steps

    def _round_delay(self) -> None:
        fixed, per_token = ROUND_MS
        verified = (self.args.speculative_num_draft_tokens or 1) - 1 if self.spec else 0
        if fixed or per_token:
            time.sleep((fixed + per_token * verified) / 1000.0)

    def _forward(self, accepted: int) -> None:
        with self.lock:
            self.forward_ct += 1
            self.total_tokens += accepted
            iv = self.interval
            iv["forward"] += 1
            iv["accepted"] += accepted
            iv["tokens"] += accepted
            if iv["forward"] % self.args.decode_log_interval == 0:
                self._log_decode()

    def _log_decode(self) -> None:
        # scheduler_metrics_mixin.log_decode_stats, 0.5.6+ (sglang-eagle3.md §4.4)
        iv = self.interval
        elapsed = max(time.monotonic() - iv["start"], 1e-6)
        throughput = iv["tokens"] / elapsed
        msg = f"Decode batch, #running-req: 1, #token: {self.total_tokens}, token usage: 0.00, "
        if self.spec:
            self.spec_accepted += iv["accepted"]
            self.spec_forward += iv["forward"]
            accept_len = iv["accepted"] / iv["forward"]
            accept_rate = iv["accepted"] / (iv["forward"] * (self.args.speculative_num_draft_tokens or 1))
            msg += f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
            self.internal["avg_spec_accept_length"] = self.spec_accepted / self.spec_forward
        msg += (f"cuda graph: {not self.args.disable_cuda_graph}, gen throughput (token/s): "
                f"{throughput:.2f}, #queue-req: 0, ")
        self.internal["last_gen_throughput"] = throughput
        scheduler_log(msg)
        self.interval = {"forward": 0, "accepted": 0, "tokens": 0, "start": time.monotonic()}

    def flush(self) -> None:
        with self.lock:
            self.spec_accepted = self.spec_forward = 0
            self.internal.pop("avg_spec_accept_length", None)


def scheduler_log(message: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write(f"[{stamp} TP0] {message}\n")
    sys.stderr.flush()


class Handler(BaseHTTPRequestHandler):
    """The routes of the real server that the tests use; bound to one server by make_handler."""

    args: ServerArgs
    engine: Engine
    state: dict[str, Any]
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *a: Any) -> None:
        request, code = (a[0] if a else fmt), (a[1] if len(a) > 1 else "")
        sys.stderr.write(f'INFO:     {self.client_address[0]} - "{request}" {code}\n')

    def _send(self, code: int, body: Any = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            return json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return {}

    def _health(self, body: dict[str, Any]) -> None:
        if not self.state["ready"]:
            self._send(503)
            return
        self.engine.generate("health", 1)
        self._send(200)

    def _server_info(self, body: dict[str, Any]) -> None:
        info = {**dataclasses.asdict(self.args), "max_total_num_tokens": 65536,
                "max_req_input_len": (self.args.context_length or 4096) - 1,
                "internal_states": [dict(self.engine.internal)], "version": __version__}
        if SERVER_INFO_FAULT == "hang":
            time.sleep(3600)
        if SERVER_INFO_FAULT == "garbage":
            data = b"<html>\x1b[31mupstream error</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        self._send(200, {**info, **WRONG_TYPES} if SERVER_INFO_FAULT == "wrong-types" else info)

    def _model_info(self, body: dict[str, Any]) -> None:
        self._send(200, {"model_path": self.args.model_path, "tokenizer_path": self.args.tokenizer_path,
                         "is_generation": True})

    def _models(self, body: dict[str, Any]) -> None:
        self._send(200, {"object": "list", "data": [{"id": self.args.served_model_name,
                                                      "object": "model", "owned_by": "sglang"}]})

    def _generate(self, body: dict[str, Any]) -> None:
        self.state["generated"] = self.state.get("generated", 0) + 1
        if DIE_AFTER and self.state["generated"] >= DIE_AFTER:
            scheduler_log("Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory access "
                          "was encountered")
            os._exit(1)
        params = body.get("sampling_params") or {}
        if body.get("return_hidden_states"):
            self._hidden_states(body, params)
            return
        prompt = body.get("text") if "text" in body else json.dumps(body.get("input_ids"))
        max_new = int(params.get("max_new_tokens", 128))
        ids, steps = self.engine.generate(str(prompt), max_new)
        meta = {"prompt_tokens": len(str(prompt).split()), "completion_tokens": len(ids),
                "spec_verify_ct": steps if self.engine.spec else 0,
                "finish_reason": {"type": "length", "length": max_new}}
        self._send(200, {"text": "".join(f" t{i}" for i in ids), "output_ids": ids, "meta_info": meta})

    def _hidden_states(self, body: dict[str, Any], params: dict[str, Any]) -> None:
        """As SGLang answers ``return_hidden_states``: meta_info.hidden_states, one entry per generated
        token, the first the prompt's [T][H]; the states the LM head reads (after the final norm),
        computed with draftops' reference forward of a tiny Llama target (the demo's)."""
        if not self.args.enable_return_hidden_states:
            self._send(400, {"error": {"message": "return_hidden_states=True requires the server to be started "
                                                  "with --enable-return-hidden-states"}})
            return
        import torch

        from remote.drafter.model import layers, tinyllama
        cfg, weights = tinyllama.load(self.args.model_path)
        ids = torch.tensor(body["input_ids"], dtype=torch.long)
        states, logits = tinyllama.forward(cfg, weights, ids[None])
        final = layers.rms_norm(states[0, :, -1], weights["model.norm.weight"], cfg.rms_norm_eps)
        max_new = int(params.get("max_new_tokens", 1))
        hidden = [final.tolist()] + [final[-1].tolist()] * (max_new - 1)
        out = [int(logits[0, -1].argmax())] * max_new
        self._send(200, {"text": "", "output_ids": out, "meta_info": {
            "prompt_tokens": len(ids), "completion_tokens": max_new, "hidden_states": hidden,
            "finish_reason": {"type": "length", "length": max_new}}})

    def _completions(self, body: dict[str, Any]) -> None:
        prompt = str(body.get("prompt", ""))
        ids, _ = self.engine.generate(prompt, int(body.get("max_tokens", 16)))
        self._send(200, {"id": "cmpl-double", "object": "text_completion", "created": int(time.time()),
                         "model": self.args.served_model_name,
                         "choices": [{"index": 0, "text": "".join(f" t{i}" for i in ids),
                                      "logprobs": None, "finish_reason": "length"}],
                         "usage": {"prompt_tokens": len(prompt.split()), "completion_tokens": len(ids),
                                   "total_tokens": len(prompt.split()) + len(ids)}})

    def _flush(self, body: dict[str, Any]) -> None:
        self.engine.flush()
        self._send(200)

    GET = {"/health": _health, "/health_generate": _health, "/get_server_info": _server_info,
           "/server_info": _server_info, "/get_model_info": _model_info, "/model_info": _model_info,
           "/v1/models": _models}
    POST = {"/generate": _generate, "/v1/completions": _completions, "/flush_cache": _flush}

    def do_GET(self) -> None:
        route = self.GET.get(self.path.split("?")[0])
        if route is None:
            self._send(404, {"detail": "Not Found"})
        else:
            route(self, {})

    def do_POST(self) -> None:
        path = self.path.split("?")[0]
        body = self._body()
        route = self.POST.get(path)
        if route is None:
            self._send(404, {"detail": "Not Found"})
        elif not self.state["ready"] and path in ("/generate", "/v1/completions"):
            self._send(503, {"error": "server is starting"})
        else:
            route(self, body)


def make_handler(args: ServerArgs, engine: Engine, state: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    return type("BoundHandler", (Handler,), {"args": args, "engine": engine, "state": state})


def start_children(crash: bool) -> list[subprocess.Popen[bytes]]:
    """The scheduler and detokenizer processes (placeholders in the same process group)."""
    watcher = "import os, time\nppid = os.getppid()\nwhile os.getppid() == ppid: time.sleep(0.2)\n"
    detokenizer = "import time\ntime.sleep(3600)\n"   # like a real leaked child: ignores its parent
    return [subprocess.Popen([sys.executable, "-c", watcher, "sglang::scheduler_TP0"]),
            subprocess.Popen([sys.executable, "-c", detokenizer if crash else watcher,
                              "sglang::detokenizer"])]


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(format="[%(asctime)s] %(message)s", datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO)
    parsed = build_parser().parse_args(argv)
    args = ServerArgs(**vars(parsed))
    logging.getLogger("sglang.srt.entrypoints.engine").info(f"server_args={args!r}")
    config = target_config(args.model_path)
    if args.speculative_algorithm in ("EAGLE", "EAGLE3") and not args.speculative_draft_model_path:
        raise ValueError("speculative_draft_model_path is required for EAGLE speculative decoding")
    archs = config.get("architectures") or []
    unsupported = not any(a in SUPPORTED for a in archs)
    children = start_children(crash=unsupported)
    if unsupported:
        scheduler_log("Scheduler hit an exception: Traceback (most recent call last):\n"
                      '  File "sglang/srt/managers/scheduler.py", line 2716, in run_scheduler_process\n'
                      f"ValueError: Model architectures {archs} are not supported for now. Supported "
                      f"architectures: dict_keys({list(SUPPORTED)})")
        logging.getLogger("sglang").error("Rank 0 scheduler is dead. Please check if there are relevant logs.")
        return 1
    topk, draft_tokens, steps = (args.speculative_eagle_topk, args.speculative_num_draft_tokens,
                                 args.speculative_num_steps)
    scheduler_log("Load weight begin. avail mem=79.10 GB")
    time.sleep(LOAD_S)
    scheduler_log("Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem=62.31 GB")
    if topk and topk > 1 and draft_tokens and steps and draft_tokens - 1 > topk + (steps - 1) * topk ** 2:
        raise RuntimeError("selected index k out of range")   # torch.topk in organize_draft_results
    scheduler_log("Capture cuda graph begin. This can take up to several minutes.")
    engine = Engine(args, int(config.get("vocab_size") or 32000))
    state = {"ready": False}
    try:
        server = ThreadingHTTPServer((args.host, args.port), make_handler(args, engine, state))
    except OSError as exc:
        sys.stderr.write(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                         f"('{args.host}', {args.port}): {exc.strerror.lower() if exc.strerror else exc}\n")
        return 1

    def stop(signum: int, _frame: Any) -> None:
        def shut_down() -> None:
            time.sleep(EXIT_S)          # a real server's shutdown takes a while
            for child in children:
                child.terminate()
            server.shutdown()
        threading.Thread(target=shut_down, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sys.stderr.write(f"INFO:     Started server process [{os.getpid()}]\nINFO:     Waiting for application "
                     f"startup.\nINFO:     Application startup complete.\nINFO:     Uvicorn running on "
                     f"http://{args.host}:{args.port} (Press CTRL+C to quit)\n")

    def warm_up() -> None:
        time.sleep(WARMUP_S)
        state["ready"] = True
        logging.getLogger("sglang").info("The server is fired up and ready to roll!")

    threading.Thread(target=warm_up, daemon=True).start()
    server.serve_forever()
    server.server_close()
    for child in children:
        child.wait()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001 - the real server dies with a traceback on start-up errors
        traceback.print_exc()
        sys.exit(1)
